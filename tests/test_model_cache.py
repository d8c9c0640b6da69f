"""The library's cache of compiled models (runtime/_model_cache.py, issue 32 item 1): keyed by the
model's structure, bounded, clearable, safe under threads, and never written into the model."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.runtime import _model_cache as mc
from models import lorenz

ROOT = Path(__file__).resolve().parents[1]


def _scalar(a=0.5, measurement_std=0.1):
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
                                            params=cc.Parameters(cc.Param("a", a)), process_std=0.1,
                                            measurement_std=measurement_std)


def _threads(n, repeats, what):
    """tests/_threads_one_model.py in a subprocess: (return code, its JSON report or None)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "_threads_one_model.py"), str(n), str(repeats), what],
                          capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr[-2000:]


def test_two_threads_estimating_initial_states_on_one_model_do_not_crash():
    # before the cache: 2 threads x 5 calls crashed the process (double free / segfault), every run
    rc, report, err = _threads(2, 5, "x0")
    assert rc == 0, f"the process died (return code {rc}): {err}"
    assert report["errors"] == [] and report["results"] == 10
    assert report["max_diff"] == 0.0  # bitwise the sequential estimates


@pytest.mark.parametrize("n_threads", [2, 4])
def test_threads_on_one_model_object_give_the_sequential_results(n_threads):
    # estimate_initial_state, refine_output_error (LM and IPOPT) and ceem at once on ONE model
    rc, report, err = _threads(n_threads, 1, "x0,lm,ipopt,ceem")
    assert rc == 0, f"the process died (return code {rc}): {err}"
    assert report["errors"] == [] and report["results"] == 4 * n_threads
    assert report["max_diff"] == 0.0


def test_equal_structures_share_entries_and_noise_copies_share_solvers():
    m1, m2 = lorenz.single_lorenz(), lorenz.single_lorenz()
    assert mc.structure_key(m1) == mc.structure_key(m2)
    assert cc.model.rollout(m1, 17) is cc.model.rollout(m2, 17)
    assert mc.structure_key(m1.with_noise(measurement_std=3.0)) == mc.structure_key(m1)
    # another parameter declaration, another function, another name: another structure
    other = cc.StateSpaceModel.from_ode(lorenz.lorenz_rhs, lambda x, u, p: lorenz.C_SINGLE @ x, nx=3, dt=lorenz.DT,
                                        params=cc.Parameters(cc.Param("sigma", 10.0), cc.Param("rho", 28.0, free=False),
                                                             cc.Param("beta", 8 / 3)))
    assert mc.structure_key(other) != mc.structure_key(m1)
    assert mc.structure_key(_scalar()) != mc.structure_key(lorenz.single_lorenz(dt=0.02))


def test_a_build_that_bakes_the_noise_in_is_not_shared_across_noise_settings():
    # the design information weights the sensitivities by 1 / measurement_std inside the Function
    from ceem_casadi.workflow import fisher_information
    model = _scalar(measurement_std=0.1)
    u = np.sin(0.3 * np.arange(30))[:, None]
    info = fisher_information(model, {"a": 0.8}, u, x0=np.ones(1))
    info2 = fisher_information(model.with_noise(measurement_std=0.2), {"a": 0.8}, u, x0=np.ones(1))
    np.testing.assert_allclose(info2, info / 4, rtol=1e-12)


def test_cache_is_bounded_and_clearable(monkeypatch):
    monkeypatch.setattr(mc, "MAXSIZE", 3)
    cc.runtime.clear_model_cache()
    model = _scalar()
    first = cc.model.rollout(model, 2)
    for T in (3, 4, 5):
        cc.model.rollout(model, T)
    assert cc.model.rollout(model, 2) is not first  # the least recently used (T = 2) went
    assert cc.runtime.clear_model_cache() == 3       # at most MAXSIZE entries
    assert cc.runtime.clear_model_cache() == 0


def test_an_entry_is_built_once_while_threads_wait_and_stateful_ones_per_thread():
    model, builds, barrier = _scalar(), [], threading.Barrier(6)
    got, per_thread = [], []

    def build():
        builds.append(1)
        return object()

    def work():
        barrier.wait()
        got.append(mc.cached(model, "test-shared", 1, build))
        per_thread.append((threading.get_ident(), mc.cached(model, "test-own", 1, object, per_thread=True)))
        assert mc.cached(model, "test-own", 1, object, per_thread=True) is per_thread[-1][1]

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and all(g is got[0] for g in got)
    assert len({id(obj) for _, obj in per_thread}) == len({ident for ident, _ in per_thread}) == 6


def test_no_public_function_adds_attributes_to_the_model(tmp_path):
    model = _scalar()
    theta = {"a": 0.8}
    before = dict(vars(model))
    u = np.sin(0.3 * np.arange(40))[:, None]
    data, _ = cc.simulate(model, theta, [1.0], 40, u=u, seed=0)
    cc.simulate_output(model, theta, u, np.ones(1))
    cc.model.rollout(model, 10)
    cc.estimate_initial_state(model, data, theta)
    cc.refine_output_error(model, data, {"a": 0.6})
    cc.refine_output_error(model, data, {"a": 0.6}, shooting=10)
    cc.refine_output_error(model, data, {"a": 0.6}, options=cc.OutputErrorOptions(solver="ipopt"))
    cc.ceem(model, data, {"a": 0.6}, options=cc.CEEMOptions(max_iters=3))
    cc.identify(model, data, {"a": 0.6}, calibrate=False)
    cc.calibrate_noise(model, data, {"a": 0.6}, grid=[0.05, 0.1])
    cc.parameter_uncertainty(model, data, theta)
    cc.validation_report(model, data, theta)
    cc.design_input(model, theta, 20, u_bounds=(-1.0, 1.0), starts=1, x0=np.ones(1))
    cc.workflow.fisher_information(model, theta, u, x0=np.ones(1))
    cc.export_casadi(model, theta, tmp_path / "export")
    cc.save_model(tmp_path / "m.npz", model, theta)
    cc.filtering.EKF(model).run(model.theta_vector(theta), data.y[0], data.u[0], x0=np.ones(1), Sigma0=1.0,
                                Q=0.01, R=0.01)
    after = vars(model)
    assert after.keys() == before.keys(), f"added: {sorted(set(after) - set(before))}"
    assert all(after[k] is before[k] for k in before)
    assert model.__dict__ is vars(model) and model.__dict__.keys() == before.keys()


def test_the_memoised_key_follows_the_model_when_its_functions_change():
    model, other = _scalar(), cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x - u, lambda x, u, p: x, nx=1,
                                                               nu=1, params=cc.Parameters(cc.Param("a", 0.5)))
    key = mc.structure_key(model)
    assert mc.structure_key(model) == key and mc.structure_key(other) != key
    model.f = other.f  # the step replaced in place: another structure, another key
    assert mc.structure_key(model) == mc.structure_key(other)
    assert cc.model.rollout(model, 7) is cc.model.rollout(other, 7)
