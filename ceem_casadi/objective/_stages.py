"""Per-time-step pieces (stages) of the CE-EM objective and their exact derivatives, mapped over time by
the smoother and the learner, optionally compiled (docs/runtime.md, "The objective's stages")."""
from __future__ import annotations

import logging

import casadi as ca
import numpy as np

from ..runtime._compile import CompileCacheError, compiler, fallback_warning, start_compile
from ..runtime._schema import HESSIANS

log = logging.getLogger(__name__)

# compile automatically from this many SX instructions, or instructions x stages mapped per call; never a
# program longer than MAX_COMPILE_INSTRUCTIONS (docs/runtime.md)
AUTO_COMPILE_INSTRUCTIONS = 20_000
AUTO_COMPILE_WORK = 20_000_000
MAX_COMPILE_INSTRUCTIONS = 300_000
GRAM_BY_BLAS = 4_096   # entries of a stage's Jp'Jp above which the joint step forms it from Jp by BLAS
# the Functions every smoothing NLP uses
SMOOTHER_STAGES = ("obs_cost", "dyn_cost", "obs_x_grad", "dyn_x_grad", "obs_x_hess_triu", "dyn_x_hess_triu")


def _cost_grad(name, residual, wrt, inputs, in_names, dense: bool) -> ca.Function:
    """``(cost, grad)`` of one stage with respect to ``wrt``."""
    cost = 0.5 * ca.sumsqr(residual)
    grad = ca.gradient(cost, wrt)  # one reverse sweep (not ny of them as J^T r would take)
    if dense:
        grad = ca.densify(grad)
    return ca.Function(name + "_grad", inputs, [cost, grad], in_names, ["cost", "grad"])


def _cross_hess(name, residual, wrt, p, inputs, in_names, hessian: str) -> ca.Function:
    """Dense cross block d^2 cost / d wrt d p of one stage: exact, or Gauss-Newton ``J_w^T J_p``."""
    if hessian == "exact":
        cross = ca.jacobian(ca.gradient(0.5 * ca.sumsqr(residual), wrt), p)
    else:
        cross = ca.jacobian(residual, wrt).T @ ca.jacobian(residual, p)
    return ca.Function(name + "_hess", inputs, [ca.densify(cross)], in_names, ["hess"])


def _hess(name, residual, wrt, inputs, in_names, hessian: str, dense: bool, upper: bool = False) -> ca.Function:
    """``hess`` of one stage with respect to ``wrt``: exact, or Gauss-Newton ``J^T J``; with ``upper``
    only its upper triangle (zeros below)."""
    if hessian == "exact":
        hess, _ = ca.hessian(0.5 * ca.sumsqr(residual), wrt)
    else:
        jac = ca.jacobian(residual, wrt)
        hess = jac.T @ jac
    if upper:
        hess = ca.triu(hess)
    if dense:
        hess = ca.densify(hess)
    return ca.Function(name + "_hess", inputs, [hess], in_names, ["hess"])


def _gauss_newton(name, residual, wrt, p, free, inputs, in_names, times: bool) -> ca.Function:
    """Gauss-Newton blocks of one stage in its states ``wrt`` (one or two blocks of nx) and ``p[free]``: ``Jp'Jp, Jp'r``
    (sparse), per block j ``tril(Jj'Jj), [Jj'r Jj'Jp]'`` and for two blocks ``J1'J0`` (dense, column-major); with
    ``times``: ``Jj'Jp dz`` (nx,) per block for an extra input dz (n_free,) (docs/long_records.md)."""
    jp, nx = ca.jacobian(residual, p)[:, free], inputs[0].numel()
    jw = [ca.jacobian(residual, w) for w in ca.vertsplit(wrt, nx)]
    if times:
        dz = ca.SX.sym("dz", len(free))
        return ca.Function(name + "_gn_dz", [*inputs, dz], [ca.densify(j.T @ (jp @ dz)) for j in jw], [*in_names, "dz"],
                           [f"hwp_dz{i}" for i in range(len(jw))])
    out, jpr = [jp.T @ jp, jp.T @ residual], jp if jp.nnz() else ca.SX(jp.size1(), 0)  # no columns of zeros
    for j in jw:
        out += [ca.densify(ca.tril(j.T @ j)), ca.densify(ca.horzcat(j.T @ residual, j.T @ jpr).T)]
    out += [ca.densify(jw[1].T @ jw[0])] if len(jw) > 1 else []
    return ca.Function(name + "_gn", inputs, out, in_names, ["hpp", "gp", "h0", "r0", "h1", "r1", "h01"][:len(out)])


def _gram_by_blas(residual, p, free) -> bool:
    """Whether ``Jp'Jp``, Jp = d residual / d p[free], has more than `GRAM_BY_BLAS` structural nonzeros: pairs of
    Jp's columns sharing a row, counted per group of columns with the same rows (Jp is not formed)."""
    rows, counts = np.unique(np.array(ca.DM(ca.jacobian_sparsity(residual, p), 1))[:, free].T, axis=0,
                             return_counts=True)
    return bool(counts @ (rows @ rows.T > 0) @ counts > GRAM_BY_BLAS)


def _newton_terms(name, residual, wrt, inputs, in_names, hessian: str) -> ca.Function:
    """``(cost, grad, hess)`` of one stage with respect to ``wrt`` in ONE program (batched smoother):
    Gauss-Newton from the residual Jacobian J alone (grad = J^T r, hess = triu(J^T J)), or exact."""
    cost = 0.5 * ca.sumsqr(residual)

    def program(grad, hess):
        return ca.Function(name + "_newton", inputs, [cost, ca.densify(grad), ca.densify(ca.triu(hess))], in_names,
                           ["cost", "grad", "hess"])

    if hessian == "exact":
        hess, grad = ca.hessian(cost, wrt)
        return program(grad, hess)
    # J by forward sweeps (CasADi's jacobian) or one reverse sweep per residual row: the shorter program
    candidates, rows = [], residual.numel()
    for jac in [ca.jacobian(residual, wrt)] + ([ca.vertcat(*[ca.gradient(residual[i], wrt).T for i in range(rows)])]
                                               if rows else []):
        candidates.append(program(jac.T @ residual, jac.T @ jac))
    return min(candidates, key=lambda f: f.n_instructions())


class StageFunctions:
    """SX stage Functions of a model: the pieces of the negative joint log-density, one observation and one dynamics
    stage per sample, with their derivatives, each built on first request (``stages.obs_cost`` or `get`).

    Inputs (all columns): x, x_next (nx), u (nu), y, m (ny; m is the 0/1 observed mask), p (np), iw (nx) = 1/sigma_w,
    iv (ny) = 1/sigma_v.

    Parameters
    ----------
    model : StateSpaceModel
        The model whose f and g the stages are built from.
    hessian : {"gauss-newton", "exact"}
        Hessian of the stage costs: the Gauss-Newton product J_r' J_r (positive semidefinite) or the exact one.
    compile : bool or None
        ``True`` compiles the Functions a solver asks for with `get`, ``False`` never, ``None`` (default) when a C
        compiler exists and the programs are long enough, or mapped over enough stages (``columns``), to pay off.

    Examples
    --------
    The observation cost 0.5 (iv (y - g(x)))^2 of one stage of a scalar model with g(x) = x:

    >>> import ceem_casadi as cc
    >>> from ceem_casadi.objective import StageFunctions
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x, lambda x, u, p: x, nx=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)))
    >>> stages = StageFunctions(model, compile=False)
    >>> float(stages.obs_cost(1.0, [], 3.0, 1.0, 0.5, 2.0))
    8.0
    """

    def __init__(self, model, hessian: str = "gauss-newton", compile: bool | None = None):
        if hessian not in HESSIANS:
            raise ValueError(f"hessian must be one of {HESSIANS}, got {hessian!r}")
        self.model, self.hessian, self.compile = model, hessian, compile
        nx, nu, ny, npar = model.nx, model.nu, model.ny, model.params.size
        x, xn = ca.SX.sym("x", nx), ca.SX.sym("x_next", nx)
        u, y, m = ca.SX.sym("u", nu), ca.SX.sym("y", ny), ca.SX.sym("m", ny)
        p, iw, iv = ca.SX.sym("p", npar), ca.SX.sym("iw", nx), ca.SX.sym("iv", ny)
        r_obs = m * iv * (y - model.g(x, u, p))
        r_dyn = iw * (xn - model.f(x, u, p))
        z = ca.vertcat(x, xn)
        obs_in, obs_names = [x, u, y, m, p, iv], ["x", "u", "y", "m", "p", "iv"]
        dyn_in, dyn_names = [x, xn, u, p, iw], ["x", "x_next", "u", "p", "iw"]
        self.obs_uses_p = bool(ca.depends_on(r_obs, p))
        self.dyn_uses_p = bool(ca.depends_on(r_dyn, p))

        free = model.params.free_index.tolist()
        # per stage kind: Jp'Jp too large for symbolic products (six coupled Lorenz, 288 parameters: 3.3e6
        # instructions a stage), the joint step forms the products from the residual Jacobians by BLAS
        self.products_by_blas = {"obs": _gram_by_blas(r_obs, p, free), "dyn": _gram_by_blas(r_dyn, p, free)}

        def table(k, r, w, ins, names):  # the Functions of one stage kind: w its states (x, or z = (x, x_next))
            jac = "x" if k == "obs" else "z"
            return {
                # derivatives with respect to the states (smoothing step), dense blocks, and their upper triangles
                # (zeros below: all the smoother's Hessian assembly reads)
                f"{k}_x_grad": lambda: _cost_grad(f"{k}_x", r, w, ins, names, True),
                f"{k}_x_hess": lambda: _hess(f"{k}_x", r, w, ins, names, hessian, True),
                f"{k}_x_hess_triu": lambda: _hess(f"{k}_x_triu", r, w, ins, names, hessian, True, True),
                # cost, gradient and upper Hessian triangle in one program (batched smoother)
                f"{k}_x_newton": lambda: _newton_terms(f"{k}_x", r, w, ins, names, hessian),
                # derivatives with respect to the parameters (learning step), sparse
                f"{k}_p_grad": lambda: _cost_grad(f"{k}_p", r, p, ins, names, False),
                f"{k}_p_hess": lambda: _hess(f"{k}_p", r, p, ins, names, hessian, False),
                # cross blocks states x parameters (dense; parameter uncertainty)
                f"{k}_xp_hess": lambda: _cross_hess(f"{k}_xp", r, w, p, ins, names, hessian),
                # residual Jacobians with respect to the parameters (dense), for Gauss-Newton in numpy
                f"{k}_p_jac": lambda: ca.Function(f"{k}_p_jac", ins, [ca.densify(ca.jacobian(r, p))], names, ["jac"]),
                # plain costs (for J and diagnostics)
                f"{k}_cost": lambda: ca.Function(f"{k}_cost", ins, [0.5 * ca.sumsqr(r)], names, ["cost"]),
                # Gauss-Newton blocks over the states and the free parameters, and times a step dz (joint step)
                f"{k}_gn": lambda: _gauss_newton(k, r, w, p, free, ins, names, False),
                f"{k}_gn_dz": lambda: _gauss_newton(k, r, w, p, free, ins, names, True),
                # residuals with their Jacobians in the states (joint NLP, parameter uncertainty)
                f"{k}_res_jac_{jac}": lambda: ca.Function(f"{k}_res_jac_{jac}", ins, [ca.densify(r),
                                                          ca.densify(ca.jacobian(r, w))], names, ["r", f"jac_{jac}"])}

        self._lazy = {**table("obs", r_obs, x, obs_in, obs_names), **table("dyn", r_dyn, z, dyn_in, dyn_names)}
        self._raw: dict[str, ca.Function] = {}
        self._compiled: dict[str, ca.Function] = {}
        self._pending: dict = {}  # name -> compile.CompiledHandle (compiling in the background)

    def _build(self, name: str) -> ca.Function:
        if name not in self._raw:
            if name not in self._lazy:
                raise KeyError(f"no stage Function {name!r}; expected one of {sorted(self._lazy)}")
            self._raw[name] = self._lazy[name]()
        return self._raw[name]

    def __getattr__(self, name):  # raw SX Functions as attributes: stages.obs_cost, ...
        if name in self.__dict__.get("_lazy", {}):
            return self._build(name)
        raise AttributeError(name)

    def instructions(self, names) -> int:
        """Total number of CasADi virtual-machine instructions of the Functions ``names`` (the
        measure of program length the compilation decision uses)."""
        return sum(self._build(n).n_instructions() for n in names)

    def to_compile(self, names, columns: int = 1) -> list[str]:
        """Those of ``names`` that `get` compiles; ``columns``: stages one evaluation of the caller maps
        them over."""
        for n in names:
            self._build(n)
        small = [n for n in names if self._raw[n].n_instructions() <= MAX_COMPILE_INSTRUCTIONS]
        want = self.compile
        if want is None:
            work = self.instructions(small)
            want = compiler() is not None and (
                work >= AUTO_COMPILE_INSTRUCTIONS or work * columns >= AUTO_COMPILE_WORK)
        return small if want else []

    def _start(self, names: list[str]) -> None:
        fresh = [n for n in names if n not in self._compiled and n not in self._pending]
        if fresh:
            handles = start_compile([self._raw[n] for n in fresh], f"ceem_{self.model.name}")
            self._pending.update(zip(fresh, handles))

    def prefetch(self, *groups) -> None:
        """Start compiling in the background what ``get(*group)`` compiles, for each group (a sequence of
        names), all queued together, and return at once; failures are reported by `get`."""
        names = list(dict.fromkeys(n for group in groups for n in self.to_compile(group)))
        try:
            self._start(names)
        except RuntimeError as exc:
            log.debug("prefetch of %s not started: %s", names, exc)

    def get(self, *names: str, columns: int = 1) -> list[ca.Function]:
        """The Functions ``names``, compiled when compilation is on (waiting for those still compiling);
        ``columns``: stages per evaluation of the caller. Falls back to the SX Functions, with a warning
        in the log, if compilation fails."""
        todo = self.to_compile(names, columns)
        if not todo:
            return [self._raw[n] for n in names]
        missing = [n for n in todo if n not in self._compiled]
        if missing:
            try:
                self._start(missing)
                for n in missing:
                    self._compiled[n] = self._pending[n].result()
            except RuntimeError as exc:
                if self.compile and not isinstance(exc, CompileCacheError):  # an unwritable cache: fall back
                    raise
                fallback_warning(log, "stage functions", exc)
                self.compile = False  # one warning: the virtual machine from now on
                return [self._raw[n] for n in names]
            finally:
                for n in missing:
                    self._pending.pop(n, None)
        return [self._compiled.get(n, self._raw[n]) for n in names]


def stack_stages(data, xs: list[np.ndarray]):
    """All trajectories' stages column-wise, from ``data`` and the states ``xs`` ((T_b, nx) each):
    ``(X, U, Y, M)`` (observation columns, N_obs = sum T_b: states, inputs, outputs with NaN -> 0 and
    the observed mask as 0/1) and ``(X_t, X_next, U_t)`` (dynamics columns, N_dyn = sum (T_b - 1))."""
    Xo, Uo, Yo, Mo, X0, X1, U0 = [], [], [], [], [], [], []
    for b, x in enumerate(xs):
        y, u = data.y[b], data.inputs(b)
        mask = np.isfinite(y)
        Xo.append(x.T), Uo.append(u.T), Yo.append(np.where(mask, y, 0.0).T), Mo.append(mask.T.astype(float))
        X0.append(x[:-1].T), X1.append(x[1:].T), U0.append(u[:-1].T)
    return [np.hstack(a) for a in (Xo, Uo, Yo, Mo)], [np.hstack(a) for a in (X0, X1, U0)]
