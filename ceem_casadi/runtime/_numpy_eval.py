"""Evaluate a matrix-valued MX Function with numpy (BLAS) instead of CasADi's dense kernels, by replaying
its instruction list (docs/runtime.md, "numpy evaluation of MX Functions")."""
from __future__ import annotations

import casadi as ca
import numpy as np

__all__ = ["NumpyFunction"]

_UNARY = {ca.OP_NEG: np.negative, ca.OP_SQ: np.square, ca.OP_TWICE: lambda a: 2.0 * a, ca.OP_TANH: np.tanh,
          ca.OP_EXP: np.exp, ca.OP_LOG: np.log, ca.OP_SQRT: np.sqrt, ca.OP_SIN: np.sin, ca.OP_COS: np.cos,
          ca.OP_FABS: np.abs, ca.OP_INV: lambda a: 1.0 / a, ca.OP_ASSIGN: lambda a: a}
_BINARY = {ca.OP_ADD: np.add, ca.OP_SUB: np.subtract, ca.OP_MUL: np.multiply, ca.OP_DIV: np.divide, ca.OP_POW: np.power,
           # CasADi's rule: a NaN argument is ignored, a tie returns the first argument (docs/runtime.md)
           ca.OP_FMAX: lambda a, b: np.where((a < b) | np.isnan(a), b, a),
           ca.OP_FMIN: lambda a, b: np.where((a > b) | np.isnan(a), b, a)}
_PLAIN = {**_UNARY, **_BINARY, ca.OP_MTIMES: lambda z, x, y: z + x @ y, ca.OP_TRANSPOSE: lambda a: a.T,
          ca.OP_HORZCAT: lambda *a: np.hstack(a), ca.OP_VERTCAT: lambda *a: np.vstack(a),
          ca.OP_DOT: lambda a, b: np.array([[np.vdot(a, b)]])}


def _flat_index(sp: ca.Sparsity) -> np.ndarray:
    """Column-major dense positions of the nonzeros of ``sp``."""
    return np.asarray(sp.find(), dtype=np.intp)


def _nz_of(node: ca.MX):
    """The nonzero indices a GETNONZEROS / ADDNONZEROS / SETNONZEROS node reads or writes."""
    info = node.info()
    if "nz" in info:
        return np.asarray(info["nz"], dtype=np.intp)
    if "slice" in info and "inner" not in info:
        s = info["slice"]
        return np.arange(s["start"], s["stop"], s["step"], dtype=np.intp)
    if "inner" in info and "outer" in info:  # a slice of slices
        i, o = info["inner"], info["outer"]
        inner = np.arange(i["start"], i["stop"], i["step"], dtype=np.intp)
        outer = np.arange(o["start"], o["stop"], o["step"], dtype=np.intp)
        return (outer[:, None] + inner[None, :]).ravel()
    raise NotImplementedError(f"nonzero access without a readable index: {sorted(info)}")


class NumpyFunction:
    """A CasADi MX Function evaluated by numpy: ``NumpyFunction(f)(*args)`` equals ``f(*args)``.

    Parameters
    ----------
    fun : casadi.Function
        An MX Function with dense inputs whose instructions are all supported (matrix products,
        transposes, reshapes, concatenations, repetitions and sums of blocks, nonzero access,
        elementwise arithmetic, ``tanh``/``exp``/``log``/``sqrt``/``sin``/``cos``/``fabs``,
        inner products).

    Raises
    ------
    NotImplementedError
        ``fun`` is not an MX Function, has a sparse input, or uses an operation outside the
        supported set (checked here, before any evaluation).

    Examples
    --------
    >>> import casadi as ca, numpy as np
    >>> from ceem_casadi.runtime import NumpyFunction
    >>> W, X = ca.MX.sym("W", 3, 2), ca.MX.sym("X", 2, 4)
    >>> c = ca.sumsqr(ca.tanh(ca.mtimes(W, X)))
    >>> f = ca.Function("f", [W, X], [c, ca.gradient(c, W)])
    >>> w, x = np.arange(6.0).reshape(3, 2) / 10, np.ones((2, 4))
    >>> got, want = NumpyFunction(f)(w, x), f(w, x)
    >>> bool(np.allclose(got[1], want[1].full(), rtol=1e-13)), got[1].shape
    (True, (3, 2))
    """

    def __init__(self, fun: ca.Function):
        if not fun.is_a("MXFunction"):
            raise NotImplementedError(f"{fun.name()}: only MX Functions are replayed, got {fun.class_name()}")
        for i in range(fun.n_in()):
            if not fun.sparsity_in(i).is_dense():
                raise NotImplementedError(f"{fun.name()}: input {fun.name_in(i)} is sparse")
        self.fun = fun
        self.shapes_in = [fun.size_in(i) for i in range(fun.n_in())]
        self.shapes_out = [fun.size_out(i) for i in range(fun.n_out())]
        self.program = [self._compile(fun, k) for k in range(fun.n_instructions())]
        self.n_work = 1 + max((s for _, _, outs in self.program for s in outs), default=0)

    @staticmethod
    def _compile(fun: ca.Function, k: int):
        """``(operation, input slots, output slots)`` of instruction k; the operation maps the
        input values (dense arrays) to the output values."""
        op, ins, outs = fun.instruction_id(k), list(fun.instruction_input(k)), list(fun.instruction_output(k))
        if op == ca.OP_INPUT:
            return ("input", ins[0]), [], outs
        if op == ca.OP_OUTPUT:
            return ("output", outs[0]), ins, []
        if op in _PLAIN:
            return _PLAIN[op], ins, outs
        node = fun.instruction_MX(k)
        shape = node.size()
        sp = node.sparsity()
        if op == ca.OP_CONST:
            value = np.asarray(ca.evalf(node).full(), float)
            return (lambda: value), ins, outs
        if op == ca.OP_RESHAPE:
            return (lambda a: np.reshape(a, shape, order="F")), ins, outs
        if op == ca.OP_HORZREPMAT:
            reps = shape[1] // max(1, node.dep(0).size2())
            return (lambda a: np.tile(a, (1, reps))), ins, outs
        if op == ca.OP_HORZREPSUM:
            n = node.dep(0).size2() // max(1, shape[1])
            return (lambda a: a.reshape(shape[0], n, shape[1], order="F").sum(axis=1)), ins, outs
        if op == ca.OP_GETNONZEROS:
            nz = _nz_of(node)
            src = _flat_index(node.dep(0).sparsity())[nz]
            dst = _flat_index(sp)

            def get(a):
                out = np.zeros(shape[0] * shape[1])
                out[dst] = a.ravel(order="F")[src]
                return out.reshape(shape, order="F")
            return get, ins, outs
        if op in (ca.OP_HORZSPLIT, ca.OP_VERTSPLIT):      # nonzero ranges of the input, one per output
            offset = list(node.info()["offset"])
            src = _flat_index(node.dep(0).sparsity())
            parts = []
            for i in range(len(offset) - 1):
                o = node.get_output(i)
                parts.append((src[offset[i]:offset[i + 1]], _flat_index(o.sparsity()), o.size()))

            def split(a):
                flat = a.ravel(order="F")
                res = []
                for take, put, size in parts:
                    out = np.zeros(size[0] * size[1])
                    out[put] = flat[take]
                    res.append(out.reshape(size, order="F"))
                return tuple(res)
            return split, ins, outs
        if op in (ca.OP_ADDNONZEROS, ca.OP_SETNONZEROS):
            nz = _nz_of(node)
            dst = _flat_index(sp)[nz]
            src = _flat_index(node.dep(1).sparsity())
            add = op == ca.OP_ADDNONZEROS

            def put(a, b):
                out = np.array(a, float, order="F").ravel(order="F")
                if add:
                    np.add.at(out, dst, b.ravel(order="F")[src])
                else:
                    out[dst] = b.ravel(order="F")[src]
                return out.reshape(shape, order="F")
            return put, ins, outs
        names = {getattr(ca, n): n for n in dir(ca) if n.startswith("OP_")}
        raise NotImplementedError(f"{fun.name()}: operation {names.get(op, op)} is not replayed by numpy")

    def __call__(self, *args) -> list[np.ndarray]:
        """The outputs (dense arrays of the output shapes) at ``args`` (arrays or scalars of
        the input shapes)."""
        if len(args) != len(self.shapes_in):
            raise TypeError(f"{self.fun.name()}: expected {len(self.shapes_in)} inputs, got {len(args)}")
        vals = []
        for i, (a, shape) in enumerate(zip(args, self.shapes_in)):
            a = np.asarray(a, float)
            if a.size != shape[0] * shape[1]:
                raise ValueError(f"{self.fun.name()}: input {self.fun.name_in(i)} needs {shape}, got {a.shape}")
            vals.append(a.reshape(shape, order="F") if a.shape != shape else a)
        w: list = [None] * self.n_work
        out: list = [None] * len(self.shapes_out)
        for op, ins, outs in self.program:
            if isinstance(op, tuple):
                if op[0] == "input":
                    w[outs[0]] = vals[op[1]]
                else:
                    out[op[1]] = w[ins[0]]
                continue
            val = op(*[w[i] for i in ins])
            if len(outs) == 1:
                w[outs[0]] = val
            else:                                    # a split: one value per output (-1: unused)
                for slot, v in zip(outs, val):
                    if slot >= 0:
                        w[slot] = v
        for i, shape in enumerate(self.shapes_out):
            if out[i] is None:
                out[i] = np.zeros(shape)
            elif np.shape(out[i]) != shape:
                out[i] = np.broadcast_to(out[i], shape).copy() if np.size(out[i]) == 1 else np.reshape(out[i], shape, order="F")
        return out
