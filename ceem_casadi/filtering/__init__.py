"""Gaussian filtering on the model and data objects of CE-EM.

    EKF, ekf                        extended Kalman filter (the evaluation filter; initial states)
    kalman_filter                   linear-Gaussian Kalman filter (the oracle the EKF is tested against)
    rts_smoother                    Rauch-Tung-Striebel backward pass for either filter
    FilterResult                    the per-step result of both filters
    as_cov                          a covariance from a scalar, a diagonal or a matrix

Used by the initial states of a fit (`ceem_casadi.smoothing._initial_states`), the metrics, the model
files, the noise criteria and the C code generator.
"""
from ._ekf import EKF, ekf
from ._kalman import kalman_filter, rts_smoother
from ._result import FilterResult, as_cov

__all__ = ["EKF", "FilterResult", "as_cov", "ekf", "kalman_filter", "rts_smoother"]
