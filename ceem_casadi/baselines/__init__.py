"""Baselines that CE-EM is compared with, on the same model and data objects: N4SID (linear), the particle
filter, FFBSi and particle EM (SAEM), a stacked LSTM. The EKF and the Kalman filter are in `ceem_casadi.filtering`."""
from ._lstm import LSTM, sequence_loss_factory, windows
from ._n4sid import N4SIDResult, n4sid
from ._particle import ParticleFilterResult, ffbsi, particle_filter
from ._saem import ParticleEMOptions, ParticleEMRecord, ParticleEMResult, particle_em

__all__ = [
    "LSTM", "N4SIDResult", "ParticleEMOptions", "ParticleEMRecord", "ParticleEMResult", "ParticleFilterResult", "ffbsi", "n4sid",
    "particle_em", "particle_filter", "sequence_loss_factory", "windows",
]
