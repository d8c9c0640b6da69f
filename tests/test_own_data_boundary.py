"""The own-data boundary (identify, refine_output_error, compare_structures, the search's candidates): data
or structures that cannot fit together are refused before any fit, with one line naming what was given."""
import casadi as ca
import numpy as np
import pytest

import ceem_casadi as cc
from ceem_casadi.workflow import Augmentation


def scalar(nu=1, ny=1, dt=None, cubic=False):
    """x+ = a x + u0 (+ b x^3), y = x (or (x, x) with ny=2)."""
    params = cc.Parameters(cc.Param("a", 0.5), *([cc.Param("b", 0.0)] if cubic else []))
    return cc.StateSpaceModel.from_discrete(
        lambda x, u, p: p.a * x + u[0] + (p.b * x ** 3 if cubic else 0),
        (lambda x, u, p: x) if ny == 1 else (lambda x, u, p: ca.vertcat(x, 2 * x)), nx=1, nu=nu,
        params=params, process_std=0.1, measurement_std=0.1, dt=dt)


@pytest.fixture(scope="module")
def data():
    model = scalar(dt=0.1)
    u = np.random.default_rng(0).normal(size=(80, 1))
    return cc.simulate(model, {"a": 0.8}, [0.0], 80, u=u, process_std=0.1, measurement_std=0.1, seed=1)[0]


@pytest.mark.parametrize("fit", [
    lambda m, d: cc.identify(m, d, {"a": 0.5}, ceem=False),
    lambda m, d: cc.refine_output_error(m, d, {"a": 0.5}),
    lambda m, d: cc.compare_structures({"mine": (m, None)}, d),
], ids=["identify", "refine_output_error", "compare_structures"])
def test_data_sampled_at_another_dt_than_the_models_is_refused(data, fit):
    model = scalar(dt=0.1)
    slow = cc.Trajectories(data.y, data.u, dt=0.5)   # the same samples declared 0.5 s apart
    with pytest.raises(cc.ShapeError, match=r"data has dt=0\.5 s, the model steps dt=0\.1 s"):
        fit(model, slow)
    same = cc.Trajectories(data.y, data.u, dt=0.3 / 3)   # 0.09999999999999999: the same sample time
    assert fit(model, same) is not None
    assert fit(scalar(dt=None), slow) is not None   # a model without dt takes any
    assert fit(scalar(dt=0.1 * (1 + 5e-7)), data) is not None   # within the time columns' 1e-6 (io/_readers.py)
    with pytest.raises(cc.ShapeError, match=r"data has dt=0\.1 s, the model steps dt=0\.100001 s"):
        fit(scalar(dt=0.100001), data)


CANDIDATES = [
    (lambda: ("wide", scalar(nu=2), None), cc.ShapeError, "candidate 'wide': data has nu=1 input columns, the model "
     "expects nu=2"),
    (lambda: ("tall", scalar(ny=2), None), cc.ShapeError, "candidate 'tall': data has ny=1 output columns"),
    (lambda: ("cubic", scalar(cubic=True), {"c": 1.0}), cc.ParameterError, r"candidate 'cubic': unknown parameter "
     r"name\(s\) \['c'\]"),
]


@pytest.mark.parametrize("make, error, message", CANDIDATES, ids=["nu", "ny", "theta"])
def test_a_candidate_structure_that_cannot_fit_the_data_is_refused_before_any_stage_runs(data, make, error, message,
                                                                                        monkeypatch):
    model = scalar(dt=0.1)
    name, cand, theta = make()
    ran = []
    monkeypatch.setattr(cc.workflow._identify.Stages, "start", lambda *a: ran.append(a))
    with pytest.raises(error, match=message):
        cc.identify(model, data, {"a": 0.5}, ceem=False, search=[(name, cand, theta), "offset"])
    assert not ran   # refused at the boundary, not after the stages' fits (nor as a row "solver_failed")
    with pytest.raises(error, match=message):
        cc.compare_structures({"mine": (model, None), name: (cand, theta)}, data)


def test_compare_structures_refuses_data_that_are_not_trajectories(data):
    with pytest.raises(TypeError, match="data must be a Trajectories"):
        cc.compare_structures({"mine": (scalar(), None)}, (data.y, data.u))


@pytest.mark.parametrize("seed", [None, -1, 1.5, "1"])
def test_the_seed_of_seeded_starts_is_checked_at_the_boundary(data, seed):
    """starts=n with seed None raised a bare TypeError from int(), -1 a ValueError from numpy."""
    with pytest.raises(cc.ShapeError, match=f"seed: expected an integer >= 0, got {seed!r}"):
        cc.identify(scalar(dt=0.1), data, {"a": 0.5}, ceem=False, starts=2, seed=seed)


def test_seeded_starts_repeat_and_the_table_names_the_start_that_won(data):
    model = scalar(dt=0.1)
    runs = [cc.identify(model, data, {"a": 0.5}, ceem=False, starts=3, seed=s) for s in (4, 4)]
    assert runs[0].theta["a"] == runs[1].theta["a"] and runs[0].best.message == runs[1].best.message
    assert runs[0].best.message.startswith(("start 0 of 4 won", "start 1 of 4 won", "start 2 of 4 won",
                                            "start 3 of 4 won"))
    assert abs(float(runs[0].theta["a"]) - 0.8) < 0.03
    assert runs[0].best.message.split("; ")[0] in runs[0].table()   # issue 31 item 2: the table says which won


def noise_scaled(sd, cubic=False):
    """`scalar` with measurement_std ``sd``."""
    params = cc.Parameters(cc.Param("a", 0.5), *([cc.Param("b", 0.0)] if cubic else []))
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u + (p.b * x ** 3 if cubic else 0),
                                            lambda x, u, p: x, nx=1, nu=1, params=params, measurement_std=sd)


def test_a_candidates_own_noise_level_does_not_score_it():
    """The user's model itself with measurement_std 1 instead of 0.1 scored its errors 10x smaller: AIC -766
    against -29.6, so the search 'accepted' it and compare_structures chose a useless cubic term (AIC -1879
    against -38.4 with sd 10). Every structure is now scored with one weighting (search: the user's model's;
    compare_structures: the first candidate's). Fails without ``self.iv`` in `SearchState.score` / without
    ``noise.inv_measurement_std`` in `_structures._score_candidate`."""
    model = noise_scaled(0.1)
    u = np.random.default_rng(0).normal(size=(200, 1))
    y = cc.simulate_output(model, {"a": 0.8}, u, np.zeros(1)) + 0.1 * np.random.default_rng(1).normal(size=(200, 1))
    data = cc.Trajectories([y], [u])
    res = cc.identify(model, data, {"a": 0.5}, ceem=False, search=[("mine, sd 1", noise_scaled(1.0), None),
                                                                   ("cubic, sd 1", noise_scaled(1.0, True), None)])
    root, same, cubic = res.search.rows
    assert same["ic"] == pytest.approx(root["ic"], rel=1e-6) and cubic["verdict"].startswith("rejected: AIC"), \
        res.search.table()
    assert res.best.objective == pytest.approx(res.stages[1].objective, rel=1e-6)   # the user's weights: ~ 80, not 0.8
    cmp = cc.compare_structures({"linear": (model, None), "cubic, sd 10": (noise_scaled(10.0, True), None)}, data)
    assert cmp.best == "linear", cmp.table()
    assert cmp.rows[1]["criterion"] - cmp.rows[0]["criterion"] == pytest.approx(2.0, abs=0.5)   # 2 k, k + 1


@pytest.mark.parametrize("seed", [-1, None, 1.5])
def test_an_augmentation_seed_is_checked_when_the_move_is_made(seed):
    """Augmentation('mlp_output', seed=-1) was accepted and raised numpy's ValueError from inside the search, after
    the stages' fits (None: a TypeError). Fails without ("seed", 0) in `Augmentation.__post_init__`."""
    with pytest.raises(cc.OptionsError, match=f"seed must be an int >= 0, got {seed!r}"):
        cc.workflow.Augmentation("mlp_output", seed=seed)


def test_integer_options_of_the_search_take_numpy_integers():
    """max_depth=np.int64(2) (from np.arange) was refused as 'must be an int >= 1, got np.int64(2)'."""
    opts = cc.workflow.SearchOptions(augmentations=(cc.workflow.Augmentation("nl_width", width=np.int64(4)),),
                                     max_depth=np.int64(2), beam=np.int64(1), max_iters=np.int64(50))
    assert opts.max_depth == 2 and opts.augmentations[0].label == "nl_width(+4)"
    with pytest.raises(cc.OptionsError, match="max_depth must be an int >= 1, got True"):
        cc.workflow.SearchOptions(max_depth=True)


def test_split_refuses_held_out_tails_that_observe_nothing(data):
    """A record whose last 30 % is missing (a sensor dropout): every candidate's split score was NaN (with numpy's
    'Mean of empty slice'), and the NaN sort made the first candidate, here the wrong one, `best`. Fails without the
    ``require(any(...))`` on the tails in `compare_structures`."""
    y = data.y[0].copy()
    y[56:] = np.nan
    gap = cc.Trajectories([y], data.u, dt=0.1)
    cands = {"wrong": (scalar(dt=0.1), {"a": -0.5}), "right": (scalar(dt=0.1), {"a": 0.8})}
    with pytest.raises(cc.OptionsError, match=r"criterion='split': the held-out tails \(the last 0.3 of every "):
        cc.compare_structures(cands, gap, criterion="split", options=cc.OutputErrorOptions(max_iters=1))
    assert cc.compare_structures(cands, gap, criterion="split", holdout=0.5,
                                 options=cc.OutputErrorOptions(max_iters=1)).best == "right"


def offset_model(offset=False, gain=False):
    """`noise_scaled(0.1)`, with a free output offset ``c`` when ``offset`` and an input gain ``b`` when ``gain``."""
    params = cc.Parameters(cc.Param("a", 0.5), *([cc.Param("b", 1.0)] if gain else []),
                           *([cc.Param("c", 0.0)] if offset else []))
    return cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + (p.b if gain else 1) * u,
                                            lambda x, u, p: x + (p.c if offset else 0), nx=1, nu=1, params=params,
                                            measurement_std=0.1)


def test_the_search_table_stars_the_one_row_it_returns():
    """Rows were starred by label: the candidate 'mine' grown by the offset move is labelled 'mine + offset' like the
    user's candidate of that name, and both rows were starred; a candidate named 'user model' starred the root too.
    Fails without ``"chosen": r is mark`` in `_search._final`; the names are checked in `SearchOptions`."""
    model = offset_model()
    u = np.random.default_rng(0).normal(size=(200, 1))
    y = cc.simulate_output(offset_model(True, True), {"a": 0.8, "b": 1.5, "c": 0.5}, u, np.zeros(1))
    data = cc.Trajectories([y + 0.1 * np.random.default_rng(1).normal(size=y.shape)], [u])
    cands = (("mine", offset_model(gain=True), None), ("mine + offset", offset_model(True, True), None))
    res = cc.identify(model, data, {"a": 0.5}, ceem=False, search=cc.workflow.SearchOptions(
        augmentations=("offset",), candidates=cands, beam=3, max_depth=2))
    starred = [r["structure"] for r in res.search.rows if r["chosen"]]
    assert starred == [res.search.structure] and res.search.structure.startswith("mine + offset"), \
        res.search.table()
    assert abs(float(res.theta["b"]) - 1.5) < 0.05, res.search.table()
    for names in (["user model"], ["a", "a"]):
        with pytest.raises(cc.OptionsError, match="expected distinct names that do not begin with 'user model'"):
            cc.workflow.SearchOptions(candidates=[(n, model, None) for n in names])


@pytest.mark.parametrize("kw", [dict(options=cc.OutputErrorOptions(time_limit=5.0)),
                                dict(ceem_options=cc.CEEMOptions(time_limit=5.0)),
                                dict(options={"time_limit": 5.0}, time_limit=60)])
def test_a_stage_time_limit_given_in_the_options_is_refused_not_dropped(data, kw):
    """identify sets every stage's time_limit from its own budget: options=OutputErrorOptions(time_limit=5) was
    replaced by None (no limit at all) without a word. Fails without the ``require`` on the options' time_limit."""
    with pytest.raises(cc.OptionsError, match="their time_limit is set from identify's time_limit="):
        cc.identify(scalar(dt=0.1), data, {"a": 0.5}, **kw)


@pytest.mark.parametrize("kw, message", [
    (dict(options={"x_lower": [0.0, 0.0]}), r"x_lower: expected a scalar or 1 entries, got shape \(2,\)"),
    (dict(options={"x0_window": 1000}), r"window: expected an integer in \[1, 80\], got 1000"),
    (dict(ceem=True, ceem_options={"smoother": {"x_lower": [0.0, 0.0]}}), r"x_lower: expected a number or a list of "
     r"nx = 1 numbers"),
])
def test_an_option_that_does_not_fit_the_model_or_data_raises_instead_of_failing_every_stage(data, kw, message):
    """options={'x_lower': [0, 0]} for nx = 1 made every output-error stage a 'solver_failed' row advising 'try
    starts=n, a theta0 closer to the data', and identify returned CE-EM's fit as if all was well. Only failures of
    a start or a solver are stage rows now; fails with ``except CeemError`` back in `Stages.output_error`."""
    with pytest.raises((cc.ShapeError, cc.OptionsError), match=message):
        cc.identify(scalar(dt=0.1), data, {"a": 0.5}, **kw)


def test_a_data_column_given_as_both_an_output_and_an_input_is_refused(data, tmp_path):
    """read_trajectories(outputs=['y0'], inputs=['y0']) read the output as the input too and the fit 'explained' y
    by itself; a column named twice among the outputs of a 2-output model was read twice. Fails without the
    repeated-column check in `io._readers._read_columns`."""
    import pandas as pd

    path = tmp_path / "run.csv"
    pd.DataFrame({"t": 0.1 * np.arange(80), "y0": data.y[0][:, 0], "u0": data.u[0][:, 0]}).to_csv(path, index=False)
    with pytest.raises(cc.io.DataFileError, match=r"a column is given twice among the outputs \['y0'\] and the "
                                                  r"inputs \['y0'\]"):
        cc.read_trajectories(path, scalar(dt=0.1), outputs=["y0"], inputs=["y0"])
    with pytest.raises(cc.io.DataFileError, match="a column is given twice"):
        cc.read_trajectories(path, scalar(ny=2, dt=0.1), outputs=["y0", "y0"])
    assert cc.read_trajectories(path, scalar(dt=0.1)).lengths == (80,)


def test_a_trajectory_whose_head_observes_nothing_stops_the_search_before_the_stages(data, monkeypatch):
    """A trajectory observed only in its last 15 %: the stages ran, then the search's head fit raised 'trajectory 1:
    every output is missing' about data that has outputs. Fails without the empty-head check in `SearchState.__init__`
    (or without identify building its `SearchState` before the stages)."""
    y = data.y[0].copy()
    y[:68] = np.nan
    late = cc.Trajectories([data.y[0], y], [data.u[0], data.u[0]], dt=0.1)
    ran = []
    monkeypatch.setattr(cc.workflow._identify.Stages, "start", lambda *a: ran.append(a))
    with pytest.raises(cc.errors.DataError, match="search: trajectory 1 observes no output in its first 64 samples, the head"):
        cc.identify(scalar(dt=0.1), late, {"a": 0.5}, ceem=False, options={"x0_window": 80}, search=["offset"])
    assert not ran


@pytest.mark.parametrize("make, error, says", [
    (lambda: cc.Trajectories([np.zeros((5, 1))], dt="0.1"), cc.ShapeError, "dt must be a positive sample time"),
    (lambda: cc.Trajectories([np.zeros((5, 1))], dt=True), cc.ShapeError, "dt must be a positive sample time"),
    (lambda: cc.Trajectories([np.zeros((1, 50))]), cc.ShapeError, r"rows of a \(T, ny\) array\), got \(1, 50\)"),
    (lambda: Augmentation("mlp_state", prior_std=True), cc.OptionsError, "prior_std must be None or > 0"),
    (lambda: scalar(dt="0.1"), cc.ShapeError, "dt must be a positive sample time"),      # the model's dt too:
    (lambda: scalar(dt=-1), cc.ShapeError, "dt must be a positive sample time"),         # one check, `sample_time`
    (lambda: cc.StateSpaceModel.from_ode(lambda x, u, p: -x, lambda x, u, p: x, nx=1, dt=None), cc.ShapeError,
     "dt must be a positive sample time")])
def test_small_boundary_gaps_raise_one_line_that_names_the_value(make, error, says):
    """dt given as text raised numpy's TypeError, dt=True was taken as 1 s, a transposed (ny, T) record said only
    'at least 2 time steps, got 1', prior_std=True was taken as 1; a model took dt='0.1' or -1. Fails without
    `sample_time` in Trajectories / StateSpaceModel, `is_number` in Augmentation, or the shape in the message."""
    with pytest.raises(error, match=says):
        make()
