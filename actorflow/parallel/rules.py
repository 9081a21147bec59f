"""SBP signatures: for each op, the layouts of its inputs under which running the op on each
rank's parts computes the parts of its outputs, and the outputs' layouts then.

A rule is ``fn(metas, attrs) -> [(in_sbps, out_sbps), ...]`` over the call's logical
metas, registered by op name (``@sbp_rule("add", ...)``), as grad rules are. The global
interpreter picks the signature whose boxing of the inputs moves the fewest bytes (the
first listed among equals), boxes, and runs the op on every rank. Every op also has the
all-broadcast signature (each rank computes the whole value), listed last: an op without a
rule of its own is still correct, only not parallel. A rule lists only signatures that are
exact for every split, uneven ones included (``sbp.split`` gives the first ``n % k`` ranks
one element more), so no rule needs the rank count.

Attrs are the call's own on every rank, unless the op has a ``localize`` function
(``LOCALIZE``): ``fn(attrs, out_local_shapes) -> attrs`` for ops whose attrs name a shape
(the factories).
"""

from __future__ import annotations

from collections.abc import Callable

from ..ops.common import broadcast_shapes
from ..ops.registry import OpDef
from ..sbp import SBP, broadcast, partial_sum, split

B, P = broadcast, partial_sum
S = split

Signature = tuple[tuple[SBP, ...], tuple[SBP, ...]]
RULES: dict[str, Callable] = {}
LOCALIZE: dict[str, Callable] = {}


def sbp_rule(*names: str) -> Callable:
    """Registers ``fn(metas, attrs) -> [(in_sbps, out_sbps), ...]`` for the ops ``names``."""

    def register(fn: Callable) -> Callable:
        for n in names:
            if n in RULES:
                raise ValueError(f"op {n!r} has an sbp rule already")
            RULES[n] = fn
        return fn

    return register


def signatures(op: OpDef, metas: list, attrs: dict, n_out: int) -> list[Signature]:
    """The op's signatures for this call, the all-broadcast one last."""
    rule = RULES.get(op.name)
    if rule is None and op.elementwise:
        rule = _elementwise
    out = list(rule(metas, attrs)) if rule is not None else []
    out.append(((B,) * len(metas), (B,) * n_out))
    return out


# -- elementwise ---------------------------------------------------------------------------

# ops linear in every tensor operand at once (f(x1 + x2) = f(x1) + f(x2), and for several
# operands the sum over a common summand index): partial sums pass through
LINEAR = frozenset({"neg", "copy", "add", "sub", "mul_scalar", "rmul_scalar", "div_scalar"})
# ops linear in their first operand with the others fixed: (P, B, ...) -> P
LINEAR_IN_FIRST = frozenset({"mul", "div", "gelu_backward", "silu_backward"})


def split_matches(metas: list, out_shape: tuple, in_place: bool = False) -> list[Signature]:
    """For each dim ``d`` of the broadcast output: each input split along the dim that
    lines up with ``d`` where it has that size, broadcast where it is stretched (size 1).
    ``in_place``: the output exists (a part per rank), so a dim every input is stretched
    along may be split too (each rank broadcasts the inputs into its part)."""
    nd = len(out_shape)
    sigs = []
    for d in range(nd):
        ins = []
        for m in metas:
            lead = nd - len(m.shape)
            di = d - lead
            if di >= 0 and m.shape[di] == out_shape[d]:
                ins.append(S(di))
            else:
                ins.append(B)
        if in_place or any(s.is_split for s in ins):
            sigs.append((tuple(ins), (S(d),)))
    return sigs


def _elementwise(metas: list, attrs: dict) -> list[Signature]:
    shape = metas[0].shape
    for m in metas[1:]:
        shape = broadcast_shapes("sbp", shape, m.shape)
    return split_matches(metas, shape)


def _with_partial(name: str, base: Callable) -> Callable:
    def rule(metas: list, attrs: dict) -> list[Signature]:
        sigs = base(metas, attrs)
        n = len(metas)
        if name in LINEAR:
            sigs.append(((P,) * n, (P,)))
        elif name in LINEAR_IN_FIRST and n >= 1:
            sigs.append(((P,) + (B,) * (n - 1), (P,)))
            if name == "mul" and n == 2:
                sigs.append(((B, P), (P,)))
        return sigs

    return rule


for _name in ("neg", "copy", "mul_scalar", "rmul_scalar", "div_scalar", "add", "sub", "mul"):
    RULES[_name] = _with_partial(_name, _elementwise)
for _name in ("div", "gelu_backward", "silu_backward"):
    RULES[_name] = _with_partial(_name, _elementwise)


@sbp_rule("cast")
def _cast(metas: list, attrs: dict) -> list[Signature]:
    sigs = _elementwise(metas, attrs)
    m, to = metas[0].dtype, attrs.get("dtype")
    if to is not None and to is m:  # a copy: linear
        sigs.append(((P,), (P,)))
    return sigs


# -- reductions ----------------------------------------------------------------------------


def _reduce(partial_ok: bool, partial_in: bool) -> Callable:
    def rule(metas: list, attrs: dict) -> list[Signature]:
        shape = metas[0].shape
        dims = attrs["dims"]
        dims = tuple(range(len(shape))) if dims is None else tuple(dims)
        keep = attrs["keepdim"]
        sigs = []
        for d in range(len(shape)):
            if d in dims:
                if partial_ok:
                    sigs.append(((S(d),), (P,)))
            else:
                od = d if keep else d - sum(1 for x in dims if x < d)
                sigs.append(((S(d),), (S(od),)))
        if partial_in:
            sigs.append(((P,), (P,)))
        return sigs

    return rule


RULES["sum"] = _reduce(partial_ok=True, partial_in=True)
RULES["mean"] = _reduce(partial_ok=False, partial_in=True)
RULES["amax"] = _reduce(partial_ok=False, partial_in=False)
RULES["amin"] = _reduce(partial_ok=False, partial_in=False)


# -- matmul --------------------------------------------------------------------------------


@sbp_rule("matmul")
def _matmul(metas: list, attrs: dict) -> list[Signature]:
    a, b = metas[0].shape, metas[1].shape
    if len(a) < 2 or len(b) < 2:
        sigs: list[Signature] = []
        if len(a) >= 2:  # (.., n, k) @ (k,): rows of a
            sigs.append(((S(len(a) - 2), B), (S(len(a) - 2),)))
        if len(a) == 1 and len(b) >= 2:  # (k,) @ (.., k, m): columns of b
            sigs.append(((B, S(len(b) - 1)), (S(len(b) - 2),)))
        sigs.append(((S(len(a) - 1), S(len(b) - 2 if len(b) >= 2 else 0)), (P,)))
        sigs += [((P, B), (P,)), ((B, P), (P,))]
        return sigs
    out_nd = max(len(a), len(b))
    sigs = []
    # batch dims: split where both have the dim (or one broadcasts it)
    batch = broadcast_shapes("matmul", a[:-2], b[:-2])
    for d in range(len(batch)):
        ins = []
        for s in (a, b):
            lead = len(batch) - (len(s) - 2)
            di = d - lead
            ins.append(S(di) if di >= 0 and s[di] == batch[d] else B)
        sigs.append(((ins[0], ins[1]), (S(d),)))
    sigs.append(((S(len(a) - 2), B), (S(out_nd - 2),)))  # rows of a
    sigs.append(((B, S(len(b) - 1)), (S(out_nd - 1),)))  # columns of b
    sigs.append(((S(len(a) - 1), S(len(b) - 2)), (P,)))  # the inner dim: summands
    sigs += [((P, B), (P,)), ((B, P), (P,))]
    return sigs


# -- along a dim ---------------------------------------------------------------------------


def _along_dim(linear: bool) -> Callable:
    """Ops that read a whole dim (``attrs["dim"]``) and keep the shape: any other dim
    splits; ``linear`` ones pass partial sums."""

    def rule(metas: list, attrs: dict) -> list[Signature]:
        nd = len(metas[0].shape)
        dim = attrs["dim"] % nd if nd else 0
        n = len(metas)
        sigs: list[Signature] = [((S(d),) * n, (S(d),)) for d in range(nd) if d != dim]
        if linear:
            sigs.append(((P,) + (B,) * (n - 1), (P,)))
        return sigs

    return rule


RULES["softmax"] = _along_dim(linear=False)
RULES["log_softmax"] = _along_dim(linear=False)
RULES["cumsum"] = _along_dim(linear=True)


@sbp_rule("softmax_backward")
def _softmax_backward(metas: list, attrs: dict) -> list[Signature]:
    # (grad, y): linear in the gradient with y fixed
    return _along_dim(linear=False)(metas, attrs) + [((P, B), (P,))]


@sbp_rule("cat")
def _cat(metas: list, attrs: dict) -> list[Signature]:
    nd = len(metas[0].shape)
    dim = attrs["dim"]
    n = len(metas)
    sigs: list[Signature] = [((S(d),) * n, (S(d),)) for d in range(nd) if d != dim]
    sigs.append(((P,) * n, (P,)))
    return sigs


@sbp_rule("stack")
def _stack(metas: list, attrs: dict) -> list[Signature]:
    nd = len(metas[0].shape)
    dim = attrs["dim"]
    n = len(metas)
    sigs: list[Signature] = [((S(d),) * n, (S(d if d < dim else d + 1),)) for d in range(nd)]
    sigs.append(((P,) * n, (P,)))
    return sigs


# -- factories -----------------------------------------------------------------------------


def _shape_attr(attrs: dict, shapes: list) -> dict:
    out = dict(attrs)
    out["shape"] = shapes[0]
    return out


# factories whose every element is the same function of the shape: each rank makes its own
# part (a split's slice is the same values); the others (random draws, arange) make the
# whole value on each rank and keep their slice, so a global tensor equals the local one
LOCALIZE["full"] = _shape_attr
LOCALIZE["empty"] = _shape_attr
