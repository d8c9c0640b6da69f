"""The small private helpers of the runtime, the EM plan and the batched Newton smoother: these were the
doctests of their docstrings (issue 32: private docstrings keep 1-3 lines; the checks live here)."""
from __future__ import annotations

import pathlib
import time
import warnings

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.em._options import FitPlan
from ceem_casadi.errors import ShapeError
from ceem_casadi.runtime._atomic import atomic_path, atomic_write_text
from ceem_casadi.runtime._best import BestIterate, checked_status
from ceem_casadi.runtime._cache_guard import safe_name
from ceem_casadi.runtime._checks import check_argument_order, count, is_integer, noise_level
from ceem_casadi.runtime._compile import unit_name
from ceem_casadi.runtime._model_cache import structure_key
from ceem_casadi.runtime._schema import field_kinds
from ceem_casadi.runtime._solve import (
    TimeLimitReached,
    budget,
    check_deadline,
    current_deadline,
    deadline,
    deadline_after,
    expired,
)
from ceem_casadi.runtime._status import Status
from ceem_casadi.smoothing._banded import BandedNewton
from ceem_casadi.smoothing._batched_newton import solve_many, stacked_directions


def test_safe_name_makes_c_identifiers():
    assert (safe_name("ceem_--"), safe_name("__"), safe_name("9 lives")) == ("ceem", "m", "m9_lives")


def test_unit_name_is_bounded():
    assert unit_name("ceem_lin", "obs_cost") == "ceem_lin_obs_cost"
    assert len(unit_name("ceem_" + "m" * 250, "obs_cost")) == 100


def _scalar_model():
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
                                            params=cc.Parameters(cc.Param("a", 0.5)))


def test_structure_key_of_two_models_traced_alike_is_equal():
    assert structure_key(_scalar_model()) == structure_key(_scalar_model())


def test_checked_status_refuses_an_exploding_convergence():
    assert checked_status(Status.CONVERGED, 3.8e17, reference=12.0)[0] == Status.STALLED
    assert checked_status(Status.CONVERGED, 11.0, reference=12.0) == (Status.CONVERGED, "")


def test_best_iterate_returns_the_best_seen():
    best = BestIterate(np.zeros(2), 10.0)
    assert best.offer(np.ones(2), 3.0, label="iteration 1")
    assert not best.offer(np.full(2, 2.0), 5.0, label="iteration 2")
    x, f, msg = best.choose(np.full(2, 9.0), 1e9, label="the final iterate")
    assert (f, msg) == (3.0, "returning the best iterate seen (iteration 1, cost 3 < 1e+09 of the final iterate)")
    np.testing.assert_array_equal(x, np.ones(2))


def test_deadlines_nest_and_expire():
    outer = time.perf_counter() + 1.0
    with deadline(outer):
        assert deadline_after(1000.0) == outer and deadline_after(None) == outer
    with deadline(time.perf_counter() - 1.0):
        assert expired()
        with pytest.raises(TimeLimitReached, match="time limit reached during the initial states"):
            check_deadline("the initial states")
    assert current_deadline() is None
    assert budget(0.5) is None


def test_atomic_writes(tmp_path: pathlib.Path):
    target = tmp_path / "sub" / "table.csv"
    with atomic_path(target) as tmp:
        tmp.write_text("a,b\n1,2\n")
    assert target.read_text() == "a,b\n1,2\n"
    assert atomic_write_text(tmp_path / "m.json", "{}").read_text() == "{}"


def test_scalar_checks():
    assert (count(3, "k"), count(2.0, "k")) == (3, 2)
    with pytest.raises(ShapeError, match=r"window: expected an integer >= 1, got nan"):
        count(float("nan"), "window")
    np.testing.assert_array_equal(noise_level(0.1, "process_std", 2), [0.1, 0.1])
    assert (is_integer(3), is_integer(float("inf")), is_integer(True)) == (True, False, False)


def test_the_old_argument_order_is_named():
    with pytest.raises(TypeError, match=r"theta: got an array of shape \(50, 1\), which looks like data; the "
                                        r"arguments are \(model, data, theta\)"):
        check_argument_order(theta=np.zeros((50, 1)), n_params=2)
    with pytest.raises(TypeError, match=r"data: got a dict of parameters \('a'\); the arguments are"):
        check_argument_order(data={"a": 0.5})


def test_a_renamed_option_warns_and_maps():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        opts = cc.SmootherOptions(max_iter=7)
    assert opts.max_iters == 7 and caught[0].category is DeprecationWarning


def test_field_kinds_from_annotations():
    kinds = field_kinds(cc.SmootherOptions)
    assert (kinds["max_iters"].expected, kinds["chunk"].expected, kinds["x_lower"].expected) == \
        ("an integer", "None or an integer", "None or a number or a list of numbers")


def test_fit_plan_resolves_the_acceleration_name():
    assert repr(FitPlan.of(cc.CEEMOptions(acceleration="joint")).acceleration) == "Joint(hessian='auto', max_failures=2)"


def test_stacked_directions_solve_each_system():
    nz = np.tile([0.0, 2.0], (3, 1))  # nx = 1, T = 3: H = 2 I (no coupling)
    out = stacked_directions([(nz, np.zeros(1), np.ones(3), 0.0)] * 2, 1, 3)
    np.testing.assert_allclose(out, np.full((2, 3), -0.5), rtol=0, atol=1e-12)


def test_solve_many_solves_separate_quadratics():
    class Quadratic:  # f_b(x) = sum (x - b)^2 over T = 4 scalar blocks
        def cost_many(self, idx, xs):
            return [float(np.sum((x - b) ** 2)) for b, x in zip(idx, xs)]

        def newton_many(self, idx, xs):
            nz = np.tile([0.0, 2.0], (4, 1))
            return [(c, 2 * (x - b), nz, np.zeros(1)) for c, b, x in zip(self.cost_many(idx, xs), idx, xs)]

    out = solve_many(BandedNewton(1, 4, 10, 1e-10), [np.zeros(4)] * 3, Quadratic())
    assert (out[2].status, out[2].iterations) == ("Solve_Succeeded", 1)
    np.testing.assert_allclose(out[2].x, np.full(4, 2.0), rtol=0, atol=1e-12)
