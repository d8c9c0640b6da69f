"""Base class of the library's CasADi Callbacks: fixed, named inputs and outputs with given sparsities
(subclasses set their attributes, then call ``super().__init__``, and implement ``eval``)."""
from __future__ import annotations

import casadi as ca


class SparsityCallback(ca.Callback):
    """A CasADi Callback with inputs ``names_in`` of sparsities ``sp_in`` and outputs ``names_out``
    of sparsities ``sp_out`` (lists of equal lengths), constructed as ``name`` with ``opts``."""

    def __init__(self, name: str, sp_in, sp_out, names_in, names_out, opts: dict | None = None):
        ca.Callback.__init__(self)
        self.sp_in, self.sp_out = list(sp_in), list(sp_out)
        self.names_in, self.names_out = list(names_in), list(names_out)
        self.construct(name, opts or {})

    def get_n_in(self):
        return len(self.sp_in)

    def get_n_out(self):
        return len(self.sp_out)

    def get_name_in(self, i):
        return self.names_in[i]

    def get_name_out(self, i):
        return self.names_out[i]

    def get_sparsity_in(self, i):
        return self.sp_in[i]

    def get_sparsity_out(self, i):
        return self.sp_out[i]
