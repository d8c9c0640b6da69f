"""Baselines that CE-EM is compared with, on the same model and data objects.

    n4sid, N4SIDResult                             subspace identification (linear baseline)
    particle_filter, ffbsi, particle_em, ...       fully adapted PF, FFBSi smoother, particle EM (SAEM)
    LSTM, sequence_loss_factory, windows           a stacked LSTM (sequence baseline of the helicopter)

The EKF and the Kalman filter live in `ceem_casadi.filtering`.
"""
from ._lstm import LSTM, sequence_loss_factory, windows
from ._n4sid import N4SIDResult, n4sid
from ._particle import ParticleFilterResult, ffbsi, particle_filter
from ._saem import ParticleEMOptions, ParticleEMRecord, ParticleEMResult, particle_em

__all__ = [
    "LSTM", "N4SIDResult", "ParticleEMOptions", "ParticleEMRecord", "ParticleEMResult", "ParticleFilterResult", "ffbsi", "n4sid",
    "particle_em", "particle_filter", "sequence_loss_factory", "windows",
]
