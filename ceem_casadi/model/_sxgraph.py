"""Model functions as plain arrays: a CasADi SX Function stored as its instruction list and rebuilt from a
whitelist of elementary operations, so loading a model file never runs code (docs/model_learning_notes.md)."""
from __future__ import annotations

import casadi as ca
import numpy as np

from ..errors import CeemError

_UNARY_NAMES = ("ACOS", "ACOSH", "ASIN", "ASINH", "ATAN", "ATANH", "CEIL", "COS", "COSH", "ERF", "ERFINV",
                "EXP", "EXPM1", "FABS", "FLOOR", "INV", "LOG", "LOG1P", "NEG", "NOT", "SIGN", "SIN", "SINH",
                "SQ", "SQRT", "TAN", "TANH", "TWICE", "ASSIGN")
_BINARY_NAMES = ("ADD", "SUB", "MUL", "DIV", "POW", "CONSTPOW", "EQ", "NE", "LT", "LE", "AND", "OR",
                 "IF_ELSE_ZERO", "ATAN2", "FMIN", "FMAX", "COPYSIGN", "FMOD", "REMAINDER", "HYPOT")
UNARY = {getattr(ca, f"OP_{n}") for n in _UNARY_NAMES if hasattr(ca, f"OP_{n}")}
BINARY = {getattr(ca, f"OP_{n}") for n in _BINARY_NAMES if hasattr(ca, f"OP_{n}")}
_OP_NAMES = {getattr(ca, n): n for n in dir(ca) if n.startswith("OP_")}
OP_INPUT, OP_OUTPUT, OP_CONST = ca.OP_INPUT, ca.OP_OUTPUT, ca.OP_CONST
_FIELDS = ("code", "const", "shape", "rows")


class GraphError(CeemError, ValueError):
    """A Function cannot be stored as a plain expression graph, or stored arrays are not one."""


def export(fun: ca.Function) -> dict[str, np.ndarray]:
    """Arrays ``code``, ``const``, ``shape``, ``rows`` of an SX model function ``fun(x, u, p)``; `GraphError` unless it
    has three dense column inputs, one column output, no free symbols and only whitelisted operations."""
    if not fun.is_a("SXFunction"):
        raise GraphError(f"model function {fun.name()!r} is a {fun.class_name()}, not an SXFunction: only "
                         f"SX expression graphs can be stored (build the model with ca.SX symbols)")
    if fun.has_free():
        raise GraphError(f"model function {fun.name()!r} has free symbols {fun.get_free()}")
    if fun.n_in() != 3 or fun.n_out() != 1:
        raise GraphError(f"model function {fun.name()!r}: expected inputs (x, u, p) and one output")
    for i in range(3):
        sp = fun.sparsity_in(i)
        if sp.size2() > 1 or not sp.is_dense():
            raise GraphError(f"model function {fun.name()!r}: input {i} must be a dense column")
    sp_out = fun.sparsity_out(0)
    if sp_out.size2() != 1:
        raise GraphError(f"model function {fun.name()!r}: the output must be a column")
    n = fun.n_instructions()
    code = np.full((n, 4), -1, dtype=np.int64)
    const = np.zeros(n)
    for k in range(n):
        op = fun.instruction_id(k)
        ins, outs = fun.instruction_input(k), fun.instruction_output(k)
        if op == OP_INPUT:
            code[k] = (op, ins[0], ins[1], outs[0])
        elif op == OP_OUTPUT:
            code[k] = (op, ins[0], outs[1], outs[0])
        elif op == OP_CONST:
            code[k] = (op, -1, -1, outs[0])
            const[k] = fun.instruction_constant(k)
        elif op in UNARY and len(ins) == 1:
            code[k] = (op, ins[0], -1, outs[0])
        elif op in BINARY and len(ins) == 2:
            code[k] = (op, ins[0], ins[1], outs[0])
        else:
            raise GraphError(f"model function {fun.name()!r} uses operation {_OP_NAMES.get(op, op)} "
                             f"(instruction {k}), which a model file cannot store")
    shape = np.array([fun.nnz_in(0), fun.nnz_in(1), fun.nnz_in(2), sp_out.size1(), fun.sz_w()], dtype=np.int64)
    return {"code": code, "const": const, "shape": shape, "rows": np.asarray(sp_out.row(), dtype=np.int64)}


def _checked(arrays: dict, name: str):
    """``(code, const, rows, n_in, n_out, n_work)`` of `export`'s arrays, their shapes and sizes checked."""
    try:
        code, const = np.asarray(arrays["code"]), np.asarray(arrays["const"], dtype=float)
        shape, rows = np.asarray(arrays["shape"]), np.asarray(arrays["rows"])
    except KeyError as exc:
        raise GraphError(f"{name}: missing array {exc}") from None
    if (code.ndim != 2 or code.shape[1] != 4 or const.shape != (len(code),) or shape.shape != (5,)
            or rows.ndim != 1 or not all(np.issubdtype(a.dtype, np.integer) for a in (code, shape, rows))):
        raise GraphError(f"{name}: malformed expression graph arrays")
    n_in = [int(s) for s in shape[:3]]
    n_out, n_work = int(shape[3]), int(shape[4])
    if min(*n_in, n_out, n_work) < 0 or n_out < 1 or len(rows) > n_out or np.any(rows < 0) or \
            np.any(rows >= n_out) or np.any(np.diff(rows) <= 0) or n_work > 4 * len(code) + 16:
        raise GraphError(f"{name}: malformed expression graph sizes {shape.tolist()}")
    return code, const, rows, n_in, n_out, n_work


def _value(name: str, k: int, row, syms, n_in, const, get):
    """The SX value of instruction ``k`` (``row = (op, a, b, o)``, not an output); `GraphError` for
    an input out of range or anything but elementary math."""
    op, a, b, _ = row
    if op == OP_INPUT:
        if not (0 <= a < 3 and 0 <= b < n_in[a]):
            raise GraphError(f"{name}: instruction {k} reads input {a} entry {b} out of range")
        return syms[a][b]
    if op == OP_CONST:
        return ca.SX(const[k])
    if op in UNARY:
        return ca.SX.unary(op, get(a))
    if op in BINARY:
        return ca.SX.binary(op, get(a), get(b))
    raise GraphError(f"{name}: instruction {k} has operation {_OP_NAMES.get(op, op)}, which is not "
                     f"an elementary math operation: refusing the graph")


def rebuild(arrays: dict[str, np.ndarray], name: str, out_name: str) -> ca.Function:
    """SX Function ``name(x, u, p) -> out_name`` from `export`'s arrays, every row checked before use (`GraphError`);
    nothing but elementary SX arithmetic is evaluated."""
    code, const, rows, n_in, n_out, n_work = _checked(arrays, name)
    syms = [ca.SX.sym(s, k) for s, k in zip("xup", n_in)]
    work: list = [None] * n_work
    out: list = [None] * len(rows)

    def get(i):
        if not 0 <= i < n_work or work[i] is None:
            raise GraphError(f"{name}: instruction reads work entry {i} before it is written")
        return work[i]

    for k, row in enumerate(code.tolist()):
        op, a, b, o = row
        if op == OP_OUTPUT:
            if not 0 <= o < 1 or not 0 <= b < len(rows):
                raise GraphError(f"{name}: instruction {k} writes output entry {b} out of range")
            out[b] = get(a)
        elif not 0 <= o < n_work:
            raise GraphError(f"{name}: instruction {k} writes work entry {o} out of range")
        else:
            work[o] = _value(name, k, row, syms, n_in, const, get)
    if any(v is None for v in out):
        raise GraphError(f"{name}: output entries never written")
    y = ca.SX(ca.Sparsity(n_out, 1, [0, len(rows)], rows.tolist()))
    for j, v in enumerate(out):
        y.nz[j] = v
    return ca.Function(name, syms, [y], ["x", "u", "p"], [out_name])


def to_arrays(prefix: str, fun: ca.Function) -> dict[str, np.ndarray]:
    """``{f"{prefix}/{field}": array}`` of `export` (for an archive)."""
    return {f"{prefix}/{k}": v for k, v in export(fun).items()}


def from_arrays(arrays: dict, prefix: str, name: str, out_name: str) -> ca.Function | None:
    """`rebuild` of the arrays under ``prefix`` of an archive; None when there are none."""
    sub = {k: arrays[f"{prefix}/{k}"] for k in _FIELDS if f"{prefix}/{k}" in arrays}
    return rebuild(sub, name, out_name) if sub else None
