"""Export an identified model as serialised CasADi Functions (``F``, ``G``, their Jacobians, ``rhs``), parameters
baked in or kept as the last input (layout and trust model: docs/model_learning_notes.md)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import casadi as ca
import numpy as np

from ..errors import ModelError, OptionsError
from ..runtime._atomic import atomic_path, atomic_write_text
from ..runtime._result import Result
from ._simulation import as_theta_vector

__all__ = ["ExportResult", "export_casadi"]


@dataclass(frozen=True, repr=False)
class ExportResult(Result):
    """What [`export_casadi`][ceem_casadi.export_casadi] wrote.

    Attributes
    ----------
    folder : pathlib.Path
        The export folder.
    files : dict
        Function name -> path of its ``.casadi`` file, plus ``"manifest"``.
    inputs, outputs : dict
        Function name -> list of ``(name, shape)`` of its inputs, outputs.
    keep_parameters : bool
        Whether the Functions take the parameter vector ``p`` as their last input.
    dt : float or None
        Sample time of ``F`` in seconds.
    parameter_names : list of str
        The model's parameter names, in the order of the flat vector ``p``.

    Examples
    --------
    >>> import tempfile, ceem_casadi as cc
    >>> from ceem_casadi import export_casadi
    >>> m = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                      params=cc.Parameters(cc.Param("a", 0.5)))
    >>> res = export_casadi(m, {"a": 0.5}, tempfile.mkdtemp(), keep_parameters=True)
    >>> res.inputs["F"]
    [('x', (1, 1)), ('u', (1, 1)), ('p', (1, 1))]
    >>> sorted(res.to_dict()["files"])
    ['F', 'F_jac', 'G', 'G_jac', 'manifest']
    """

    folder: Path
    files: dict
    inputs: dict
    outputs: dict
    keep_parameters: bool
    dt: float | None = None
    parameter_names: list = field(default_factory=list)

    def __repr__(self) -> str:
        return (f"ExportResult({str(self.folder)!r}, functions={[k for k in self.files if k != 'manifest']}, "
                f"keep_parameters={self.keep_parameters})")

    def table(self) -> str:
        """One line per Function: ``name  (inputs) -> (outputs)  file``."""
        rows = []
        for name in self.inputs:
            ins = ", ".join(f"{n}{s}" for n, s in self.inputs[name])
            outs = ", ".join(f"{n}{s}" for n, s in self.outputs[name])
            rows.append(f"{name:<8} ({ins}) -> ({outs})  {Path(self.files[name]).name}")
        return "\n".join(rows)


def _shapes(fun: ca.Function, out: bool) -> list:
    n = fun.n_out() if out else fun.n_in()
    name = fun.name_out if out else fun.name_in
    size = fun.size_out if out else fun.size_in
    return [(name(i), tuple(int(s) for s in size(i))) for i in range(n)]


def export_casadi(model, theta, path, *, keep_parameters: bool = False) -> ExportResult:
    """Write the identified model's step, output (and right-hand side) as serialised CasADi Functions.

    Parameters
    ----------
    model : StateSpaceModel
        The identified model.
    theta : dict
        Parameter values, name -> array (all names), e.g. a fit's ``theta``.
    path : str or pathlib.Path
        Folder to write (created if missing; files of the same names are overwritten).
    keep_parameters : bool
        ``False`` (default): the parameters are baked in, ``F(x, u)``; ``True``: ``F(x, u, p)`` with
        the flat vector ``p`` (np,) last (the identified values in ``manifest.json``).

    Returns
    -------
    ExportResult
        Paths, Function names and shapes: ``F(x, u) -> x_next``, ``G -> y``, ``F_jac -> (dF/dx,
        dF/du)``, ``G_jac``, ``rhs``/``rhs_jac`` (continuous time) and ``manifest.json`` (dimensions,
        dt in seconds, parameter names and values, noise standard deviations).

    Raises
    ------
    ParameterError, ShapeError
        ``theta`` does not match the model's parameters.
    ModelError
        The model's Functions give non-finite values at the origin with these parameters.

    Examples
    --------
    >>> import tempfile, casadi as ca, numpy as np, ceem_casadi as cc
    >>> from ceem_casadi import export_casadi
    >>> m = cc.StateSpaceModel.from_ode(lambda x, u, p: -p.k * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                 dt=0.1, params=cc.Parameters(cc.Param("k", 1.0)))
    >>> out = export_casadi(m, {"k": 2.0}, tempfile.mkdtemp())
    >>> F = ca.Function.load(str(out.files["F"]))
    >>> bool(abs(float(F(1.0, 0.0)) - float(m.f(1.0, 0.0, 2.0))) < 1e-14)
    True
    """
    if not isinstance(keep_parameters, bool):
        raise OptionsError(f"keep_parameters: expected True or False, got {keep_parameters!r}")
    theta_vec = as_theta_vector(model, theta)
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    x = ca.SX.sym("x", model.nx)
    u = ca.SX.sym("u", model.nu)
    p = ca.SX.sym("p", model.params.size)
    pval = p if keep_parameters else ca.DM(theta_vec)
    ins, names_in = ([x, u, p], ["x", "u", "p"]) if keep_parameters else ([x, u], ["x", "u"])
    sources = [("F", model.f, "x_next"), ("G", model.g, "y")]
    if model.rhs is not None:
        sources.append(("rhs", model.rhs, "xdot"))
    funs = {}
    for name, fun, out in sources:
        expr = fun(x, u, pval)
        funs[name] = ca.Function(name, ins, [expr], names_in, [out])
        funs[name + "_jac"] = ca.Function(name + "_jac", ins, [ca.jacobian(expr, x), ca.jacobian(expr, u)],
                                          names_in, [f"d{out}_dx", f"d{out}_du"])
    probe = [np.zeros(model.nx), np.zeros(model.nu)] + ([theta_vec] if keep_parameters else [])
    for name in ("F", "G"):
        val = np.asarray(funs[name](*probe), float)
        if not np.all(np.isfinite(val)):
            raise ModelError(f"export_casadi: {name}(x=0, u=0) is not finite with these parameters ({val.ravel()}); "
                             "check theta")
    files = {}
    for name, fun in funs.items():
        files[name] = folder / f"{name}.casadi"
        with atomic_path(files[name]) as tmp:  # never through a symlink planted in the folder
            fun.save(str(tmp))
    inputs, outputs = ({k: _shapes(f, out) for k, f in funs.items()} for out in (False, True))
    manifest = {
        "format": "ceem_casadi export 1", "model": model.name, "nx": model.nx, "nu": model.nu, "ny": model.ny,
        "dt": model.dt, "keep_parameters": bool(keep_parameters),
        "functions": {k: {"inputs": inputs[k], "outputs": outputs[k], "file": files[k].name} for k in funs},
        "parameters": {n: {"slice": [model.params.slice(n).start, model.params.slice(n).stop],
                           "shape": list(model.params[n].shape)} for n in model.params.names},
        "p": theta_vec.tolist(),
        "process_std": model.noise.process_std.tolist(), "measurement_std": model.noise.measurement_std.tolist()}
    files["manifest"] = folder / "manifest.json"
    atomic_write_text(files["manifest"], json.dumps(manifest, indent=2))
    return ExportResult(folder, files, inputs, outputs, keep_parameters, model.dt, list(model.params.names))
