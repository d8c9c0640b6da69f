"""Gaussian filtering: the extended Kalman filter (``EKF``, ``ekf``), the linear ``kalman_filter`` it is tested
against, the ``rts_smoother`` of both, their ``FilterResult`` and ``as_cov``."""
from ._ekf import EKF, ekf
from ._kalman import kalman_filter, rts_smoother
from ._result import FilterResult, as_cov

__all__ = ["EKF", "FilterResult", "as_cov", "ekf", "kalman_filter", "rts_smoother"]
