"""Initialisation of block-oriented models from the best linear approximation, parametric or from the FRF of
periodic data (docs/block_oriented.md); re-exported by `ceem_casadi.workflow`."""
from ._bla import bla_initialise
from ._frf import FRF, estimate_frf
from ._frf_fit import FRFFit, fit_frf

__all__ = ["FRF", "FRFFit", "bla_initialise", "estimate_frf", "fit_frf"]
