"""Initialisation of block-oriented models: the frequency response of periodic data (`estimate_frf`),
its transfer-function fit (`fit_frf`) and the best-linear-approximation initialiser
(`bla_initialise`, which splits the BLA's poles and zeros over the linear blocks and fits the static
nonlinearity). Public names are re-exported by `ceem_casadi.workflow`."""
from ._bla import bla_initialise
from ._frf import FRF, estimate_frf
from ._frf_fit import FRFFit, fit_frf

__all__ = ["FRF", "FRFFit", "bla_initialise", "estimate_frf", "fit_frf"]
