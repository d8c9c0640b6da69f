"""Baselines that CE-EM is compared with, on the same model and data objects.

    n4sid, N4SIDResult                             subspace identification (linear baseline)
    particle_filter, ffbsi, particle_em, ...       fully adapted PF, FFBSi smoother, particle EM (SAEM)
    LSTM, sequence_loss_factory, windows           a stacked LSTM (sequence baseline of the helicopter)

The EKF and the Kalman filter live in :mod:`ceem_casadi.filtering`; ``EKF``, ``ekf``,
``kalman_filter``, ``rts_smoother`` are re-exported here for code written against earlier
versions (``ceem_casadi.baselines.EKF``).
"""
from ..filtering import EKF, ekf, kalman_filter, rts_smoother
from .lstm import LSTM, sequence_loss_factory, windows
from .n4sid import N4SIDResult, n4sid
from .particle import ParticleFilterResult, ffbsi, particle_filter
from .saem import ParticleEMOptions, ParticleEMResult, particle_em

__all__ = [
    "LSTM", "N4SIDResult", "ParticleEMOptions", "ParticleEMResult", "ParticleFilterResult", "ffbsi", "n4sid",
    "particle_em", "particle_filter", "sequence_loss_factory", "windows",
]
__all__ += ["EKF", "ekf", "kalman_filter", "rts_smoother"]  # compatibility re-exports (ceem_casadi.filtering)
