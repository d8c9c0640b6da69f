"""Independent oracles shared by several test modules (written from the paper's formulas, not
from the library's stage Functions)."""
from __future__ import annotations

import numpy as np


def weighted_residuals(model, data, X, p) -> list:
    """Every weighted residual row of -J, trajectory by trajectory, in time order: observation
    ``mask * (y_t - g(x_t)) / sigma_v``, dynamics ``(x_{t+1} - f(x_t)) / sigma_w`` and the first
    state's prior ``(x_1 - mu_1) / s_1`` (no inputs).

    Parameters
    ----------
    model : StateSpaceModel
    data : Trajectories
        NaN = missing (entry-wise).
    X : list of casadi.SX
        (nx, T_b) symbolic states of each trajectory.
    p : casadi.SX
        (n_p,) parameters (symbolic, or partly fixed).
    """
    iv, iw = 1 / model.noise.measurement_std, 1 / model.noise.process_std
    res = []
    for Xb, y in zip(X, data.y):
        for t in range(y.shape[0]):
            m = np.isfinite(y[t])
            res.append(m * iv * (np.where(m, y[t], 0) - model.g(Xb[:, t], [], p)))
            if t + 1 < y.shape[0]:
                res.append(iw * (Xb[:, t + 1] - model.f(Xb[:, t], [], p)))
        res.append((Xb[:, 0] - model.noise.x1_mean) / model.noise.x1_std)
    return res
