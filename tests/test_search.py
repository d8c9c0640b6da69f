"""Structure search in identify (issue 31 items 1-3) and the identify / starts cases of issue 33."""
import logging

import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.runtime import _policy as policy
from ceem_casadi.workflow import Augmentation, SearchOptions, fisher_information, log_uniform_starts
from ceem_casadi.workflow._augment import AUGMENTATIONS, augment, context_of

SIGMA = 0.02


def _user(b_free=False):
    params = cc.Parameters(cc.Param("a", 0.5, lower=-0.99, upper=0.99), cc.Param("b", 0.5, free=b_free))
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
                                            params=params, measurement_std=SIGMA)


TRUTH = {"a": 0.8, "b": 0.5, "off": 0.3, "k": 0.2}


def _truth_data(T=300, B=2, seed=0):
    """y = off + x + k x^3 (an offset and a cubic sensor curve) on x+ = a x + b u, noise SIGMA."""
    truth = cc.StateSpaceModel.from_discrete(
        lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: p.off + x + p.k * x ** 3, nx=1, nu=1,
        params=cc.Parameters(*[cc.Param(k, v) for k, v in TRUTH.items()]), measurement_std=SIGMA)
    rng = np.random.default_rng(seed)
    us = [rng.normal(size=(T, 1)) for _ in range(B)]
    ys = [cc.simulate_output(truth, TRUTH, u, np.zeros(1)) + SIGMA * rng.normal(size=(T, 1)) for u in us]
    return cc.Trajectories(ys, us)


def test_every_augmentation_starts_at_its_parents_outputs():
    """The nesting the search relies on: the grown model at its start gives the parent's outputs
    exactly (also two moves deep), for every kind."""
    model = cc.StateSpaceModel.from_discrete(
        lambda x, u, p: ca.vertcat(p.a * x[0] + u[0], 0.5 * x[1] + 0.3 * x[0]),
        lambda x, u, p: 0.1 * x[0] ** 2 + x[1], nx=2, nu=1, params=cc.Parameters(cc.Param("a", 0.8)),
        measurement_std=0.1)
    rng = np.random.default_rng(0)
    us = [rng.normal(size=(40, 1)) for _ in range(2)]
    th, x0 = {"a": np.array(0.8)}, np.array([[0.1, 0.2], [0.3, -0.1]])
    data = cc.Trajectories([cc.simulate_output(model, th, u, x0[b]) for b, u in enumerate(us)], us)
    for kind in AUGMENTATIONS:
        if not Augmentation(kind).applicable(model):
            continue
        g = augment(Augmentation(kind), model, th, x0, data, context_of(model, th, x0, data), "s1")
        g2 = augment(Augmentation("mlp_state"), g.model, g.theta, g.x0, data,
                     context_of(g.model, g.theta, g.x0, data), "s2")
        assert g.n_new > 0
        for b in range(2):
            y = cc.simulate_output(g2.model, g2.theta, us[b], g2.x0[b])
            assert np.max(np.abs(y - data.y[b])) < 1e-12, kind
        # the new terms move the output (the move is not a no-op)
        tv = g.model.params.to_vector(g.theta) + 0.1 * g.model.params.free_mask * (np.arange(g.model.params.size)
                                                                                     >= model.params.size)
        y = cc.simulate_output(g.model, tv, us[0], g.x0[0])
        assert np.max(np.abs(y - data.y[0])) > 1e-6, kind


@pytest.mark.parametrize("kind, n, nl", [("wiener_hammerstein", (2, 3), "poly"), ("wiener", (3,), "mlp"),
                                         ("hammerstein", (2,), "poly")])
def test_the_block_moves_start_at_their_parent(kind, n, nl):
    """bla_initialise's block models grown by every block move (degree +2, orders +1, 3 more MLP
    units), each then by a second move (orders +1 again): the same outputs at the start, the expected
    new parameters, and the new terms move the output."""
    rng = np.random.default_rng(1)
    u = rng.normal(size=(600, 1))
    v = np.convolve(u[:, 0], [0.5, 0.3, 0.1])[:600]
    data = cc.Trajectories([np.convolve(np.tanh(v), [0.6, 0.3])[:600, None] + 1e-3 * rng.normal(size=(600, 1))], [u])
    extra = dict(degree=5, gain="dc", basis="chebyshev") if nl == "poly" else dict(nonlinearity="mlp", hidden=4)
    init = cc.workflow.bla_initialise(kind, data, *n, feedthrough=(True, True) if len(n) == 2 else True, **extra)
    y0 = cc.simulate_output(init.model, init.theta, u, init.x0[0])
    expect = {"poly_degree": {"f_coef": 2}, "nl_width": {"f_W0": 3, "f_b0": 3, "f_W1": 3},
              "order": {f"g{i}_{w}": 1 for i in (("1", "2") if len(n) == 2 else ("",)) for w in ("den", "num")}}
    tried = []
    for kind_ in expect:
        move = Augmentation(kind_, degree=2, width=3)
        if not move.applicable(init.model):
            continue
        tried.append(kind_)
        g = augment(move, init.model, init.theta, init.x0, data, context_of(init.model, init.theta, init.x0, data), "s1")
        grown = {k: g.model.params[k].size - (init.model.params[k].size if k in init.model.params.names else 0)
                 for k in g.model.params.names}
        assert {k: d for k, d in grown.items() if d} == expect[kind_]
        assert g.model.nx == init.model.nx + (len(n) if kind_ == "order" else 0)
        g2 = augment(Augmentation("order"), g.model, g.theta, g.x0, data, context_of(g.model, g.theta, g.x0, data), "s2")
        for m in (g, g2):
            np.testing.assert_allclose(cc.simulate_output(m.model, m.theta, u, m.x0[0]), y0, rtol=0, atol=1e-12)
        tv = g.model.params.to_vector(g.theta) + 0.1 * g.model.params.free_mask * (
            np.arange(g.model.params.size) >= init.model.params.size)
        assert np.max(np.abs(cc.simulate_output(g.model, tv, u, g.x0[0]) - y0)) > 1e-4, kind_
    assert tried == (["poly_degree", "order"] if nl == "poly" else ["nl_width", "order"])
    assert not Augmentation("order").applicable(_user()) and Augmentation("order").applicable(g2.model)


def test_block_models_get_neither_the_moves_in_their_span_nor_the_mlp_residuals():
    """An offset and a gain (in a block model's span: its nonlinearity's constant and scale) and the MLP
    residuals (on the WH record 24x a block move's cost for no better tail) are not among the default moves
    of a block-oriented model, nor of a model grown from it by a generic move; a model of the user's own gets
    them, and so does a block model whose user lists them explicitly."""
    from ceem_casadi.workflow._augment import NOT_FOR_BLOCKS
    from ceem_casadi.workflow._search import _moves

    rng = np.random.default_rng(2)
    u = rng.normal(size=(300, 1))
    data = cc.Trajectories([np.tanh(np.convolve(u[:, 0], [0.5, 0.3])[:300, None])], [u])
    init = cc.workflow.bla_initialise("wiener", data, 2, feedthrough=True, degree=3)
    grown = augment(Augmentation("state_output"), init.model, init.theta, init.x0, data,
                    context_of(init.model, init.theta, init.x0, data), "s1")

    def kinds(model, opts=None):
        return {a.kind for a in _moves(opts or SearchOptions(), {"model": model, "structure": "user model"})}
    for model in (init.model, grown.model):
        assert not kinds(model) & set(NOT_FOR_BLOCKS) and "state_output" in kinds(model)
    assert set(NOT_FOR_BLOCKS) <= kinds(_user())
    assert kinds(init.model, SearchOptions(augmentations=NOT_FOR_BLOCKS)) == set(NOT_FOR_BLOCKS)
    assert "poly_degree" in kinds(init.model)


def _curve_coefficients(model, tv, grid):
    """Monomial coefficients (constant, x, x^2, x^3) of the static output map g(x) at the vector tv."""
    y = np.array([float(model.g(x, 0.0, tv)) for x in grid])
    return np.polynomial.polynomial.polyfit(grid, y, 3)


def test_search_recovers_an_output_offset_and_a_cubic_sensor_curve():
    """Truth: an offset and a cubic sensor curve the user's model lacks. The search chooses the
    static output curve (offset included) and the recovered a, offset and cubic coefficient are within
    3 standard errors (output-error Fisher information of the chosen model)."""
    data = _truth_data()
    res = cc.identify(_user(), data, {"a": 0.5, "b": 0.5}, time_limit=120,
                      search=SearchOptions(max_depth=2))
    assert res.search.structure == "user model + output_poly(3)"
    assert res.model is res.search.model and res.best.stage.startswith("structure search")
    m, th = res.model, res.theta
    info = sum(fisher_information(m, th, data.inputs(b), x0=res.x0[b]) for b in range(len(data)))
    cov = np.linalg.inv(info)
    free = list(m.params.free_index)                     # the Fisher rows: the free entries in order
    ia = free.index(m.params.slice("a").start)
    se_a = np.sqrt(cov[ia, ia])
    assert abs(float(th["a"]) - TRUTH["a"]) < 3 * se_a
    # the curve's monomial coefficients are linear in the free parameters: delta method by differences
    grid = np.linspace(-1.5, 1.5, 31)
    tv = m.params.to_vector(th)
    c0 = _curve_coefficients(m, tv, grid)
    J = np.zeros((4, len(free)))
    for j, i in enumerate(free):
        d = np.zeros_like(tv)
        d[i] = 1e-6
        J[:, j] = (_curve_coefficients(m, tv + d, grid) - c0) / 1e-6
    se = np.sqrt(np.diag(J @ cov @ J.T))
    assert abs(c0[0] - TRUTH["off"]) < 3 * se[0] and abs(c0[1] - 1.0) < 3 * se[1]
    assert abs(c0[3] - TRUTH["k"]) < 3 * se[3] and abs(c0[2]) < 3 * se[2]


def _objective(model, theta, data, x0):
    return sum(0.5 * np.sum(((data.y[b] - cc.simulate_output(model, theta, data.inputs(b), x0[b])) / SIGMA) ** 2)
               for b in range(len(data)))


@pytest.mark.parametrize("limit", [None, 4.0])
def test_search_never_returns_a_higher_estimation_objective_than_the_users_model(limit):
    """Against a poor structure of the user's own (wrong sign, a state that cannot move), a short
    time limit and moves that do not help: the returned objective is never above the user's
    model's best stage, recomputed by an independent free run."""
    data = _truth_data(T=120)
    bad = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.c * x + 0.1 * u, lambda x, u, p: -x, nx=1, nu=1,
                                           params=cc.Parameters(cc.Param("c", -0.5, lower=-0.9, upper=-0.1)),
                                           measurement_std=SIGMA)
    opts = SearchOptions(augmentations=("gain", "lowpass_input"), candidates=(("bad", bad, None),),
                         max_depth=2)
    res = cc.identify(_user(), data, {"a": 0.5, "b": 0.5}, search=opts, time_limit=limit)
    user_stages = [s for s in res.stages if not s.stage.startswith("structure search") and np.isfinite(s.objective)]
    user_best = min(s.objective for s in user_stages)
    assert res.search.objective <= user_best + 1e-9 * user_best
    assert _objective(res.model, res.theta, data, res.x0) == pytest.approx(res.best.objective, rel=1e-9)
    assert res.best.objective <= user_best + 1e-9 * user_best


def test_selection_reads_only_the_estimation_heads_and_tails(monkeypatch):
    """Every fit of the search before the final refit gets the heads of the estimation trajectories
    (the tails held back), the final refit all of them; nothing longer than the estimation data
    reaches a fit, and the test record (poisoned with NaN) is never touched."""
    import ceem_casadi.workflow._search as search_mod

    record = _truth_data(T=400, B=1)
    est = cc.Trajectories([record.y[0][:300]], [record.u[0][:300]])
    record.y[0][300:] = np.nan                                       # the test part: poisoned
    seen = []
    real = search_mod.refine_output_error

    def spy(model, data, theta, **kw):
        seen.append(tuple(data.lengths))
        assert all(np.all(np.isfinite(y)) for y in data.y)
        return real(model, data, theta, **kw)

    monkeypatch.setattr(search_mod, "refine_output_error", spy)
    res = cc.identify(_user(), est, {"a": 0.5, "b": 0.5}, search=SearchOptions(
        augmentations=("output_poly",), max_depth=1, holdout=0.25))
    assert seen[:-1] == [(225,)] * (len(seen) - 1) and seen[-1] == (300,)
    assert res.search.structure.endswith("output_poly(3)")
    assert np.isfinite(res.search.rows[0]["tail"])
    seen.clear()                                          # a long record: the search on its first 200 samples
    monkeypatch.setattr(policy, "SEARCH_SAMPLES", 200)
    cc.identify(_user(), est, {"a": 0.5, "b": 0.5}, search=SearchOptions(
        augmentations=("output_poly",), max_depth=1, holdout=0.25))
    assert seen[:-1] == [(150,)] * (len(seen) - 1) and seen[-1] == (300,)


def test_a_users_candidate_named_like_a_path_keeps_every_move():
    """A move's repeats count the moves applied on the path, not names parsed from the table: the user's
    candidate "mine + offset" (an offset and the cubic curve of its own) is still offered `offset`."""
    mine = cc.StateSpaceModel.from_discrete(
        lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: p.off + x + p.k * x ** 3, nx=1, nu=1,
        params=cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 0.5), cc.Param("off", 0.0), cc.Param("k", 0.0)),
        measurement_std=SIGMA)
    res = cc.identify(_user(), _truth_data(T=120, B=1), {"a": 0.5, "b": 0.5}, search=SearchOptions(
        augmentations=("offset",), candidates=(("mine + offset", mine, None),), max_depth=2))
    rows = [r["structure"] for r in res.search.rows]
    assert rows == ["user model", "mine + offset", "user model + offset", "mine + offset + offset"], rows


def test_starts_n_is_seeded_and_reproducible():
    model = _user(b_free=True)
    a = log_uniform_starts(model, {"a": 0.5, "b": 0.5}, 4, seed=3)
    b = log_uniform_starts(model, {"a": 0.5, "b": 0.5}, 4, seed=3)
    c = log_uniform_starts(model, {"a": 0.5, "b": 0.5}, 4, seed=4)
    assert [float(t["a"]) for t in a] == [float(t["a"]) for t in b] != [float(t["a"]) for t in c]
    assert all(0.5 / 3 <= float(t["b"]) <= 1.5 and -0.99 <= float(t["a"]) <= 0.99 for t in a)
    data = _truth_data(T=100)
    r1 = cc.identify(_user(b_free=True), data, {"a": 0.5, "b": 0.5}, starts=3, seed=1, ceem=False)
    r2 = cc.identify(_user(b_free=True), data, {"a": 0.5, "b": 0.5}, starts=3, seed=1, ceem=False)
    oe1, oe2 = (next(s for s in r.stages if s.stage == "output error from theta0") for r in (r1, r2))
    assert "of 4 won" in oe1.message and oe1.message.split(";")[0] == oe2.message.split(";")[0]
    assert oe1.objective == oe2.objective
    res = cc.refine_output_error(_user(b_free=True), data, {"a": 0.5, "b": 0.5}, starts=5)   # issue 33
    assert len(res.starts) == 6 and res.cost <= res.starts[0]["cost"]
    with pytest.raises(cc.OptionsError, match="starts"):
        cc.refine_output_error(_user(), data, {"a": 0.5, "b": 0.5}, starts="5")
    # bounds that exclude +-1 (a tank's height in [2, 20]): the draws stay within them (numpy refused low > high)
    tall = cc.Parameters(cc.Param("a", 0.5, lower=-0.99, upper=0.99), cc.Param("h", 5.0, lower=2.0, upper=20.0))
    drawn = log_uniform_starts(cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: p.h * x,
                                                                nx=1, nu=1, params=tall), {"a": 0.0, "h": 5.0}, 3)
    assert all(2.0 <= float(t["h"]) <= 20.0 and -1.0 <= float(t["a"]) <= 0.99 for t in drawn)
    assert len({float(t["a"]) for t in drawn}) == 3           # the entry at 0 is drawn flat within [-1, 1]


def test_ceem_options_as_a_dict_and_bad_options_in_one_line():
    data = _truth_data(T=60)
    res = cc.identify(_user(), data, {"a": 0.5, "b": 0.5}, ceem=True, calibrate=False, ceem_options={"max_iters": 3})
    ce = next(s for s in res.stages if s.stage == "CE-EM")
    assert ce.iterations <= 3 and ce.message.startswith("ran: ceem=True")
    with pytest.raises(cc.OptionsError, match="max_itrs"):
        cc.identify(_user(), data, {"a": 0.5, "b": 0.5}, ceem=True, ceem_options={"max_itrs": 3})
    with pytest.raises(cc.OptionsError, match="ceem must be"):
        cc.identify(_user(), data, {"a": 0.5, "b": 0.5}, ceem="yes")


def test_compare_structures_refuses_an_empty_candidate_set():
    with pytest.raises(cc.OptionsError, match="non-empty"):
        cc.compare_structures({}, _truth_data(T=30))


def test_ceem_auto_skips_when_output_error_converges_and_says_why():
    data = _truth_data(T=100)
    res = cc.identify(_user(), data, {"a": 0.5, "b": 0.5})
    ce = next(s for s in res.stages if s.stage == "CE-EM")
    assert ce.status == "skipped" and ce.rejected.startswith("skipped: output error from theta0 converged")
    assert res.best.stage == "output error from theta0" and "skipped" in res.table()


def test_identify_from_a_start_outside_the_models_domain_is_a_failed_stage_with_advice():
    """f is NaN below a = 0.6 (a square root) and the start is a = 0.5: the start and CE-EM fail as
    rows with advice (not 'pass x_init to ceem()', which identify does not take), the pipeline goes
    on and output error from the seeded multi-starts recovers a."""
    model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u + 1e-12 * ca.sqrt(p.a - 0.6),
                                             lambda x, u, p: x, nx=1, nu=1,
                                             params=cc.Parameters(cc.Param("a", 0.5, lower=0.0, upper=0.99)),
                                             measurement_std=0.05)
    u = np.random.default_rng(0).normal(size=(200, 1))
    data = cc.Trajectories([cc.simulate_output(model, {"a": 0.7}, u, np.zeros(1))], [u])
    res = cc.identify(model, data, {"a": 0.5}, time_limit=60, starts=4)
    ce = next(s for s in res.stages if s.stage == "CE-EM")
    assert ce.status == "solver_failed" and ce.rejected == "ran (the start does not simulate) and failed"
    assert "starts=n" in ce.message and "x_init" not in ce.message
    assert res.stages[0].status == "solver_failed"
    assert abs(float(res.theta["a"]) - 0.7) < 1e-6


def test_the_selection_rule_needs_both_the_criterion_and_the_tail():
    """A child is accepted only when its criterion on the heads AND its held-back tail RMS are both
    below its parent's (workflow/_search.py, `SearchState.judge`)."""
    from ceem_casadi.workflow._search import SearchState

    s = SearchState(_truth_data(T=50), SearchOptions(), cc.OutputErrorOptions(), None)
    parent = dict(ic=100.0, tail=1.0)
    cases = {(90.0, 0.9): "accepted", (90.0, 1.1): "rejected: tail", (110.0, 0.9): "rejected: AIC",
             (np.inf, 0.5): "rejected: its free run"}
    for (ic, tail), verdict in cases.items():
        child = dict(ic=ic, tail=tail)
        assert s.judge(child, parent) == (verdict == "accepted") and child["verdict"].startswith(verdict)
    no_tail = dict(ic=100.0, tail=np.nan)                 # trajectories too short for a tail: the criterion alone
    assert s.judge(dict(ic=90.0, tail=np.nan), no_tail)


def test_a_final_refit_worse_than_the_users_model_is_never_returned(monkeypatch):
    """The guard of the final refit: when the chosen structure's refit on all the estimation data
    comes back worse than the user's model (forced here: its new terms blown up by 50), the search
    keeps the user's model and says so."""
    import dataclasses

    import ceem_casadi.workflow._search as search_mod

    data = _truth_data(T=200)
    real = search_mod.refine_output_error

    def spoiled(model, d, theta, **kw):
        res = real(model, d, theta, **kw)
        if d.lengths == data.lengths and model.params.size > 2:      # the final refit of a grown model
            th = {k: (50 * np.asarray(v) if k not in ("a", "b") else v) for k, v in res.theta.items()}
            res = dataclasses.replace(res, theta=th)
        return res

    monkeypatch.setattr(search_mod, "refine_output_error", spoiled)
    res = cc.identify(_user(), data, {"a": 0.5, "b": 0.5},
                      search=SearchOptions(augmentations=("output_poly",), max_depth=1))
    user_best = min(s.objective for s in res.stages if np.isfinite(s.objective))
    assert res.model.params.size == 2 and res.search.structure == "user model"
    assert "did not reach the user's model's objective" in res.search.message
    assert res.best.objective == user_best


def test_the_search_logs_one_line_per_candidate(caplog):
    """The search reports its progress through logging (INFO, logger of workflow/_search.py): one
    line per row of its table, the root included."""
    with caplog.at_level(logging.INFO, logger="ceem_casadi.workflow._search"):
        res = cc.identify(_user(), _truth_data(T=120), {"a": 0.5, "b": 0.5}, ceem=False, calibrate=False,
                          search=SearchOptions(augmentations=("offset", "gain"), max_depth=1))
    lines = [r.getMessage() for r in caplog.records if r.name == "ceem_casadi.workflow._search"]
    assert len(lines) == len(res.search.rows) == 3
    assert [ln.split(" depth ")[1].split(":")[0] for ln in lines] == [
        "0 user model", "1 user model + offset", "1 user model + gain"]


def test_a_costly_fit_cut_by_the_time_limit_is_not_chosen_over_a_finished_one(monkeypatch):
    """The MLP output term (the better tail) is made to stop at the time limit on the heads: the search
    returns the best candidate whose fit finished (the output offset), and its message says why."""
    import dataclasses

    import ceem_casadi.workflow._search as search_mod

    data = _truth_data(T=200)
    real = search_mod.refine_output_error

    def cut(model, d, theta, **kw):
        res = real(model, d, theta, **kw)
        if any("_mlp_" in n for n in model.params.names) and d.lengths != data.lengths:
            res = dataclasses.replace(res, status=cc.Status.TIME_LIMIT)
        return res

    monkeypatch.setattr(search_mod, "refine_output_error", cut)
    res = cc.identify(_user(), data, {"a": 0.5, "b": 0.5}, ceem=False,
                      search=SearchOptions(augmentations=("offset", "mlp_output"), max_depth=1))
    rows = {r["structure"]: r for r in res.search.rows}
    assert rows["user model + mlp_output(8, sd=0.1)"]["verdict"].startswith("accepted")
    assert rows["user model + mlp_output(8, sd=0.1)"]["tail"] < rows["user model + offset"]["tail"]
    assert res.search.structure == "user model + offset" and res.search.status == "converged"
    assert "mlp_output(8, sd=0.1) has a lower tail RMS but the time limit cut its fit" in res.search.message


def test_a_slow_machine_chooses_the_same_model_unless_the_cap_hits(monkeypatch):
    """Every candidate fit runs to its iteration limit: on a slow machine (a clock that advances 1 s per
    reading, so that every fit iteration takes a few seconds) with a time limit 1.35 x the search's
    duration (the candidates stop at 3/4 of it), the search chooses the same candidate and theta as
    without a time limit; a cap below its duration stops the candidates, and the table and the message
    say so."""
    import time

    import ceem_casadi.workflow._search as search_mod

    data, clock = _truth_data(T=200), [0.0]
    opts = SearchOptions(augmentations=("offset", "output_poly", "mlp_output"), max_depth=2, max_iters=30)

    def search(limit):
        start = time.perf_counter()
        res = search_mod.structure_search(_user(), data, {"a": 0.5, "b": 0.5}, np.zeros((2, 1)), options=opts,
                                          expires=None if limit is None else start + limit)
        return res, time.perf_counter() - start

    fast, _ = search(None)
    monkeypatch.setattr(time, "perf_counter", lambda: clock.__setitem__(0, clock[0] + 1.0) or clock[0])
    _, duration = search(1e9)     # the clock is read as often as with any time limit
    slow, _ = search(1.35 * duration)
    assert len(slow.rows) == len(fast.rows) >= 5 and slow.structure == fast.structure != "user model"
    assert [r["status"] for r in slow.rows] == [r["status"] for r in fast.rows]
    np.testing.assert_array_equal(slow.model.params.to_vector(slow.theta), fast.model.params.to_vector(fast.theta))
    assert "time limit cut" not in slow.message and not slow.capped
    capped, _ = search(0.2 * duration)
    assert capped.rows[-1]["status"] == "not run" and "the time limit cut the search" in capped.message
    assert capped.capped and "the time limit cut the search" in capped.table().splitlines()[-1]


def test_a_run_whose_squares_overflow_scores_inf_without_a_warning():
    """An exploding candidate (finite errors near 1e200) is scored inf quietly, as a non-finite run is."""
    import warnings

    from ceem_casadi.workflow._search import objective_of
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert objective_of([np.array([[1e200], [np.nan]]), np.array([[1.0]])]) == np.inf
        assert objective_of([np.array([[3.0], [np.nan]]), np.array([[4.0]])]) == 12.5


def test_the_mlp_moves_weights_carry_a_gaussian_prior():
    """The MLP residual's weights are regularised (zero-mean Gaussian prior, std 0.1 in scaled units):
    on the offset + cubic-sensor record their sum of squares stays near 26, where without the prior
    (``prior_std=None``) the same fit drives it past 1e6."""
    data = _truth_data(T=200)

    def weights(prior_std):
        move = Augmentation("mlp_output", width=3, prior_std=prior_std)
        res = cc.identify(_user(), data, {"a": 0.5, "b": 0.5}, ceem=False,
                          search=SearchOptions(augmentations=(move,), max_depth=1))
        assert res.search.structure == f"user model + {move.label}"
        return sum(float(np.sum(np.square(v))) for k, v in res.search.theta.items() if "_mlp_" in k)

    assert Augmentation("mlp_state").prior_std == 0.1 and Augmentation("mlp_state", prior_std=None).label == "mlp_state(8)"
    assert weights(0.1) < 100.0 < 1e6 < weights(None)
    with pytest.raises(cc.OptionsError, match="prior_std"):
        Augmentation("mlp_output", prior_std=0.0)


def test_the_default_moves_offer_a_grid_of_prior_strengths_and_the_lowest_tail_picks_one(monkeypatch):
    """The default moves offer mlp_output / mlp_state at prior std 1, 0.1 and 0.01 (one MLP of each kind per
    path whatever its strength); the search picks the strength whose accepted candidate has the lowest tail,
    not the lowest AIC: on an offset-only record with noise 0.1 (60 samples) mlp_state(8, sd=0.01) has the
    highest AIC of the three and the lowest tail."""
    from ceem_casadi.workflow._search import _moves
    from ceem_casadi.workflow._search_options import DEFAULT_AUGMENTATIONS, STDS

    grid = [f"{k}(8, sd={sd:g})" for k in ("mlp_output", "mlp_state") for sd in (1, 0.1, 0.01)]
    assert STDS == (1, 0.1, 0.01) and [a.label for a in _moves(SearchOptions(), {"model": _user()})][-6:] == grid
    monkeypatch.setitem(TRUTH, "k", 0.0)
    monkeypatch.setitem(globals(), "SIGMA", 0.1)
    res = cc.identify(_user(), _truth_data(T=60), {"a": 0.5, "b": 0.5}, ceem=False,
                      search=SearchOptions(augmentations=[a for a in DEFAULT_AUGMENTATIONS if a.kind == "mlp_state"],
                                           max_depth=2))
    rows = [r for r in res.search.rows if r["verdict"] == "accepted"]
    assert [r["structure"] for r in res.search.rows[1:]] == [f"user model + mlp_state(8, sd={sd:g})" for sd in STDS]
    assert len(rows) == 3
    assert res.search.structure == min(rows, key=lambda r: r["tail"])["structure"] == rows[2]["structure"]
    assert min(rows, key=lambda r: r["ic"])["structure"] != res.search.structure
