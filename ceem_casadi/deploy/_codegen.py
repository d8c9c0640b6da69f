"""C99 code of the EKF predictor of an identified model: the model functions and Jacobians from CasADi's code
generator, the EKF algebra from the templates in ``deploy/c/`` (docs/usage_cli.md, "C code of the predictor")."""
from __future__ import annotations

import logging
import os
import re
import subprocess
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import casadi as ca
import numpy as np

from ..errors import ShapeError
from ..filtering import as_cov
from ..filtering._result import ekf_settings
from ..model._simulation import as_theta_vector
from ..runtime._atomic import atomic_path, atomic_write_text
from ..runtime._compile import compiler
from ..runtime._result import Result

log = logging.getLogger(__name__)

CFLAGS = ("-std=c99", "-O2", "-Wall", "-Wextra", "-Werror")


@dataclass(frozen=True, repr=False)
class GeneratedEKF(Result):
    """Paths of the generated files and the sizes of the predictor.

    Attributes
    ----------
    name : str
        Base name of the files and of the C symbols.
    source, header, example : pathlib.Path
        ``<name>.c``, ``<name>.h`` and the example program ``<name>_main.c`` (or None).
    nx, nu, ny : int
    theta_as_argument : bool
        Whether the parameters are an argument of the C functions instead of constants.

    Examples
    --------
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> import tempfile
    >>> gen = cc.generate_ekf(model, {"a": 0.8}, tempfile.mkdtemp(), name="scalar")
    >>> gen.source.name, gen.header.name, (gen.nx, gen.nu, gen.ny)
    ('scalar.c', 'scalar.h', (1, 1, 1))
    """

    SUMMARY = ('name', 'nx', 'nu', 'ny', 'theta_as_argument')

    name: str
    source: Path
    header: Path
    example: Path | None
    nx: int
    nu: int
    ny: int
    theta_as_argument: bool


def _template(name: str) -> str:
    return resources.files("ceem_casadi.deploy").joinpath("c").joinpath(name).read_text()


def _numbers(a) -> str:
    a = np.asarray(a, float).ravel()
    if a.size == 0:
        return "0.0"
    if not np.all(np.isfinite(a)):
        raise ShapeError("code generation needs finite theta, x0, P0, Q and R")
    return ", ".join(repr(float(v)) for v in a)


def casadi_name(name: str) -> str:
    """Prefix of the CasADi-generated model functions for the C identifier ``name``: ``name`` when CasADi accepts
    ``<name>_fjac``, else ``ceem_`` and the hex digits of ``name`` (``ekf_`` -> ``ceem_656b665f``; never shared)."""
    return name if ca.Function.check_name(f"{name}_fjac") else f"ceem_{name.encode().hex()}"


def _model_functions(model, theta_vec: np.ndarray, name: str, theta_as_argument: bool):
    """SX Functions ``<name>_fjac(x, u, p) -> (f, df/dx)`` and ``<name>_gjac -> (g, dg/dx)``, dense; without
    ``theta_as_argument`` the numbers of theta are substituted (CasADi folds them into constants)."""
    x, u = ca.SX.sym("x", model.nx), ca.SX.sym("u", model.nu)
    p = ca.SX.sym("p", model.params.size)
    pe = p if theta_as_argument else ca.DM(theta_vec)
    fx, gx = model.f(x, u, pe), model.g(x, u, pe)
    F = ca.Function(f"{name}_fjac", [x, u, p], [ca.densify(fx), ca.densify(ca.jacobian(fx, x))],
                    ["x", "u", "p"], ["x_next", "A"])
    G = ca.Function(f"{name}_gjac", [x, u, p], [ca.densify(gx), ca.densify(ca.jacobian(gx, x))],
                    ["x", "u", "p"], ["y", "C"])
    return F, G


def _casadi_source(functions, name: str) -> str:
    gen = ca.CodeGenerator(f"{name}_model.c", {"with_header": False, "casadi_real": "double",
                                               "casadi_int": "long long int"})
    for f in functions:
        gen.add(f)
    return gen.dump()


def generate_ekf(model, theta, out_dir, *, name: str = "ekf", x0=None, P0=None, Q=None, R=None,
                 theta_as_argument: bool = False, example: bool = True) -> GeneratedEKF:
    """Write ``<name>.c``, ``<name>.h`` (and ``<name>_main.c``) into ``out_dir``.

    Parameters
    ----------
    model : StateSpaceModel
    theta : dict or numpy.ndarray
        The identified parameters (name -> array, or the flat vector (np,)).
    out_dir : str or pathlib.Path
        Folder (created if needed).
    name : str
        C identifier prefix of every generated symbol and file name.
    x0 : numpy.ndarray, optional
        (nx,) initial state; default ``model.noise.x1_mean`` or zeros.
    P0, Q, R : float or numpy.ndarray, optional
        Covariances (scalars, diagonals or matrices); defaults as in
        [`validation_report`][ceem_casadi.validation_report].
    theta_as_argument : bool
        Keep theta a run-time argument (``<name>_set_theta``) instead of folding it into the code.
    example : bool
        Also write the example program ``<name>_main.c``.

    Returns
    -------
    GeneratedEKF

    Examples
    --------
    Written, not compiled:

    >>> import tempfile
    >>> import numpy as np, ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...     params=cc.Parameters(cc.Param("a", 0.5)), process_std=0.1, measurement_std=0.1)
    >>> gen = cc.generate_ekf(model, {"a": 0.8}, tempfile.mkdtemp(), name="scalar_ekf")
    >>> gen.source.name, gen.header.name, gen.example.name
    ('scalar_ekf.c', 'scalar_ekf.h', 'scalar_ekf_main.c')
    >>> "int scalar_ekf_step(" in gen.header.read_text()
    True
    """
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ValueError(f"name must be a C identifier, got {name!r}")
    from .._version import __version__

    nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
    theta_vec = as_theta_vector(model, theta)  # names, shapes, finiteness, bounds (one validation)
    x0, P0, Q, R = ekf_settings(model, x0, P0, Q, R)
    x0 = np.asarray(x0, float).ravel()
    if x0.shape != (nx,):
        raise ShapeError(f"x0: expected ({nx},), got {x0.shape}")
    P0, Q, R = as_cov("P0", P0, nx), as_cov("Q", Q, nx), as_cov("R", R, ny)

    cname = casadi_name(name)
    F, G = _model_functions(model, theta_vec, cname, theta_as_argument)
    casadi_src = _casadi_source([F, G], cname)
    subs = {
        "p": name, "P": name.upper(), "C": cname, "VERSION": __version__, "CASADI_VERSION": ca.__version__,
        "MODEL": getattr(model, "name", "model"), "NX": str(nx), "NU": str(nu), "NY": str(ny),
        "NP": str(npar), "NU1": str(max(nu, 1)), "NP1": str(max(npar, 1)),
        "THETA_MODE": "a run-time argument" if theta_as_argument else "folded into the code",
        "THETA_ARG": "1" if theta_as_argument else "0",
        "SZ_ARG": str(max(F.sz_arg(), G.sz_arg())), "SZ_RES": str(max(F.sz_res(), G.sz_res())),
        "SZ_IW": str(max(F.sz_iw(), G.sz_iw(), 1)), "SZ_W": str(max(F.sz_w(), G.sz_w(), 1)),
        "THETA": _numbers(theta_vec), "X0": _numbers(x0), "P0": _numbers(P0), "Q": _numbers(Q),
        "R": _numbers(R), "CASADI": casadi_src}

    def fill(text: str) -> str:
        return re.sub(r"@([A-Za-z0-9_]+)@", lambda m: subs[m.group(1)], text)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header, source = out / f"{name}.h", out / f"{name}.c"
    atomic_write_text(header, fill(_template("ekf.h.in")))
    atomic_write_text(source, fill(_template("ekf.c.in")))
    main = None
    if example:
        main = out / f"{name}_main.c"
        atomic_write_text(main, fill(_template("ekf_main.c.in")))
    log.info("generated %s (%d bytes of C)", source, source.stat().st_size)
    return GeneratedEKF(name, source, header, main, nx, nu, ny, theta_as_argument)


def compile_example(gen: GeneratedEKF, output=None, *, cflags=CFLAGS, timeout_s: float = 300.0) -> Path:
    """Compile ``<name>.c`` + ``<name>_main.c`` into an executable (default next to the sources); ``RuntimeError``
    with the compiler's messages when there is none or it fails."""
    cc = compiler()
    if cc is None:
        raise RuntimeError("no C compiler found (set $CC or install gcc)")
    if gen.example is None:
        raise ValueError("generate_ekf(..., example=True) writes the example program needed here")
    exe = Path(output) if output is not None else gen.source.with_name(gen.name)
    cmd = [cc, *cflags, str(gen.source), str(gen.example), "-o", str(exe), "-lm"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)  # the process group, so that cc1 ends too
        proc.communicate()
        raise RuntimeError(f"compiling {gen.source} took longer than {timeout_s} s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{err.decode(errors='replace')[-4000:]}")
    return exe


def _rows(y, u=None) -> np.ndarray:
    """(T, nu + ny) rows ``u_1..u_nu, y_1..y_ny`` of the example program's input."""
    y = np.atleast_2d(np.asarray(y, float))
    return y if u is None or np.size(u) == 0 else np.hstack([np.asarray(u, float).reshape(y.shape[0], -1), y])


def write_csv(path, y, u=None) -> Path:
    """Write the example program's input: rows ``u_1..u_nu, y_1..y_ny`` (NaN as ``nan``)."""
    with atomic_path(path) as tmp:
        np.savetxt(tmp, _rows(y, u), delimiter=",", fmt="%.17g")
    return Path(path)


def run_example(exe, y, u=None, *, ny: int, timeout_s: float = 120.0) -> tuple[np.ndarray, np.ndarray]:
    """``y_pred`` (T, ny) and ``x_filt`` (T, nx) printed by the compiled example program ``exe`` run on ``y`` (T, ny)
    and ``u`` (T, nu)."""
    text = "\n".join(",".join(repr(float(v)) for v in row) for row in _rows(y, u)) + "\n"
    proc = subprocess.run([str(exe)], input=text, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{exe} exited with {proc.returncode}: {proc.stderr.strip()}")
    out = np.array([[float(v) for v in line.split(",")] for line in proc.stdout.splitlines() if line])
    return out[:, :ny], out[:, ny:]
