"""Estimators and baselines that work on the same model and data objects as CE-EM.

    EKF, ekf, rts, EKFResult                       extended Kalman filter / RTS smoother (evaluation filter)
    kalman_filter, rts_smoother, KalmanResult      linear-Gaussian oracle
    n4sid, N4SIDResult                             subspace identification (linear baseline)
    particle_filter, ffbsi, particle_em, ...       fully adapted PF, FFBSi smoother, particle EM (SAEM)
"""
from .ekf import EKF, EKFResult, ekf, rts
from .kalman import KalmanResult, kalman_filter, rts_smoother
from .n4sid import N4SIDResult, n4sid
from .particle import ParticleEMOptions, ParticleEMResult, ParticleFilterResult, ffbsi, particle_em, particle_filter

__all__ = [
    "EKF", "EKFResult", "KalmanResult", "N4SIDResult", "ParticleEMOptions", "ParticleEMResult",
    "ParticleFilterResult", "ekf", "ffbsi", "kalman_filter", "n4sid", "particle_em", "particle_filter",
    "rts", "rts_smoother",
]
