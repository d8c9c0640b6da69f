"""Options and result of the structure search ([`identify`][ceem_casadi.identify]'s ``search=``)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..runtime._checks import is_integer
from ..runtime._result import Result
from ..runtime._schema import renamed, require
from ._augment import Augmentation

__all__ = ["DEFAULT_AUGMENTATIONS", "SearchOptions", "SearchResult", "search_options"]

#: the moves tried from every node by default (`ceem_casadi.workflow._augment`); the MLP moves at the prior stds
#: `STDS`, a decade grid around weights O(1) in scaled units: the search's rule picks one (docs/own_data.md)
STDS = (1, 0.1, 0.01)
DEFAULT_AUGMENTATIONS = (Augmentation("poly_degree", degree=4), Augmentation("offset"), Augmentation("gain"),
                         Augmentation("output_poly", degree=3), Augmentation("input_poly", degree=3),
                         Augmentation("state_output"), Augmentation("lowpass_output"), Augmentation("lowpass_input"),
                         Augmentation("order"), Augmentation("nl_width", width=8),
                         *(Augmentation(k, width=8, prior_std=sd) for k in ("mlp_output", "mlp_state") for sd in STDS))


@renamed(max_iter="max_iters")
@dataclass(frozen=True)
class SearchOptions:
    """Options of the structure search of [`identify`][ceem_casadi.identify] (``search=``).

    Its time, samples and log lines: docs/own_data.md ("How the search decides").

    Parameters
    ----------
    augmentations : tuple of Augmentation or str
        The moves tried from every node, in this order (default `DEFAULT_AUGMENTATIONS`, the table of
        docs/own_data.md); a str is ``Augmentation(kind)``.
    candidates : tuple of (name, model, theta)
        Structures of your own, fitted from ``theta`` (``None``: the model's initial values) and
        judged by the same rule at depth 1 (then grown like the others).
    criterion : str
        ``"aic"`` (``N ln(mse) + 2 k``) or ``"bic"`` (``N ln(mse) + k ln N``) of the fit on the heads.
    holdout : float
        Fraction of every estimation trajectory held back as its tail (0 < holdout < 1).
    max_depth : int
        Augmentations stacked at most.
    beam : int
        Nodes expanded per depth (1: greedy).
    max_iters : int
        Iteration limit of every candidate fit.

    Examples
    --------
    >>> import ceem_casadi as cc
    >>> opts = cc.workflow.SearchOptions(augmentations=("offset", "output_poly"), max_depth=2)
    >>> [a.label for a in opts.augmentations], opts.criterion
    (['offset', 'output_poly(3)'], 'aic')
    """

    augmentations: tuple = DEFAULT_AUGMENTATIONS
    candidates: tuple = ()
    criterion: str = "aic"
    holdout: float = 0.2
    max_depth: int = 3
    beam: int = 1
    max_iters: int = 200

    def __post_init__(self):
        augs = self.augmentations
        require(isinstance(augs, Sequence) and not isinstance(augs, (str, Augmentation)),
                f"augmentations: expected a tuple of Augmentation or kind names, got {augs!r}")
        augs = tuple(Augmentation(a) if isinstance(a, str) else a for a in augs)
        bad = [a for a in augs if not isinstance(a, Augmentation)]
        require(not bad, f"augmentations: expected Augmentation objects or kind names, got {bad[:1]!r}")
        object.__setattr__(self, "augmentations", augs)
        cands = tuple(self.candidates)
        bad = [c for c in cands if not (isinstance(c, (tuple, list)) and len(c) == 3 and isinstance(c[0], str)
                                        and hasattr(c[1], "params"))]
        require(not bad, f"candidates: expected (name, model, theta) triples, got {bad[:1]!r}"[:200])
        names = [c[0] for c in cands]   # the table's labels: the search's own begin with 'user model'
        require(len(set(names)) == len(names) and not any(n.startswith("user model") for n in names),
                f"candidates: expected distinct names that do not begin with 'user model', got {names}"[:200])
        object.__setattr__(self, "candidates", cands)
        require(self.criterion in ("aic", "bic"), f"criterion must be 'aic' or 'bic', got {self.criterion!r}")
        require(isinstance(self.holdout, (int, float)) and 0.0 < self.holdout < 1.0,
                f"holdout must be a fraction in (0, 1), got {self.holdout!r}")
        for name in ("max_depth", "beam", "max_iters"):
            v = getattr(self, name)
            require(is_integer(v) and v >= 1, f"{name} must be an int >= 1, got {v!r}")


def search_options(search) -> SearchOptions | None:
    """``identify(search=...)`` as `SearchOptions`: None/False (no search), True (defaults), a
    `SearchOptions`, or a list of moves (Augmentation or kind names) and/or ``(name, model, theta)``
    candidates (a dict name -> (model, theta) also)."""
    if search is None or isinstance(search, (bool, SearchOptions)):
        return SearchOptions() if search is True else (search or None)
    search = [(k, *v) for k, v in search.items()] if isinstance(search, Mapping) else search
    search = [search] if isinstance(search, (str, Augmentation)) else search
    require(isinstance(search, Sequence) and len(search) > 0, "search: expected True, a SearchOptions, or a non-empty "
            f"list of augmentations / (name, model, theta) candidates, got {search!r}"[:200])
    augs = tuple(a for a in search if isinstance(a, (str, Augmentation)))
    cands = tuple(c for c in search if not isinstance(c, (str, Augmentation)))
    return SearchOptions(augmentations=augs, candidates=cands)


@dataclass(repr=False)
class SearchResult(Result):
    """Outcome of the structure search.

    Attributes
    ----------
    model : StateSpaceModel
        The chosen structure (the user's model when nothing beat it).
    theta : dict
        Its parameters on ALL the estimation data.
    x0 : numpy.ndarray
        (B, nx) its initial states.
    objective : float
        Its output-error objective on all the estimation data (never above the user's model's).
    structure : str
        ``"user model"`` plus the accepted moves, e.g. ``"user model + offset + output_poly(3)"``.
    rows : list of dict
        One per candidate, in run order: ``structure``, ``k``, ``objective`` (heads), ``ic``, ``tail``
        (weighted free-run RMS over the held-back tails), ``status``, ``verdict``, ``wall_s``.
    criterion : str
        ``"aic"`` or ``"bic"``.
    wall_s : float
        Seconds.
    message : str
        How the final fit went.
    status : str
        The final fit's status (``"n/a"`` when the user's model is kept).
    iterations : int
        The final fit's iterations.
    capped : bool
        Whether ``time_limit`` (a safety cap) stopped a candidate or the final refit: then a faster
        machine or a larger limit can choose differently (the table's last line says so).

    Examples
    --------
    A sensor with an offset of 0.7 the user's model lacks: the search adds it.

    >>> import numpy as np
    >>> import ceem_casadi as cc
    >>> model = cc.StateSpaceModel.from_discrete(lambda x, u, p: p.a * x + u, lambda x, u, p: x, nx=1, nu=1,
    ...                                          params=cc.Parameters(cc.Param("a", 0.5)), measurement_std=0.05)
    >>> u = np.random.default_rng(0).normal(size=(200, 1))
    >>> y = cc.simulate_output(model, {"a": 0.8}, u, np.zeros(1)) + 0.7
    >>> y = y + 0.05 * np.random.default_rng(1).normal(size=y.shape)
    >>> res = cc.identify(model, cc.Trajectories([y], [u]), {"a": 0.5}, ceem=False, calibrate=False,
    ...                   search=cc.workflow.SearchOptions(augmentations=("offset",), max_depth=1))
    >>> res.search.structure, round(float(res.search.theta["a"]), 2), round(float(res.search.theta["s1_offset"][0]), 1)
    ('user model + offset', 0.8, 0.7)
    """

    SUMMARY = ("structure", "objective", "wall_s")

    model: object = field(repr=False)
    theta: dict = field(repr=False)
    x0: np.ndarray = field(repr=False)
    objective: float
    structure: str
    rows: list = field(repr=False)
    criterion: str = "aic"
    wall_s: float = 0.0
    message: str = ""
    status: str = "n/a"
    iterations: int = 0
    capped: bool = False

    def table(self) -> str:
        """One line per candidate: structure, k, head objective, criterion, tail score, status, verdict, seconds."""
        w = max([len(r["structure"]) for r in self.rows] + [9])
        out = [f"  {'structure':<{w}}  {'k':>5}  {'objective':>12}  {self.criterion.upper():>12}  {'tail RMS':>9}  "
               f"{'status':<11}  {'wall s':>7}  verdict"]
        for r in self.rows:
            mark = "*" if r.get("chosen") else " "
            out.append(f"{mark} {r['structure']:<{w}}  {r['k']:>5}  {r['objective']:12.6g}  {r['ic']:12.6g}  "
                       f"{r['tail']:9.4g}  {r['status']:<11}  {r['wall_s']:7.2f}  {r['verdict']}")
        if self.capped:
            out.append("  the time limit cut the search (rows not run or time_limit): another machine can choose otherwise")
        return "\n".join(out)

    def to_dict(self) -> dict:
        """JSON-ready dict (without the model)."""
        return dict(structure=self.structure, objective=self.objective, criterion=self.criterion, wall_s=self.wall_s,
                    message=self.message, capped=self.capped,
                    theta={k: np.asarray(v).tolist() for k, v in self.theta.items()},
                    rows=[dict(r.items()) for r in self.rows])
