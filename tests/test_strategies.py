"""Strategy objects resolved once (issue 32 item 2) and one spelling of the option names (item 5):
an acceleration is an object carrying its own settings (a name is a shorthand for its defaults),
deprecated names map onto the new ones with a DeprecationWarning, never silently."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.em import Joint, Newton, Plain, Squarem, acceleration_of

NO_COMPILE = dict(smoother=cc.SmootherOptions(compile=False), learner=cc.LearnerOptions(compile=False))


@pytest.fixture(scope="module")
def scalar():
    """x+ = a x + b u, y = x; truth a = 0.8, b = 0.5; 2 trajectories of 60 samples."""
    model = cc.StateSpaceModel.from_discrete(
        lambda x, u, p: p.a * x + p.b * u, lambda x, u, p: x, nx=1, nu=1,
        params=cc.Parameters(cc.Param("a", 0.5), cc.Param("b", 0.3)), process_std=0.1, measurement_std=0.1)
    u = np.random.default_rng(0).normal(size=(2, 60, 1))
    data, _ = cc.simulate(model, {"a": 0.8, "b": 0.5}, [[0.0]] * 2, [60] * 2, u=list(u), process_std=0.1,
                          measurement_std=0.1, seed=1)
    return model, data


def _fit(scalar, **kw):
    model, data = scalar
    return cc.ceem(model, data, {"a": 0.5, "b": 0.3}, options=cc.CEEMOptions(**NO_COMPILE, **kw))


def _trace(res):
    return [(r.kind, r.accepted, r.objective) for r in res.history]


def test_names_are_shorthands_for_the_strategy_objects():
    assert [acceleration_of(n) for n in ("none", "squarem", "newton", "joint")] == [Plain(), Squarem(), Newton(),
                                                                                    Joint()]
    assert acceleration_of(Joint(hessian="exact")).hessian == "exact"
    # stored options (a model file's JSON) keep which strategy it was, not only its settings
    from ceem_casadi.io._archive import to_jsonable
    assert to_jsonable(cc.CEEMOptions(acceleration=Joint(hessian="exact")))["acceleration"] == {
        "name": "joint", "hessian": "exact", "max_failures": 2}
    for bad in ("fast", 3, Newton):
        with pytest.raises(cc.OptionsError, match="acceleration must be one of"):
            cc.CEEMOptions(acceleration=bad)
    with pytest.raises(cc.OptionsError, match="Joint.hessian"):
        Joint(hessian="bfgs")
    with pytest.raises(cc.OptionsError, match="Newton.tries"):
        Newton(tries=0)


@pytest.mark.parametrize("name,obj", [("newton", Newton()), ("joint", Joint())])
def test_a_name_and_its_object_give_the_same_fit(scalar, name, obj):
    """Fails when ``FitPlan.of`` (em/_options.py) resolves a name to other settings than the object's."""
    by_name, by_object = _fit(scalar, acceleration=name), _fit(scalar, acceleration=obj)
    assert _trace(by_name) == _trace(by_object)
    assert any(k == name for k, _, _ in _trace(by_name))


def test_the_objects_settings_reach_the_loop(scalar):
    """``Joint(max_failures=0)`` never tries a joint solve (``_JointStepper.after``): plain EM's iterates;
    with the default it takes one after the first EM step."""
    plain = _fit(scalar, max_iters=4, tol=0.0)
    none_tried = _fit(scalar, max_iters=4, tol=0.0, acceleration=Joint(max_failures=0))
    assert _trace(none_tried) == _trace(plain)
    assert [k for k, _, _ in _trace(_fit(scalar, max_iters=2, tol=0.0, acceleration="joint"))] == ["em", "joint"]


def test_joint_hessian_is_a_deprecated_spelling_of_the_joint_object():
    with pytest.warns(DeprecationWarning, match="joint_hessian"):
        opts = cc.CEEMOptions(acceleration="joint", joint_hessian="exact")
    assert opts.acceleration == Joint(hessian="exact")
    with pytest.warns(DeprecationWarning), pytest.raises(cc.OptionsError, match="acceleration='newton'"):
        cc.CEEMOptions(acceleration="newton", joint_hessian="exact")
    with pytest.warns(DeprecationWarning), pytest.raises(cc.OptionsError, match="contradicts"):
        cc.CEEMOptions(acceleration=Joint(hessian="gauss-newton"), joint_hessian="exact")


def test_removed_blas_threads_is_never_ignored():
    """``CEEMOptions.blas_threads`` was removed (a fit always runs BLAS with one thread, measured): 1 maps with a
    warning, another value is refused with the reason, also from a config file. Fails without ``_blas_threads``
    in em/_options.py (the keyword then raises TypeError)."""
    with pytest.warns(DeprecationWarning, match="one thread"):
        assert cc.CEEMOptions(blas_threads=1) == cc.CEEMOptions()
    for bad in (None, 2):
        with pytest.warns(DeprecationWarning), pytest.raises(cc.OptionsError, match="1.7-4.4x slower"):
            cc.CEEMOptions(blas_threads=bad)
    with pytest.warns(DeprecationWarning), pytest.raises(cc.OptionsError, match="leave blas_threads out"):
        cc.CEEMOptions.from_mapping({"blas_threads": None})


def test_a_fit_runs_blas_with_one_thread(scalar):
    """Fails when ``blas_threads(1)`` around the fit in em/_ceem.py::ceem is removed (on a machine whose BLAS
    has more than one thread by default)."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas") < 2:
        pytest.skip("BLAS has one thread here anyway")
    seen = []
    model, data = scalar
    cc.ceem(model, data, {"a": 0.5, "b": 0.3}, options=cc.CEEMOptions(max_iters=2, **NO_COMPILE),
            callback=lambda rec: seen.extend(i["num_threads"] for i in threadpoolctl.threadpool_info()
                                             if i["user_api"] == "blas"))
    assert seen and set(seen) == {1}


@pytest.mark.parametrize("cls", [cc.SmootherOptions, cc.LearnerOptions])
def test_max_iter_is_a_deprecated_alias_of_max_iters(cls):
    """Fails when ``renamed`` (runtime/_schema.py) drops the old keyword or stops warning."""
    with pytest.warns(DeprecationWarning, match=r"max_iter=\.\.\.\) is deprecated: use max_iters="):
        opts = cls(max_iter=7)
    assert opts.max_iters == 7
    with pytest.warns(DeprecationWarning, match="use .max_iters"):
        assert opts.max_iter == 7
    with pytest.warns(DeprecationWarning), pytest.raises(cc.OptionsError, match="not both|give max_iters= only"):
        cls(max_iter=7, max_iters=8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cls(max_iters=9).max_iters == 9          # the new name warns nothing


def test_max_iter_in_a_config_file_maps_with_a_warning():
    with pytest.warns(DeprecationWarning, match="smoother.max_iter' is deprecated"):
        opts = cc.CEEMOptions.from_mapping({"smoother": {"max_iter": 11}, "learner": {"max_iters": 12}})
    assert (opts.smoother.max_iters, opts.learner.max_iters) == (11, 12)


def test_adam_options_as_the_learner_strategy(scalar):
    """``CEEMOptions(learner=AdamOptions(...))``: the factory builds an AdamLearner (``learner_for``),
    whose fit lands near the IPOPT learner's."""
    from ceem_casadi.learning import AdamLearner, AdamOptions, learner_for

    model, data = scalar
    assert isinstance(learner_for(model, data.lengths, AdamOptions()), AdamLearner)
    ipopt = _fit(scalar)
    adam = cc.ceem(model, data, {"a": 0.5, "b": 0.3}, options=cc.CEEMOptions(
        smoother=cc.SmootherOptions(compile=False), learner=AdamOptions(lr=2e-2, epochs=20, batch_size=16),
        max_iters=30))
    assert {r.learn_status for r in adam.history} <= {"Solve_Succeeded", "Search_Direction_Becomes_Too_Small"}
    for k in ("a", "b"):
        assert abs(float(adam.theta[k]) - float(ipopt.theta[k])) < 0.03, (k, adam.theta, ipopt.theta)
    with pytest.raises(cc.OptionsError, match="LearnerOptions or an AdamOptions"):
        cc.CEEMOptions(learner=cc.SmootherOptions())


def test_one_adam_options_class_refuses_the_other_users_fields():
    from ceem_casadi.learning import AdamLearnerOptions, AdamOptions
    from ceem_casadi.model._nn import adam

    with pytest.raises(cc.OptionsError, match="rho_theta=0.5 are options of the learning step"):
        adam(lambda B: None, np.zeros(1), (np.zeros((1, 4)),), options=AdamOptions(rho_theta=0.5))
    with pytest.warns(DeprecationWarning, match="AdamLearnerOptions is deprecated"):
        old = AdamLearnerOptions(lr_observation=2e-3, epochs=3)
    assert old == AdamOptions(lr=2e-3, lr_dynamics=5e-4, epochs=3)   # the old defaults kept
    assert AdamOptions().schedule(20, 0.1) == (20, 0.1) and AdamOptions(epochs=2, decay=0.0).schedule(20, 0.1) == (2, 0)


def test_the_floors_never_read_the_options_bag():
    """The engines, learners, smoothing, warm start and joint steps receive their own strategy objects:
    no code there reads a CEEMOptions field (``options.learner``, ``options.smoother``, ``.executor``,
    ``.warm_start``, ``.acceleration``, ``.n_jobs``) off an options object (fails when e.g.
    ``DaskEngine`` takes the whole CEEMOptions again)."""
    import ast
    from pathlib import Path

    pkg = Path(cc.__file__).parent
    floors = [*(pkg / "distributed").glob("*.py"), *(pkg / "learning").glob("*.py"), *(pkg / "smoothing").glob("*.py"),
              *(pkg / "em").glob("_joint_*.py"), pkg / "em" / "_warm_start.py", pkg / "em" / "_smoothing_step.py"]
    bag = {"learner", "smoother", "executor", "warm_start", "acceleration", "n_jobs"}
    found = []
    for path in floors:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in bag and isinstance(node.value, ast.Name)
                    and node.value.id in ("options", "opts")):
                found.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
    assert not found, found
