"""An identified model as a discrete-time do-mpc model, theta baked, time-varying or uncertain
(``pip install "ceem_casadi[control]"``; docs/control.md, "do-mpc")."""
from __future__ import annotations

import warnings

import casadi as ca

from ..model._simulation import as_theta_vector
from ..runtime._schema import require

__all__ = ["to_do_mpc"]

KINDS = {"baked": None, "tvp": "_tvp", "uncertain": "_p"}


def import_do_mpc():
    """The ``do_mpc`` module, or an ImportError that names the extra to install."""
    try:
        with warnings.catch_warnings():  # do-mpc warns about its own optional features (PyTorch, ONNX)
            warnings.simplefilter("ignore", UserWarning)
            import do_mpc
    except ImportError:
        raise ImportError('to_do_mpc needs do-mpc, which is not installed: pip install "ceem_casadi[control]" '
                          '(or pip install do-mpc)') from None
    return do_mpc


def to_do_mpc(model, theta, *, parameters: str = "baked", setup: bool = True):
    """The identified ``model`` at ``theta`` as a discrete-time ``do_mpc.model.Model`` (docs/control.md, "do-mpc").

    Parameters
    ----------
    model : StateSpaceModel
    theta : dict or numpy.ndarray
        Its parameters (name -> array, or the flat vector; only their size unless ``"baked"``).
    parameters : {"baked", "tvp", "uncertain"}
        Parameters as constants, as a time-varying parameter ``theta``, or as an uncertain parameter ``theta``.
    setup : bool
        Call ``Model.setup()``; ``False`` returns the model open, to add variables (e.g. a reference) first.

    Returns
    -------
    do_mpc.model.Model
        Variables ``_x["x"]``, ``_u["u"]``, the expression and measurement ``y``, and ``theta`` unless baked.

    Raises
    ------
    ImportError
        When do-mpc is not installed (the message names the ``[control]`` extra).

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> from ceem_casadi.deploy import to_do_mpc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: 2 * x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)))
    >>> m = to_do_mpc(model, {"a": 0.8})
    >>> m.n_x, m.n_u
    (1, 1)
    >>> import do_mpc
    >>> sim = do_mpc.simulator.Simulator(m)
    >>> sim.set_param(t_step=1.0)
    >>> sim.setup()
    >>> sim.x0 = np.ones(1)
    >>> float(sim.make_step(np.ones((1, 1)))[0, 0])        # the measurement y = 2 x+ = 2 (0.8 + 1)
    3.6
    """
    require(parameters in KINDS, f"parameters: expected one of {sorted(KINDS)}, got {parameters!r}")
    theta_vec = as_theta_vector(model, theta)
    do_mpc = import_do_mpc()
    m = do_mpc.model.Model("discrete", "SX")
    x = m.set_variable("_x", "x", shape=(model.nx, 1))
    u = m.set_variable("_u", "u", shape=(model.nu, 1)) if model.nu else ca.SX.zeros(0, 1)
    p = ca.DM(theta_vec) if KINDS[parameters] is None else \
        m.set_variable(KINDS[parameters], "theta", shape=(model.params.size, 1))
    m.set_rhs("x", model.f(x, u, p))
    y = model.g(x, u, p)
    m.set_expression("y", y)
    m.set_meas("y", y, meas_noise=False)
    if setup:
        m.setup()
    return m
