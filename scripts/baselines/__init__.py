"""The comparison baselines that CE-EM is measured against and the library never uses (docs/baselines.md):
the particle filter, FFBSi and particle EM (SAEM) of the paper's section 4.1.2, and the stacked LSTM of its
helicopter experiment. They left ``ceem_casadi.baselines`` because the measured tables show them dominated
by CE-EM (docs/results_lorenz.md, docs/results_heli.md); N4SID stays in the library (the BLA initialiser uses it).
"""
from ._lstm import LSTM, sequence_loss_factory, windows
from ._particle import ParticleFilterResult, ffbsi, particle_filter
from ._saem import ParticleEMOptions, ParticleEMRecord, ParticleEMResult, particle_em

__all__ = ["LSTM", "ParticleEMOptions", "ParticleEMRecord", "ParticleEMResult", "ParticleFilterResult", "ffbsi",
           "particle_em", "particle_filter", "sequence_loss_factory", "windows"]
