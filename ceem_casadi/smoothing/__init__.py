"""The smoothing step (E-step): the maximum-a-posteriori state trajectories for fixed theta, by
IPOPT or by banded Newton steps, evaluated whole or in time chunks; EKF/RTS initial states."""
from ._columns import ObservationColumns
from ._options import SmootherOptions
from ._smoother import Smoother, SmoothResult

__all__ = ["ObservationColumns", "SmoothResult", "Smoother", "SmootherOptions"]
