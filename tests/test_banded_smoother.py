"""The banded Newton smoothing solver (ceem_casadi/banded_newton.py) reaches IPOPT's optimum."""
from __future__ import annotations

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.model._block_oriented import wiener_hammerstein
from ceem_casadi.objective._stages import StageFunctions
from ceem_casadi.runtime import _solve as _ipopt
from ceem_casadi.runtime._compile import compiler
from ceem_casadi.smoothing._banded import band_storage
from ceem_casadi.smoothing._smoother import TrajectorySmoother, solver_kind
from models import lorenz


def _lorenz(T, seed=4):
    model = lorenz.single_lorenz(process_std=0.1, measurement_std=0.5).with_noise(x1_mean=[0, 0, 20], x1_std=5)
    rng = np.random.default_rng(seed)
    data, xt = cc.simulate(model, lorenz.TRUE, [rng.standard_normal(3) + [0, 0, 20]], T, process_std=0.1,
                           measurement_std=0.5, seed=seed)
    return model, model.theta_vector(lorenz.TRUE), data.y[0].copy(), np.zeros((T, 0)), xt[0]


def _block(T, seed=4):
    from scripts.block_oriented_demo import TRUTH
    model = wiener_hammerstein(3, 3, theta0=TRUTH, scale=2.0, process_std=0.02, measurement_std=0.05)
    model = model.with_noise(x1_mean=np.zeros(6), x1_std=1.0)
    u = np.random.default_rng(seed).standard_normal((T, 1))
    data, xt = cc.simulate(model, TRUTH, [np.zeros(6)], T, u=[u], process_std=0.02, measurement_std=0.05,
                           seed=seed)
    return model, model.theta_vector(TRUTH), data.y[0].copy(), u, xt[0]


def _pair(model, T, chunk=0, hessian="gauss-newton", tol=1e-10):
    stages = StageFunctions(model, hessian, compile=False)
    return [TrajectorySmoother(stages, T, cc.SmootherOptions(chunk=chunk, solver=s, hessian=hessian, tol=tol))
            for s in ("ipopt", "banded")]


@pytest.mark.parametrize("make, chunk, hessian", [("lorenz", 0, "gauss-newton"), ("lorenz", 7, "exact"),
                                                  ("block", 0, "exact"), ("block", 9, "gauss-newton")])
def test_banded_equals_ipopt(make, chunk, hessian):
    """Same NLP (x1 prior, trust region rho_x = 0.3, missing outputs, inputs for the block model),
    plain and chunked: the banded solver's optimum and cost equal IPOPT's to 1e-8 relative."""
    T = 60
    model, theta, y, u, xt = (_lorenz if make == "lorenz" else _block)(T)
    y[[3, 17, 40]] = np.nan
    rng = np.random.default_rng(1)
    x0 = xt + 0.3 * rng.standard_normal(xt.shape)
    ip, bd = _pair(model, T, chunk, hessian)
    assert bd.solver is None and bd.solver_kind == "banded"
    a, b = ip.solve(model, theta, y, u, x0, 0.3), bd.solve(model, theta, y, u, x0, 0.3)
    assert a.success and b.success and b.status == "Solve_Succeeded"
    scale = np.abs(a.x).max()
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-8 * scale)
    assert b.cost == pytest.approx(a.cost, rel=1e-8)
    assert b.cost == pytest.approx(float(bd.cost_function(b.x.ravel(), bd.parameter_vector(model, theta, y, u, x0,
                                                                                             0.3))), rel=1e-12)


def test_far_start_needs_line_search_and_shift():
    """Exact Hessian from a start far from the optimum (x = (10, -10, 0) everywhere): the Hessian is
    indefinite there (the factorisation needs the Levenberg-Marquardt shift) and full Newton steps
    diverge (the line search is needed); the solver still reaches IPOPT's optimum."""
    T = 200
    model, theta, y, u, _ = _lorenz(T, seed=3)
    ip, bd = _pair(model, T, hessian="exact")
    x0 = np.tile([10.0, -10.0, 0.0], (T, 1))
    a, b = ip.solve(model, theta, y, u, x0, 0.0), bd.solve(model, theta, y, u, x0, 0.0)
    assert a.success and b.success
    np.testing.assert_allclose(b.x, a.x, rtol=0, atol=1e-8 * np.abs(a.x).max())
    out = bd._newton.solve(x0.ravel(), bd._objective.bind(bd.parameter_vector(model, theta, y, u, x0, 0.0)))
    assert out.max_shift > 0 and out.status == "Solve_Succeeded"


def test_band_storage_is_the_dense_matrix():
    """band_storage of block-column nonzeros == the dense symmetric block-tridiagonal matrix
    (oracle: numpy; LAPACK's band layout ab[u + r - c, c] = A[r, c])."""
    nx, T = 3, 5
    rng = np.random.default_rng(0)
    D = [rng.standard_normal((nx, nx)) for _ in range(T)]
    D = [d + d.T for d in D]
    Off = [rng.standard_normal((nx, nx)) for _ in range(T - 1)]
    A = np.zeros((nx * T, nx * T))
    nz = []
    for t in range(T):
        A[t * nx:(t + 1) * nx, t * nx:(t + 1) * nx] = D[t]
        above = Off[t - 1] if t else np.zeros((nx, nx))
        if t:
            A[(t - 1) * nx:t * nx, t * nx:(t + 1) * nx] = above
            A[t * nx:(t + 1) * nx, (t - 1) * nx:t * nx] = above.T
        for j in range(nx):
            nz += list(above[:, j]) + list(D[t][:j + 1, j])
    ab = band_storage(np.array(nz), nx, T)
    u = 2 * nx - 1
    for c in range(nx * T):
        for r in range(max(0, c - u), c + 1):
            assert ab[u + r - c, c] == A[r, c]


def test_failures_are_reported():
    """A non-finite start, the iteration limit and the library's deadline come back as statuses."""
    T = 30
    model, theta, y, u, xt = _lorenz(T)
    stages = StageFunctions(model, compile=False)
    bd = TrajectorySmoother(stages, T, cc.SmootherOptions(solver="banded", max_iters=1))
    bad = xt.copy()
    bad[4, 1] = np.nan
    r = bd.solve(model, theta, y, u, bad)
    assert r.status == "Invalid_Number_Detected" and not r.success
    r = bd.solve(model, theta, y, u, xt + 1.0)
    assert r.status == "Maximum_Iterations_Exceeded" and r.iterations == 1 and not r.success
    with _ipopt.deadline(0.0):
        r = bd.solve(model, theta, y, u, xt + 1.0)
    assert r.status == "User_Requested_Stop" and r.iterations == 0


def test_solver_option():
    """None = banded from T = 20,000 on without bounds; banded with bounds is refused."""
    assert solver_kind(cc.SmootherOptions(), 19_999) == "ipopt"
    assert solver_kind(cc.SmootherOptions(), 20_000) == "banded"
    assert solver_kind(cc.SmootherOptions(x_lower=-50), 10**6) == "ipopt"
    assert solver_kind(cc.SmootherOptions(solver="banded"), 10) == "banded"
    with pytest.raises(cc.OptionsError, match="without state bounds"):
        cc.SmootherOptions(solver="banded", x_upper=3.0)
    with pytest.raises(cc.OptionsError, match="solver must be"):
        cc.SmootherOptions(solver="mumps")
    opts = cc.CEEMOptions.from_mapping({"smoother": {"solver": "banded"}})
    assert opts.smoother.solver == "banded"
    with pytest.raises(cc.OptionsError, match="smoother.solver"):
        cc.CEEMOptions.from_mapping({"smoother": {"solver": 1}})


@pytest.mark.parametrize("n_jobs", [1, 2])
def test_ceem_with_banded_smoother_equals_ipopt(n_jobs):
    """A whole CE-EM fit (Newton acceleration) with the banded smoother == with IPOPT."""
    model = lorenz.single_lorenz(process_std=0.05, measurement_std=0.1)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=1), 80, measurement_std=0.1,
                          process_std=0.05, seed=2)
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.05, seed=3)
    fits = [cc.ceem(model, data, theta0, options=cc.CEEMOptions(
        max_iters=6, acceleration="newton", n_jobs=n_jobs,
        smoother=cc.SmootherOptions(solver=s, compile=False, tol=1e-10)))
        for s in ("ipopt", "banded")]
    assert [f.status for f in fits] == [fits[0].status] * 2 and fits[0].iterations == fits[1].iterations
    np.testing.assert_allclose(model.theta_vector(fits[1].theta), model.theta_vector(fits[0].theta), rtol=1e-8)
    assert fits[1].J == pytest.approx(fits[0].J, rel=1e-10)


def _worker_solver_kinds():
    from ceem_casadi.distributed import _tasks as _shard_tasks
    return [ts.solver_kind for entry in _shard_tasks._CACHE.values() for ts in entry.smoother._solvers.values()]


def test_dask_shard_smoother_uses_banded_solver():
    """The Dask shard smoother builds its TrajectorySmoother from the same options: a fit on a
    LocalCluster (2 workers) with solver="banded" equals the sequential banded fit (rounding of
    the sharded learner's sums: 1e-8)."""
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not installed")
    from ceem_casadi.distributed._executors import Sharded

    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(3, seed=10), [64, 48, 56],
                          measurement_std=0.01, seed=11)
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.1, seed=5)
    opts = dict(max_iters=4, tol=0.0, smoother=cc.SmootherOptions(solver="banded", compile=False))
    seq = cc.ceem(model, data, theta0, options=cc.CEEMOptions(**opts))
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        res = cc.ceem(model, data, theta0, options=cc.CEEMOptions(executor=Sharded(client), **opts))
        kinds = client.run(_worker_solver_kinds)
    assert sorted(k for ks in kinds.values() for k in ks) == ["banded"] * 3  # 3 lengths over 2 workers
    np.testing.assert_allclose(model.theta_vector(res.theta), model.theta_vector(seq.theta), rtol=1e-8)
    for a, b in zip(res.x, seq.x, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-7)


@pytest.mark.parametrize("chunk", [6, 1000])
def test_joint_step_in_time_chunks_equals_dense_solve(monkeypatch, chunk):
    """The joint Newton step, its stage Jacobians evaluated in chunks of 6 stages (lengths 20 and
    13: a last chunk of 2 stages and one of a single observation stage) or in one piece, equals
    one dense damped Gauss-Newton solve (oracle of tests/test_joint.py)."""
    from ceem_casadi.em import _joint_gauss_newton as joint_gauss_newton
    from ceem_casadi.runtime import _policy as policy
    from ceem_casadi.smoothing._initial_states import eks_states
    from tests.test_joint import dense_step

    monkeypatch.setattr(policy, "JOINT_CHUNK", chunk)
    model = lorenz.single_lorenz(process_std=0.01, measurement_std=0.01, theta0=lorenz.perturbed(lorenz.TRUE, 0.1, 3))
    model = model.with_noise(x1_mean=[-6.0, -6.0, 24.0], x1_std=2.5)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=4), [20, 13], measurement_std=0.01,
                          seed=5)
    data = data.with_missing(0.1, seed=6)
    theta_vec = model.theta_vector(model.params.initial())
    xs = eks_states(model, theta_vec, data)
    st = joint_gauss_newton.JointGaussNewton(model, data.lengths, StageFunctions(model)).step(theta_vec, data, xs,
                                                                                              mu=1e-3)
    got = np.concatenate([x.ravel() for x in st.xs] + [st.theta_vec])
    np.testing.assert_allclose(got, dense_step(model, data, theta_vec, xs, 1e-3), rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("make, hessian", [("lorenz", "exact"), ("block", "gauss-newton")])
def test_piece_learner_equals_learner(make, hessian):
    """The learning step over pieces of 7 stages (two trajectories of 61 and 30 samples, missing
    outputs) == the Learner over all stages at once: parameters, cost and Hessian to 1e-10."""
    from ceem_casadi.learning._pieces import PieceLearner, piece_bounds

    assert piece_bounds(10, 3) == [(0, 4), (3, 7), (6, 10)] and piece_bounds(1, 3) == [(0, 1)]
    if make == "lorenz":
        model = lorenz.single_lorenz(process_std=0.05, measurement_std=0.1)
        data, xt = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(2, seed=1), [61, 30], measurement_std=0.1,
                               process_std=0.05, seed=2)
        theta0 = lorenz.perturbed(lorenz.TRUE, 0.1, seed=3)
    else:
        from scripts.block_oriented_demo import TRUTH
        model = wiener_hammerstein(3, 3, theta0=TRUTH, scale=2.0, process_std=0.02, measurement_std=0.05)
        u = [np.random.default_rng(s).standard_normal((T, 1)) for s, T in ((1, 61), (2, 30))]
        data, xt = cc.simulate(model, TRUTH, np.zeros((2, 6)), [61, 30], u=u, process_std=0.02,
                               measurement_std=0.05, seed=4)
        theta0 = lorenz.perturbed(TRUTH, 0.05, seed=3)
        theta0["g1_num"][0] = 1.0
    data, xs = data.with_missing(0.1, seed=6), list(xt)
    th = model.theta_vector(theta0)
    opts = cc.LearnerOptions(hessian=hessian, compile=False, tol=1e-12)
    ref, pieces = cc.learning.Learner(model, data.lengths, opts), PieceLearner(model, opts, piece=7)
    a, b = ref.solve(th, data, xs), pieces.solve(th, data, xs)
    assert a.success and b.success
    np.testing.assert_allclose(b.theta_vec, a.theta_vec, rtol=1e-10, atol=1e-12)
    assert b.cost == pytest.approx(a.cost, rel=1e-10)
    Ha, Hb = ref.hessian_matrix(th, data, xs), pieces.hessian_matrix(th, data, xs)
    np.testing.assert_allclose(Hb, Ha, rtol=1e-10, atol=1e-10 * np.abs(Ha).max())


def test_ceem_uses_piece_learner_for_long_records(monkeypatch):
    """With the thresholds lowered (pieces of 16 from T = 50 on), cc.ceem learns piece by piece and
    its fit equals the one over all stages at once."""
    from ceem_casadi.learning import _pieces as learner_pieces
    from ceem_casadi.runtime import _policy as policy

    model = lorenz.single_lorenz(process_std=0.05, measurement_std=0.1)
    data, _ = cc.simulate(model, lorenz.TRUE, lorenz.initial_states(1, seed=1), 80, measurement_std=0.1,
                          process_std=0.05, seed=2)
    theta0 = lorenz.perturbed(lorenz.TRUE, 0.05, seed=3)
    opts = cc.CEEMOptions(max_iters=4, tol=0.0, smoother=cc.SmootherOptions(compile=False),
                          learner=cc.LearnerOptions(compile=False))
    whole = cc.ceem(model, data, theta0, options=opts)
    made = []
    monkeypatch.setattr(policy, "PIECE_FROM", 50)
    monkeypatch.setattr(policy, "PIECE_LENGTH", 16)
    monkeypatch.setattr(learner_pieces.PieceLearner, "__init__", _recording(learner_pieces.PieceLearner.__init__, made))
    split = cc.ceem(model, data, theta0, options=opts)
    assert made and made[0].engine.piece == 16
    np.testing.assert_allclose(model.theta_vector(split.theta), model.theta_vector(whole.theta), rtol=1e-9)
    assert split.J == pytest.approx(whole.J, rel=1e-10)


def _recording(init, made):
    def wrapped(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    return wrapped


def test_a_retried_factorisation_gets_a_fresh_hessian_when_the_band_is_factorised_in_place():
    """An indefinite Hessian (f = sum x^4 / 4 - x^2 / 2 + 0.3 x from x = 0.1: H = 3 x^2 - 1 < 0) needs a
    shift: given as LAPACK band storage (T, nx, 2 nx), which `direction` factorises in place, the solver
    asks for the Hessian again before each retry and takes the same steps as with the nonzeros (T, k)."""
    from ceem_casadi.smoothing._banded import BandedNewton

    class Quartic:
        def __init__(self, band):
            self.band, self.hessians = band, 0

        def cost(self, x):
            return float(np.sum(x ** 4 / 4 - x ** 2 / 2 + 0.3 * x))

        def newton(self, x):
            self.hessians += 1
            h = 3 * x ** 2 - 1
            nz = np.stack([np.zeros_like(h), h], axis=1)  # nx = 1: (block above, diagonal) per column
            return self.cost(x), x ** 3 - x + 0.3, nz.reshape(-1, 1, 2) if self.band else nz, np.zeros(1)

    x0 = np.full(4, 0.1)
    plain, band = Quartic(False), Quartic(True)
    a = BandedNewton(1, 4, 50, 1e-10).solve(x0, plain)
    b = BandedNewton(1, 4, 50, 1e-10).solve(x0, band)
    assert a.status == b.status == "Solve_Succeeded" and a.max_shift > 0
    np.testing.assert_array_equal(a.x, b.x)
    assert band.hessians > a.iterations + 1  # the retries asked again


@pytest.mark.skipif(compiler() is None, reason="needs a C compiler")
def test_chunk_functions_compiled_whole_equal_the_virtual_machine():
    """With compilation on, a chunked objective's chunk Functions are compiled whole, stage Functions inlined
    (`_newton_and_cost`), and give the virtual machine's cost, gradient and Hessian band on a 6-state record."""
    model, theta, y, u, x = _block(300)
    pair = [TrajectorySmoother(StageFunctions(model, compile=c), 300, cc.SmootherOptions(chunk=64, solver="banded"))
            for c in (True, False)]
    objs = [ts._objective for ts in pair]
    assert [o._newton.fun.class_name() for o in objs] == ["External", "MXFunction"]
    P = pair[0].parameter_vector(model, theta, y, u, x, 0.5)
    xt = x.ravel() + 0.01
    (f, g, band, _), (f0, g0, band0, _) = (o.bind(P).newton(xt) for o in objs)
    np.testing.assert_allclose([f, objs[0].bind(P).cost(xt)], [f0, objs[1].bind(P).cost(xt)], rtol=1e-13)
    np.testing.assert_allclose(g, g0, rtol=1e-13, atol=1e-13 * np.abs(g0).max())
    np.testing.assert_allclose(band, band0, rtol=1e-13, atol=1e-13 * np.abs(band0).max())
