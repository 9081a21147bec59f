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
(``full``, ``empty``, ``pad_backward``); a rule lists no split that would need one
otherwise.

The families, each with its reasoning beside its rules: elementwise (by ``op.elementwise``,
with the linear ones passing partial sums), reductions, matmul, ops along a dim (softmax,
cumsum, sort, topk), arg reductions, cat/stack, where, triu/tril, gather/scatter_add,
indexing, pad, normalization, convolutions, pools. Ops without a rule (broadcast only) are
listed at the end with their reasons; tests/test_global_ops.py checks every op of the
registry is one or the other, and runs each under every signature listed here.
"""

from __future__ import annotations

from collections.abc import Callable

from ..ops.common import broadcast_shapes
from ..ops.index import Slot
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
    every = (B,) * len(metas)
    out = []
    seen = {every}
    # one signature per input layouts (the first listed), so the one the interpreter picks
    # for inputs laid out so is known; the all-broadcast one last, always to broadcast
    for sig in list(rule(metas, attrs)) if rule is not None else []:
        if sig[0] not in seen:
            seen.add(sig[0])
            out.append(sig)
    out.append((every, (B,) * n_out))
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
    sigs: list[Signature] = []
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


# float casts that keep every value exactly (a wider float): each summand is kept, so their
# sum is the sum (narrowing would round each summand apart: cancelling summands lose it)
_WIDENING = frozenset(
    {
        ("float16", "float32"),
        ("float16", "float64"),
        ("bfloat16", "float32"),
        ("bfloat16", "float64"),
        ("float32", "float64"),
    }
)


@sbp_rule("cast")
def _cast(metas: list, attrs: dict) -> list[Signature]:
    sigs = _elementwise(metas, attrs)
    m, to = metas[0].dtype, attrs.get("dtype")
    if to is not None and (to is m or (m.name, to.name) in _WIDENING):  # linear
        sigs.append(((P,), (P,)))
    return sigs


# -- reductions ----------------------------------------------------------------------------


def _reduce(partial_ok: bool, partial_in: bool) -> Callable:
    def rule(metas: list, attrs: dict) -> list[Signature]:
        shape = metas[0].shape
        dims = attrs["dims"]
        dims = tuple(range(len(shape))) if dims is None else tuple(dims)
        keep = attrs["keepdim"]
        sigs: list[Signature] = []
        for d in range(len(shape)):
            if d in dims:
                if partial_ok:
                    sigs.append(((S(d),), (P,)))
            else:
                od = d if keep else d - sum(1 for x in dims if x < d)
                sigs.append(((S(d),), (S(od),)))
        if partial_in and _linear_cast(metas[0].dtype, attrs.get("dtype")):
            sigs.append(((P,), (P,)))
        return sigs

    return rule


def _linear_cast(src, to) -> bool:
    """Whether casting to ``to`` (an op's ``dtype=``, None: no cast) before summing keeps
    partial sums exact: no cast, or a float widening (an integer or narrowing cast of
    each summand is not the cast of their sum: int(0.6) + int(0.6) != int(1.2))."""
    return to is None or to is src or (src.name, to.name) in _WIDENING


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
        if linear and _linear_cast(metas[0].dtype, attrs.get("dtype")):
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


def _dim(attrs: dict, nd: int, key: str = "dim") -> int:
    return attrs[key] % nd if nd else 0


def _both(sigs: list[Signature], n_out: int) -> list[Signature]:
    """One-output signatures for an op whose ``n_out`` outputs are laid out alike."""
    return [(i, o * n_out) for i, o in sigs]


# -- arg reductions: argmax/argmin, max_dim/min_dim ----------------------------------------
# The reduced dim is read whole (an index into it is global): only a kept dim splits, the
# output's dim that one less the reduced dim before it (none with keepdim). A flattening
# argmax (dim None) reads every element: broadcast only.


def _arg_reduce(metas: list, attrs: dict) -> list[Signature]:
    shape = metas[0].shape
    if attrs["dim"] is None or not shape:
        return []
    dim = _dim(attrs, len(shape))
    sigs: list[Signature] = []
    for d in range(len(shape)):
        if d != dim:
            od = d if attrs["keepdim"] or d < dim else d - 1
            sigs.append(((S(d),), (S(od),)))
    return sigs


RULES["argmax"] = RULES["argmin"] = _arg_reduce
RULES["max_dim"] = RULES["min_dim"] = lambda metas, attrs: _both(_arg_reduce(metas, attrs), 2)


# -- where ---------------------------------------------------------------------------------
# Elementwise over (condition, x?, y?) broadcast together (x or y a number in attrs when
# not a tensor). Linear in the values with the condition fixed: where(c, x1 + x2, y1 + y2)
# is where(c, x1, y1) + where(c, x2, y2), so (B, P, P) -> P; with one value a number, only
# a zero keeps the sum (where(c, x1 + x2, 0)), so (B, P) -> P then.


@sbp_rule("where")
def _where(metas: list, attrs: dict) -> list[Signature]:
    sigs = _elementwise(metas, attrs)
    n_values = len(metas) - 1
    if n_values == 2:
        sigs.append(((B, P, P), (P,)))
    elif n_values == 1:
        number = attrs["x"] if "x" in attrs else attrs["y"]
        if not isinstance(number, bool) and number == 0:
            sigs.append(((B, P), (P,)))
    return sigs


# -- triu / tril ---------------------------------------------------------------------------
# The triangle is of the last two dims, at positions counted from each matrix's corner: only
# the batch dims before them split. Masking is linear: P -> P.


@sbp_rule("triu", "tril")
def _triangle(metas: list, attrs: dict) -> list[Signature]:
    nd = len(metas[0].shape)
    sigs: list[Signature] = [((S(d),), (S(d),)) for d in range(nd - 2)]
    sigs.append(((P,), (P,)))
    return sigs


# -- sort / topk ---------------------------------------------------------------------------
# Along one dim (read whole): every other dim splits, values and indices alike; topk's k
# is of that dim, unchanged by a split elsewhere.


@sbp_rule("sort", "topk")
def _sort(metas: list, attrs: dict) -> list[Signature]:
    nd = len(metas[0].shape)
    dim = _dim(attrs, nd)
    return [((S(d),), (S(d), S(d))) for d in range(nd) if d != dim]


# -- gather / scatter_add along a dim ------------------------------------------------------
# out[.., i, ..] = x[.., index[.., i, ..], ..] along ``dim``; every other dim is a position
# shared by x, index (and src): it splits where those have the same size there (index may
# be smaller than x, src larger than index: their slices would not line up). Along ``dim``
# itself the index's positions are the output's own: (B, S(dim)) -> S(dim) for a gather,
# and for a scatter_add each rank adds its slice of index/src into its summand of x:
# (P, S(dim), S(dim)) -> P where src is as long as index there. Gather is linear in x;
# scatter_add in (x, src) together.


@sbp_rule("gather")
def _gather(metas: list, attrs: dict) -> list[Signature]:
    x, index = metas[0].shape, metas[1].shape
    nd = len(x)
    sigs: list[Signature] = []
    if nd and len(index) == nd:
        dim = _dim(attrs, nd)
        for d in range(nd):
            if d != dim and x[d] == index[d]:
                sigs.append(((S(d), S(d)), (S(d),)))
        sigs.append(((B, S(dim)), (S(dim),)))
    sigs.append(((P, B), (P,)))
    return sigs


@sbp_rule("scatter_add")
def _scatter_add(metas: list, attrs: dict) -> list[Signature]:
    x, index, src = (m.shape for m in metas)
    nd = len(x)
    sigs: list[Signature] = []
    if nd and len(index) == nd and len(src) == nd:
        dim = _dim(attrs, nd)
        for d in range(nd):
            if d != dim and x[d] == index[d] == src[d]:
                sigs.append(((S(d), S(d), S(d)), (S(d),)))
        if index[dim] == src[dim]:
            sigs.append(((P, S(dim), S(dim)), (P,)))
    sigs.append(((P, B, P), (P,)))
    return sigs


# -- indexing ------------------------------------------------------------------------------
# ``index`` (x[key], the key's tensors after x) is linear in x for any key: (P, B..) -> P.
# A pick by one index tensor along a dim m, every other dim whole (``x[:, idx]``; the key
# ``ROWS``, m = 0: an embedding, ``take``), also splits: x on a dim other than m (the
# result has it, after the index's dims where it came after m), or the index on any of its
# dims with x whole (the result's dims m.. follow the index's). ``index_add`` (x with value
# added at x[key], the pick's gradient) is linear in (x, value) together: (P, P, B..) -> P;
# by one index also x and value split alike on x's other dims, or the index and value
# alike with x a summand: (P, S(m + j), S(j)) -> P. Other keys (ints, partial slices,
# several index tensors) name positions of the whole tensor: no split. ``class_index`` (a
# loss's targets) is elementwise over the targets. ``index_put`` (x[key] = value, in
# place) splits only for a mask of x's whole shape and a number or 0-dim value (each
# element written by its own mask element); ``masked_index`` and ``nonzero``
# (value-dependent shapes) have no rule: broadcast only.


def _one_index(key: tuple, nd: int) -> int | None:
    """``m`` where ``key`` picks by one index tensor along dim ``m`` with every other dim
    whole (``(:,) * m + (index,) + (:,) * t``; ``ROWS`` is m = 0), else None."""
    at = [n for n, k in enumerate(key) if type(k) is Slot]
    if len(at) != 1 or key[at[0]].index != 0 or len(key) > nd:
        return None
    if any(
        not (isinstance(k, slice) and k == slice(None)) for n, k in enumerate(key) if n != at[0]
    ):
        return None
    return at[0]


def _by_index(x: tuple, idx: tuple, m: int) -> list[tuple[int, int]]:
    """(x's dim, the picked result's dim) for x's dims other than ``m``."""
    return [(d, d if d < m else d - 1 + len(idx)) for d in range(len(x)) if d != m]


@sbp_rule("index")
def _index(metas: list, attrs: dict) -> list[Signature]:
    n = len(metas)
    sigs: list[Signature] = []
    m = _one_index(attrs["key"], len(metas[0].shape)) if n == 2 else None
    if m is not None:
        x, idx = metas[0].shape, metas[1].shape
        sigs += [((S(d), B), (S(od),)) for d, od in _by_index(x, idx, m)]
        sigs += [((B, S(j)), (S(m + j),)) for j in range(len(idx))]
    sigs.append(((P,) + (B,) * (n - 1), (P,)))
    return sigs


@sbp_rule("index_add")
def _index_add(metas: list, attrs: dict) -> list[Signature]:
    n = len(metas)
    sigs: list[Signature] = []
    m = _one_index(attrs["key"], len(metas[0].shape)) if n == 3 else None
    x, value = metas[0].shape, metas[1].shape
    if m is not None:
        idx = metas[2].shape
        if value == x[:m] + idx + x[m + 1 :]:  # (a value broadcast to it: no split)
            sigs += [((S(d), S(od), B), (S(d),)) for d, od in _by_index(x, idx, m)]
            sigs += [((P, S(m + j), S(j)), (P,)) for j in range(len(idx))]
    sigs.append(((P, P) + (B,) * (n - 2), (P,)))
    return sigs


@sbp_rule("index_put")
def _index_put(metas: list, attrs: dict) -> list[Signature]:
    """``x[mask] = v`` with a mask of x's whole shape and a number (or a 0-dim tensor) for
    v writes each element by its own mask element: x and the mask split alike, on any dim.
    Any other key names positions of the whole tensor (broadcast only), and a summand of a
    partial sum cannot take a write (each would hold v)."""
    n = len(metas)
    hv = attrs["has_value"]
    key = attrs["key"]
    sigs: list[Signature] = []
    if attrs["masked"] and len(key) == 1 and type(key[0]) is Slot and n == 2 + hv:
        x, mask = metas[0].shape, metas[-1].shape
        if mask == x and (not hv or metas[1].shape == ()):
            value = (B,) if hv else ()
            sigs += [((S(d), *value, S(d)), (S(d),)) for d in range(len(x))]
    sigs.append(((B,) * n, (B,)))
    return sigs


@sbp_rule("class_index")
def _class_index(metas: list, attrs: dict) -> list[Signature]:
    return [((S(d),), (S(d), S(d))) for d in range(len(metas[0].shape))]


# -- pad / pad_backward --------------------------------------------------------------------
# A dim padded by (0, 0) is copied as it is: it splits. The others read across the whole
# dim (reflect, circular) or are offset (constant): no split. Padding is linear where what
# it adds is linear in x (modes reading x's own elements, or a constant zero): P -> P.
# pad_backward sums back through the same maps (linear always) and names the input's
# shape: each rank is given its part's shape (LOCALIZE).


@sbp_rule("pad")
def _pad(metas: list, attrs: dict) -> list[Signature]:
    sigs: list[Signature] = [
        ((S(d),), (S(d),)) for d, p in enumerate(attrs["pads"]) if tuple(p) == (0, 0)
    ]
    value = attrs.get("value")
    if attrs["mode"] != "constant" or (not isinstance(value, bool) and value == 0):
        sigs.append(((P,), (P,)))
    return sigs


@sbp_rule("pad_backward")
def _pad_backward(metas: list, attrs: dict) -> list[Signature]:
    sigs: list[Signature] = [
        ((S(d),), (S(d),)) for d, p in enumerate(attrs["pads"]) if tuple(p) == (0, 0)
    ]
    sigs.append(((P,), (P,)))
    return sigs


LOCALIZE["pad_backward"] = _shape_attr


# -- normalization -------------------------------------------------------------------------
# layer_norm normalizes each row of the last ``dims`` dims: a leading dim splits, x and the
# row statistics (shape: the leading dims) alike, weight and bias whole. Its backward's
# input gradient splits the same way; the weight's and bias's are sums over the rows, so
# each rank's is a summand: (S(d), S(d), S(d), S(d), B) -> (S(d), P, P).
# batch_norm's statistics are per channel over the batch and the spatial dims: only the
# channel dim (1) splits, with every per-channel tensor (weight, bias, mean, var, the
# weight's and bias's gradients) split on its dim 0. Not the batch: the statistics are
# over it. Both backwards are linear in the incoming gradient with the rest fixed:
# (P, B, ...) -> (P, P, P).


@sbp_rule("layer_norm")
def _layer_norm(metas: list, attrs: dict) -> list[Signature]:
    nd, n = len(metas[0].shape), len(metas)
    lead = nd - attrs["dims"]
    return [((S(d),) + (B,) * (n - 1), (S(d),) * 3) for d in range(lead)]


@sbp_rule("layer_norm_backward")
def _layer_norm_backward(metas: list, attrs: dict) -> list[Signature]:
    nd, n = len(metas[1].shape), len(metas)
    lead = nd - attrs["dims"]
    sigs: list[Signature] = [((S(d),) * 4 + (B,) * (n - 4), (S(d), P, P)) for d in range(lead)]
    sigs.append(((P,) + (B,) * (n - 1), (P, P, P)))
    return sigs


@sbp_rule("batch_norm")
def _batch_norm(metas: list, attrs: dict) -> list[Signature]:
    n = len(metas)
    return [((S(1),) + (S(0),) * (n - 1), (S(1), S(0), S(0)))]


@sbp_rule("batch_norm_backward")
def _batch_norm_backward(metas: list, attrs: dict) -> list[Signature]:
    n = len(metas)
    return [
        ((S(1), S(1)) + (S(0),) * (n - 2), (S(1), S(0), S(0))),
        ((P,) + (B,) * (n - 1), (P, P, P)),
    ]


# -- convolutions --------------------------------------------------------------------------
# conv2d (x (N, C, H, W), weight (O, C/g, kh, kw)): the batch splits with the weight whole;
# with groups=1 the output channels split as the weight's rows (x whole), and the input
# channels as x's and the weight's dim 1 together, each rank a summand of every output
# (the op has no bias: a bias is added after, so S(1) x S(1) -> P is exact). Groups > 1
# tie channel blocks to groups: no channel split. A convolution is linear in each operand:
# (P, B) and (B, P) -> P. conv_transpose2d (weight (C, O/g, kh, kw)) the same with the
# weight's dims swapped; conv2d_weight (x, the output's gradient (N, O, oh, ow)) sums over
# the batch: (S(0), S(0)) -> P, and its output's dims are the out (0) and in (1) channels.
# unfold/fold: the batch splits (a channel's kh*kw block rows do not split evenly with the
# channels); both are linear.


@sbp_rule("conv2d")
def _conv2d(metas: list, attrs: dict) -> list[Signature]:
    sigs: list[Signature] = [((S(0), B), (S(0),))]
    if attrs["groups"] == 1:
        sigs += [((B, S(0)), (S(1),)), ((S(1), S(1)), (P,))]
    return sigs + [((P, B), (P,)), ((B, P), (P,))]


@sbp_rule("conv_transpose2d")
def _conv_transpose2d(metas: list, attrs: dict) -> list[Signature]:
    sigs: list[Signature] = [((S(0), B), (S(0),))]
    if attrs["groups"] == 1:
        sigs += [((B, S(1)), (S(1),)), ((S(1), S(0)), (P,))]
    return sigs + [((P, B), (P,)), ((B, P), (P,))]


@sbp_rule("conv2d_weight")
def _conv2d_weight(metas: list, attrs: dict) -> list[Signature]:
    sigs: list[Signature] = [((S(0), S(0)), (P,))]
    if attrs["groups"] == 1:
        sigs += [((B, S(1)), (S(0),)), ((S(1), B), (S(1),))]
    return sigs + [((P, B), (P,)), ((B, P), (P,))]


@sbp_rule("unfold", "fold")
def _unfold(metas: list, attrs: dict) -> list[Signature]:
    return [((S(0),), (S(0),)), ((P,), (P,))]


# -- pools ---------------------------------------------------------------------------------
# A pool works on each (sample, channel) plane alone: the batch and the channels split
# (max_pool2d's indices are flat within a plane, so its backward splits the same with
# them). Average pools and every pool's backward are linear (in the gradient, the indices
# fixed): P -> P; max pooling is not.


@sbp_rule("max_pool2d")
def _max_pool(metas: list, attrs: dict) -> list[Signature]:
    return [((S(0),), (S(0), S(0))), ((S(1),), (S(1), S(1)))]


@sbp_rule("max_pool2d_backward")
def _max_pool_backward(metas: list, attrs: dict) -> list[Signature]:
    return [((S(0), S(0)), (S(0),)), ((S(1), S(1)), (S(1),)), ((P, B), (P,))]


@sbp_rule(
    "avg_pool2d", "avg_pool2d_backward", "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward"
)
def _avg_pool(metas: list, attrs: dict) -> list[Signature]:
    return [((S(0),), (S(0),)), ((S(1),), (S(1),)), ((P,), (P,))]


# -- ops without a rule --------------------------------------------------------------------
# (each broadcast only, the all-broadcast signature alone; tests/test_global_ops.py lists
# them with their reasons): the factories with no inputs (empty, full, arange, rand, randn)
# take no signature at all: the global interpreter makes each rank's part (``_factory``);
# rand_step/randn_step draw by the whole shape (a part would draw other values), so their
# output is whole on every rank; masked_index and nonzero have value-dependent shapes.
