"""The global interpreter: an op call on global tensors run as the same op on every rank's
parts, as OneFlow's eager global mode does.

A global tensor is a ``TensorImpl`` whose meta is the logical one (its whole shape, its
dtype, its ``sbp.Layout`` as the device) over a ``GlobalBlob`` holding one part per rank.
A call: the op's ``infer`` on the logical metas (so errors name the logical shapes), its
signatures (``rules.signatures``), the one whose boxing moves the fewest bytes picked,
the inputs boxed (``boxing.box``), the op run on each rank (``Ranks.call``), and each
output's parts checked against the shapes its layout promises (a wrong rule is an internal
error, never a wrong answer). The eager interpreter sends a call here when an operand's
device is placed (``eager.interpreter.use_global``); views of global tensors come here
from ``tensor/views`` (``GLOBAL_VIEW``). Autograd records the global call like any other,
and its rules' ops are global calls too: so a broadcast parameter's gradient comes back as
a partial sum, and the engine's conversion of a gradient to its input's device boxes it
(``P -> B``, the all-reduce of data parallelism).
"""

from __future__ import annotations

import weakref
from typing import Any, cast

from ..backends import get_backend
from ..device import Device, device
from ..dtype import DType
from ..eager.interpreter import apply, attrs_key, use_global
from ..errors import DeviceError, ShapeError, VMError
from ..ops import get as op_def
from ..sbp import SBP, Layout, Placement, as_sbp, broadcast, layout, split, split_sizes
from ..tensor import views
from ..tensor.blob import RELEASED, Blob
from ..tensor.impl import TensorImpl
from ..tensor.meta import TensorMeta, contiguous_meta, numel
from ..vm.release import collect
from ..vm.scheduler import get_vm
from . import recording
from .boxing import box, cost, local_cost, local_shape, transposed
from .ranks import Ranks, ranks_of
from .rules import LOCALIZE, signatures, split_matches

_COPY = op_def("copy")
_MEAN, _SUM, _DIV_SCALAR = op_def("mean"), op_def("sum"), op_def("div_scalar")
# the signature the latest op call on global tensors that picks one ran under, (in sbps,
# out sbps) (conversions and factories pick none and leave it): what tests read to know
# which one the interpreter picked (one store per call)
CHOSEN: list = [None]
# what a call decided (output specs, signature), per signature: the op, its inputs' metas
# (their layouts included), its attrs (``eager.interpreter.attrs_key``; a call whose attrs
# cannot be keyed decides anew), the layouts written in place, the rank count
_DECIDED: dict = {}
DECIDED_MAX = 4096


class GlobalBlob(Blob):
    """A global tensor's storage: its parts, one per rank of ``ranks`` (kept by the ranks'
    kind: tensors of this process, or handles of a worker's)."""

    __slots__ = ("parts", "ranks", "gathered", "source", "copies", "stale")

    def __init__(
        self,
        lay: Layout,
        ranks: Ranks,
        parts: list,
        gathered: bool = False,
        source: GlobalBlob | None = None,
    ) -> None:
        # the backend reading it uses: the whole value is read on the host (a placement
        # of a device type without data has none)
        super().__init__(lay, _reader_backend(lay.placement.type), 0)
        self.ranks = ranks
        self.parts = parts
        # a view taken of a gathered copy (its split dim did not survive the view): its
        # parts are not the viewed tensor's, so it cannot be written in place, and a write
        # into the tensor after it was taken makes it stale (reading it then raises)
        self.gathered = gathered
        self.source = source  # a view's: the blob whose parts its parts view (the root)
        self.copies: weakref.WeakSet | None = None  # a root's gathered views, made stale
        self.stale = False  # by a write into the root or into a view of it

    # A view's version is its root's: a write in place into the root or into any view of
    # it is seen by every tensor autograd saved over the same parts (a local view shares
    # its base's blob, and so its version, in the same way).
    @property
    def version(self) -> int:
        src = getattr(self, "source", None)  # (unset while Blob.__init__ runs)
        return _VERSION.__get__(self if src is None else src)

    @version.setter
    def version(self, value: int) -> None:
        src = getattr(self, "source", None)
        _VERSION.__set__(self if src is None else src, value)


_VERSION = Blob.__dict__["version"]  # (the slot Blob keeps a version in)


def root_of(blob: Any) -> Any:
    return blob.source if blob.source is not None else blob


def _reader_backend(device_type: str):
    return get_backend(device("null" if device_type == "null" else "cpu"))


def make(ranks: Ranks, parts: list, shape: tuple, dtype: DType, sbp: SBP) -> TensorImpl:
    """A global tensor over ``parts`` (one per rank) of logical ``shape`` laid out ``sbp``."""
    lay = layout(ranks.placement, (sbp,))
    return TensorImpl(contiguous_meta(shape, dtype, lay), GlobalBlob(lay, ranks, parts))


def parts_of(impl: TensorImpl) -> list:
    b: Any = impl.blob
    if b.stale or (b.source is not None and b.source.stale):
        raise DeviceError(
            f"a view of a global tensor (of shape {tuple(impl.meta.shape)}) that was made as "
            f"a copy, since the view does not keep the tensor's split dim whole, and the "
            f"tensor was written in place after it: the copy no longer matches the tensor; "
            f"take the view again after the write, or convert the tensor to broadcast "
            f"first (x = x.to_global(sbp=af.sbp.broadcast)) so that its views are views"
        )
    return b.parts


def sbp_of(impl: TensorImpl) -> SBP:
    return cast(Layout, impl.meta.device).sbp[0]


def _ranks(impl: TensorImpl) -> Ranks:
    return impl.blob.ranks  # type: ignore[attr-defined]


def _check_parts(what: str, ranks: Ranks, parts: list, shape: tuple, sbp: SBP) -> None:
    k = ranks.size
    for r, p in enumerate(parts):
        got = ranks.meta(p).shape
        want = local_shape(shape, sbp, r, k)
        if got != want:
            raise VMError(
                f"internal error: {what} gave rank {r} a part of shape {got}, but a global "
                f"tensor of shape {shape} laid out {sbp} has {want} there (an sbp rule is "
                f"wrong)"
            )


# -- op calls ------------------------------------------------------------------------------


def global_apply(op, inputs, attrs, device, outs):
    """An op call the eager interpreter found global (see the module doc)."""
    if RELEASED:  # (blobs autograd let go of: freed here, a global program submits no
        collect(get_vm(), submit_pending=False)  # local work that would collect them)
    if outs:
        _check_writable(op, outs)
    if op is _COPY and device is not None:
        if len(inputs) != 1:
            raise DeviceError("copy to a placement takes one tensor")
        if outs and not outs[0].meta.device.placed:  # a local tensor written from a
            whole = _to_local(inputs[0], outs[0].meta.device)  # global one: its whole value
            return apply(_COPY, [whole], {}, None, outs)
        if outs:  # copy_(dst, src): src broadcast to dst's shape, laid out as dst
            src, dst = inputs[0], outs[0]
            if src.meta.shape != dst.meta.shape:
                src = views.expand(src, dst.meta.shape)
            return _write_into(outs, [convert(src, dst.meta.device)])
        return [convert(inputs[0], device, copy=True)]
    if op is _MEAN and not outs and _split_reduced(inputs[0], attrs):
        return _mean_of_split(inputs[0], attrs)
    if not inputs:
        if outs:  # fill_: made laid out as the tensor written, then copied into its parts
            return _write_into(outs, [_factory(op, attrs, outs[0].meta.device, _ranks(outs[0]))])
        return [_factory(op, attrs, device)]
    first = inputs[0].meta.device
    for i in inputs:
        if not i.meta.device.placed:  # (the eager interpreter let one through: device=)
            raise DeviceError(
                f"op {op.name!r}: a local tensor on {i.meta.device} given with global "
                f"ones; make it global with .to_global(placement, sbp)"
            )
    if (
        device is not None
        and device is not first
        and not (device.placed and device.placement is first.placement)
    ):
        raise DeviceError(
            f"op {op.name!r} on global tensors cannot also move them to {device}; "
            f"use .to_global(...) or .to_local() before or after"
        )
    ranks = _ranks(inputs[0])
    if any(_ranks(i) is not ranks for i in inputs):
        inputs, ranks = _onto_one(inputs, outs)
    k = ranks.size
    metas = [i.meta for i in inputs]
    key = attrs_key(op, attrs)
    if key is not None:
        key = (op, tuple(metas), key, None if not outs else tuple(o.meta for o in outs), k)
        decided = _DECIDED.get(key)
    else:
        decided = None
    fresh = decided is None
    if fresh:
        decided = _decide(op, metas, attrs, outs, k)
        if key is not None:
            if len(_DECIDED) >= DECIDED_MAX:
                _DECIDED.clear()
            _DECIDED[key] = decided
    specs, (in_sbps, out_sbps) = decided
    CHOSEN[0] = (in_sbps, out_sbps)
    current = [sbp_of(i) for i in inputs]
    if recording.OPEN:
        recording.note(recording.Call(op.name, tuple(current), in_sbps, out_sbps))
    boxed = [
        box(ranks, parts_of(i), c, w, m.shape, m.dtype)
        for i, c, w, m in zip(inputs, current, in_sbps, metas, strict=True)
    ]
    localize = LOCALIZE.get(op.name)
    results = []
    for r in range(k):
        ins = [b[r] for b in boxed]
        a = attrs
        if localize is not None:
            a = localize(
                attrs,
                [
                    local_shape(shape, s, r, k)
                    for (shape, _), s in zip(specs, out_sbps, strict=True)
                ],
            )
        o = None if not outs else [parts_of(x)[r] for x in outs]
        results.append(ranks.call(r, op, ins, a, o))
    if outs:
        return outs
    made = []
    for n, ((shape, dtype), s) in enumerate(zip(specs, out_sbps, strict=True)):
        parts = [res[n] for res in results]
        if shape is None:  # a value-dependent shape, computed the same on every rank (B)
            shape = ranks.meta(parts[0]).shape
            for r, p in enumerate(parts):
                if ranks.meta(p).shape != shape:
                    raise VMError(
                        f"internal error: {op.name!r} gave ranks different shapes "
                        f"({shape} on rank 0, {ranks.meta(p).shape} on rank {r})"
                    )
        elif fresh:  # (a decision seen before was checked then: same shapes)
            _check_parts(f"op {op.name!r}", ranks, parts, shape, s)
        made.append(make(ranks, parts, shape, dtype, s))
    return made


def _split_reduced(x: TensorImpl, attrs: dict) -> bool:
    """Whether a reduction's input is split along a dim it reduces."""
    s = sbp_of(x)
    dims = attrs["dims"]
    return s.dim is not None and (dims is None or s.dim in dims)


def _mean_of_split(x: TensorImpl, attrs: dict) -> list:
    """A mean over a dim its input is split along, as the sum of each rank's part (a
    partial sum) over the whole count: a rank's own mean would divide by its part's count.
    (Each rank's parts summed, not the whole tensor padded: no rank computes more than its
    part.)"""
    m = x.meta
    dims = attrs["dims"]
    n = 1
    for d in range(len(m.shape)) if dims is None else dims:
        n *= m.shape[d]
    dtype = attrs.get("dtype") or m.dtype
    total = apply(_SUM, [x], {"dims": dims, "keepdim": attrs["keepdim"], "dtype": dtype})[0]
    return apply(_DIV_SCALAR, [total], {"scalar": float(n)})


def _decide(op, metas: list, attrs: dict, outs, k: int) -> tuple:
    """``(output specs, (in_sbps, out_sbps))`` of a call: ``infer`` on the logical metas,
    the op's signatures (those giving ``outs``' layouts for an in-place call), the one
    whose boxing moves the fewest bytes, then the fewest local conversions, then the
    first listed. A function of the call's signature alone: kept in ``_DECIDED``."""
    specs = op.infer(metas, attrs)
    n_out = len(specs)
    dynamic = any(shape is None for shape, _ in specs)
    if dynamic:
        sigs = [((broadcast,) * len(metas), (broadcast,) * n_out)]
    elif (
        outs
        and (op.elementwise or op is _COPY)
        and any(m.shape != outs[0].meta.shape for m in metas)
    ):
        # in place into a tensor the inputs broadcast to (copy_ of a row into a matrix):
        # splits that line up with the output, the rule's partial sums (linearity does not
        # depend on shapes), broadcast
        sigs = split_matches(metas, outs[0].meta.shape, in_place=True)
        if op is not _COPY:
            sigs += [
                s for s in signatures(op, metas, attrs, n_out) if all(o.kind == "P" for o in s[1])
            ]
        sigs.append(((broadcast,) * len(metas), (broadcast,)))
    else:
        sigs = signatures(op, metas, attrs, n_out)
    if outs:
        want = tuple(sbp_of(o) for o in outs)
        sigs = [s for s in sigs if s[1] == want]
        if not sigs:
            raise DeviceError(
                f"op {op.name!r} cannot write in place into a global tensor laid out "
                f"{', '.join(map(str, want))} from inputs of shapes "
                f"{[tuple(m.shape) for m in metas]}: no signature of the op gives that "
                f"layout; make the tensor broadcast first (x = x.to_global(sbp="
                f"af.sbp.broadcast)), or compute the new value out of place (for an "
                f"indexed write, af.where(mask, value, x))"
            )
    current = [m.device.sbp[0] for m in metas]
    sizes = [_nbytes(m) for m in metas]
    best = min(
        range(len(sigs)),
        key=lambda n: (
            sum(cost(c, w, b, k) for c, w, b in zip(current, sigs[n][0], sizes, strict=True)),
            sum(local_cost(c, w) for c, w in zip(current, sigs[n][0], strict=True)),
            n,
        ),
    )
    return specs, sigs[best]


def _check_writable(op, outs: list) -> None:
    """Refuses a write into a view made as a copy; a write into a tensor makes the copies
    taken of it stale."""
    for o in outs:
        b: Any = o.blob
        if isinstance(b, GlobalBlob) and not b.gathered:
            root = root_of(b)
            if root.copies:
                for c in list(root.copies):
                    c.stale = True
                root.copies.clear()
        if getattr(o.blob, "gathered", False):
            raise DeviceError(
                f"op {op.name!r} cannot write in place into this view of a global tensor: "
                f"the view does not keep the tensor's split dim whole (of shape "
                f"{tuple(o.meta.shape)}, laid out {sbp_of(o)}, it is a view of a gathered "
                f"copy), so a write would not reach the tensor; convert the tensor to "
                f"broadcast first (x = x.to_global(sbp=af.sbp.broadcast)) or compute the "
                f"new value out of place"
            )


def _write_into(outs: list, made: list) -> list:
    """Copies each global tensor of ``made`` into the parts of the same-laid-out ``outs``."""
    for o, m in zip(outs, made, strict=True):
        ranks = _ranks(o)
        if _ranks(m) is not ranks:  # (made on ranks of another kind: brought over)
            m = _onto_one([m], [o])[0][0]
        for r, (dst, src) in enumerate(zip(parts_of(o), parts_of(m), strict=True)):
            ranks.call(r, _COPY, [src], {}, [dst])
    return outs


def _onto_one(inputs: list, outs) -> tuple[list, Ranks]:
    """Inputs on one placement held by different ranks (made under different kinds of
    ranks: ``use_ranks``; autograd's seed made after a ``with use_ranks(...)`` block) all
    on the ranks of the output written in place, else of the largest input: the others
    brought over through this process."""
    home = _ranks(outs[0]) if outs else _ranks(max(inputs, key=lambda i: _nbytes(i.meta)))
    moved = []
    for i in inputs:
        if _ranks(i) is not home:
            m = i.meta
            whole = _to_local(i, device("cpu"))
            put = [home.put(r, whole) for r in range(home.size)]
            parts = box(home, put, broadcast, sbp_of(i), m.shape, m.dtype)
            i = make(home, parts, m.shape, m.dtype, sbp_of(i))
        moved.append(i)
    return moved, home


def _nbytes(m: TensorMeta) -> int:
    return numel(m.shape) * m.dtype.itemsize


def _factory(op, attrs, device, ranks: Ranks | None = None):
    """A factory call (no inputs) with ``device=`` a layout (on ``ranks``, else the
    placement's ranks of the current kind): the parts made on each rank;
    those whose values depend on where they sit (random draws, ``arange``) made whole on
    every rank and cut, so a global tensor equals the local one made the same way."""
    if not isinstance(device, Layout):
        raise DeviceError(f"op {op.name!r}: expected a placement's layout, got {device}")
    ranks = ranks or ranks_of(device.placement)
    sbp = device.sbp[0]
    shape, dtype = op.infer([], attrs)[0]
    _check_split_dim(sbp, shape)
    k = ranks.size
    localize = LOCALIZE.get(op.name)
    if localize is not None and sbp.kind != "P":
        parts = []
        for r in range(k):
            a = localize(dict(attrs, device=ranks.device(r)), [local_shape(shape, sbp, r, k)])
            parts.append(ranks.call(r, op, [], a)[0])
        return make(ranks, parts, shape, dtype, sbp)
    whole = [ranks.call(r, op, [], dict(attrs, device=ranks.device(r)))[0] for r in range(k)]
    return make(ranks, box(ranks, whole, broadcast, sbp, shape, dtype), shape, dtype, sbp)


# -- conversions ---------------------------------------------------------------------------


def convert(impl: TensorImpl, target: Device, copy: bool = False) -> TensorImpl:
    """``impl`` laid out as ``target``: a layout (from a local tensor: scattered; from a
    global one: boxed, or through this process when the placement changes) or a local
    device (the whole value, gathered). ``copy``: the result never shares a part with
    ``impl``."""
    src = impl.meta.device
    m = impl.meta
    if not target.placed:
        if not src.placed:
            raise DeviceError("internal error: convert() of a local tensor to a local device")
        return _to_local(impl, target)
    assert isinstance(target, Layout)
    # (a global tensor keeps its ranks within its placement; new parts go to the current)
    same = src.placed and cast(Layout, src).placement is target.placement
    ranks = _ranks(impl) if same else ranks_of(target.placement)
    dst = target.sbp[0]
    _check_split_dim(dst, m.shape)
    if not src.placed:  # scatter a local tensor: each rank a copy of its part
        whole = [ranks.put(r, impl) for r in range(ranks.size)]
        parts = box(ranks, whole, broadcast, dst, m.shape, m.dtype)
        return make(ranks, parts, m.shape, m.dtype, dst)
    if cast(Layout, src).placement is not target.placement:
        return convert(_to_local(impl, device("cpu")), target)
    parts = parts_of(impl)
    out = box(ranks, parts, sbp_of(impl), dst, m.shape, m.dtype)
    if copy:
        out = [ranks.call(r, _COPY, [p], {})[0] if p is parts[r] else p for r, p in enumerate(out)]
    if transposed(m) and all(transposed(ranks.meta(p)) for p in out):
        # a transposed matrix (a Linear weight's gradient, of x @ w.T) whose parts boxing
        # kept transposed: it stays one, as a local tensor moved to another device does, so
        # the transpose back (the view's backward) is contiguous and becomes .grad as it is
        lay = layout(ranks.placement, (dst,))
        return TensorImpl(m._replace(device=lay), GlobalBlob(lay, ranks, out))
    return make(ranks, out, m.shape, m.dtype, dst)


def _check_split_dim(s: SBP, shape: tuple) -> None:
    if s.dim is not None and s.dim >= len(shape):
        raise ShapeError(
            f"sbp.split({s.dim}) of a tensor of shape {tuple(shape)}: it has "
            f"{len(shape)} dims; split one of dims 0..{len(shape) - 1}"
            if shape
            else f"sbp.split({s.dim}) of a 0-dim tensor: use sbp.broadcast or sbp.partial_sum"
        )


def _to_local(impl: TensorImpl, dev: Device) -> TensorImpl:
    """The whole value of a global tensor as a local tensor on ``dev`` (rank 0's part after
    boxing to broadcast, copied to ``dev``)."""
    ranks = _ranks(impl)
    m = impl.meta
    parts = parts_of(impl)
    s = sbp_of(impl)
    if s.kind == "S":  # gathered here: one move per part, not an all-gather
        pieces = [ranks.get(r, p) for r, p in enumerate(parts)]
        whole = (
            pieces[0]
            if len(pieces) == 1
            else apply(op_def("cat"), pieces, {"dim": s.dim, "dtype": m.dtype})[0]
        )
    elif s.kind == "P":
        pieces = [ranks.get(r, p) for r, p in enumerate(parts)]
        whole = pieces[0]
        for p in pieces[1:]:
            whole = apply(op_def("add"), [whole, p], {})[0]
    else:
        whole = ranks.get(0, parts[0])
    if dev is not whole.meta.device:
        whole = apply(_COPY, [whole], {}, device=dev)[0]
    return whole


def read_whole(impl: TensorImpl) -> TensorImpl:
    """What reading a global tensor reads: its whole value, here on the host."""
    return _to_local(impl, device("cpu"))


def part(impl: TensorImpl, rank: int) -> TensorImpl:
    """A copy of rank ``rank``'s part of a global tensor, as a local host tensor."""
    ranks = _ranks(impl)
    if not 0 <= rank < ranks.size:
        raise IndexError(
            f"to_local(rank={rank}): the placement {ranks.placement!r} has ranks "
            f"0..{ranks.size - 1} (indices into its rank list)"
        )
    return ranks.get(rank, parts_of(impl)[rank])


def to_layout(placement: Placement | None, sbp: Any, impl: TensorImpl, op: str) -> Layout:
    """The layout ``to_global(placement, sbp)`` asks for, the tensor's own where left out."""
    src = impl.meta.device
    if placement is None:
        if not src.placed:
            raise DeviceError(
                f"{op}: a local tensor needs a placement: .to_global(placement="
                f"af.placement('cpu', ranks=[0, 1]), sbp=af.sbp.broadcast)"
            )
        placement = cast(Layout, src).placement
    if not isinstance(placement, Placement):
        raise DeviceError(f"{op}: placement must be an af.placement(...), got {placement!r}")
    if sbp is None:
        if not src.placed:
            raise DeviceError(
                f"{op}: a local tensor needs an sbp: sbp=af.sbp.broadcast, "
                f"af.sbp.split(0) or af.sbp.partial_sum"
            )
        sbps = cast(Layout, src).sbp
    else:
        sbps = as_sbp(sbp, op)
    return layout(placement, sbps)


# -- views ---------------------------------------------------------------------------------


def global_view(name: str, impl: TensorImpl, *args: Any) -> TensorImpl:
    """A view of a global tensor: the logical view (checked as a local one would be), its
    layout, and the same view of each part with the arguments that rank's part needs."""
    m = impl.meta
    k = _ranks(impl).size
    stand_in = TensorImpl(m._replace(device=device("cpu")), impl.blob)
    logical = getattr(views, name)(stand_in, *args).meta
    shape = logical.shape
    s = sbp_of(impl)
    new_s, per_rank = _view_layout(name, m.shape, shape, s, args, k)
    src: Any = impl.blob
    gathered = src.gathered
    root = root_of(src)
    if new_s is None:  # the split dim does not survive the view: gather it first
        parts_of(impl)  # (a stale copy is refused here too)
        impl = convert(impl, layout(_ranks(impl).placement, (broadcast,)))
        s, new_s = broadcast, broadcast
        per_rank = [args] * k
        gathered = True
        root = root_of(impl.blob)
    ranks = _ranks(impl)
    parts = []
    for r, p in enumerate(parts_of(impl)):
        a = per_rank[r]
        if name == "view" and not ranks.meta(p).is_contiguous:
            p = ranks.call(r, _COPY, [p], {})[0]
        parts.append(ranks.view(r, name, p, *a))
    _check_parts(f"{name}()", ranks, parts, shape, new_s)
    lay = layout(ranks.placement, (new_s,))
    copy = gathered and not src.gathered  # (a copy: the root of its own views)
    blob = GlobalBlob(lay, ranks, parts, gathered, None if copy else root)
    if copy:  # a copy of the viewed tensor: stale after a write into it
        home = root_of(src)
        if home.copies is None:
            home.copies = weakref.WeakSet()
        home.copies.add(blob)
    return TensorImpl(TensorMeta(shape, m.dtype, lay, logical.strides, logical.offset), blob)


def _view_layout(name, in_shape, out_shape, s, args, k):
    """``(out sbp, args per rank)`` of a view of a tensor laid out ``s``, or ``(None, _)``
    where the split dim does not map onto one dim of the view."""
    same = [args] * k
    if s.kind != "S":
        return s, same  # a view is linear: partial sums and copies stay as they are
    d = s.dim
    sizes = split_sizes(in_shape[d], k)
    if name == "permute":
        dims = tuple(x % len(in_shape) for x in _dims(args[0]))
        return split(dims.index(d)), same
    if name == "unsqueeze":
        at = args[0] % (len(in_shape) + 1)
        return split(d + 1 if d >= at else d), same
    if name == "squeeze":
        dim = args[0]
        if dim is None:
            gone = [i for i, n in enumerate(in_shape) if n == 1]
        else:
            ds = (dim,) if isinstance(dim, int) else tuple(dim)
            gone = [x % len(in_shape) for x in ds if in_shape[x % len(in_shape)] == 1]
        if d in gone:
            return None, None
        return split(d - sum(1 for g in gone if g < d)), [(tuple(gone),)] * k
    if name == "expand":
        sizes_arg = tuple(_dims(args[0]))
        lead = len(sizes_arg) - len(in_shape)
        if out_shape[d + lead] != in_shape[d]:
            return None, None
        per = []
        for r in range(k):
            a = list(sizes_arg)
            a[d + lead] = sizes[r]
            per.append((tuple(a),))
        return split(d + lead), per
    if name == "view":
        pre = 1
        for x in in_shape[:d]:
            pre *= x
        acc, d2 = 1, None
        for i, x in enumerate(out_shape):
            if acc == pre:
                if x == in_shape[d] or (in_shape[d] % k == 0 and x % k == 0 and x):
                    d2 = i
                break
            acc *= x
        if d2 is None:
            return None, None
        out_sizes = split_sizes(out_shape[d2], k)
        per = []
        for r in range(k):
            shp = list(out_shape)
            shp[d2] = out_sizes[r] if out_shape[d2] != in_shape[d] else sizes[r]
            per.append((tuple(shp),) + tuple(args[1:]))
        return split(d2), per
    if name == "basic_index":
        return _index_layout(in_shape, d, args[0], k)
    raise VMError(f"internal error: no global form of the view {name!r}")


def _index_layout(in_shape, d, key, k):
    nd = len(in_shape)
    n_real = sum(1 for x in key if x is not None and x is not Ellipsis)
    out_dim = 0
    src = 0
    new_key = []
    found = None
    for x in key:
        if x is Ellipsis:
            span = nd - n_real
            if src <= d < src + span:
                found = out_dim + (d - src)
            src += span
            out_dim += span
            new_key.append(x)
        elif x is None:
            out_dim += 1
            new_key.append(x)
        elif isinstance(x, slice):
            if src == d:
                if x.indices(in_shape[d]) != (0, in_shape[d], 1):
                    return None, None
                found = out_dim
            src += 1
            out_dim += 1
            new_key.append(x if src - 1 != d else slice(None))
        else:
            if src == d:
                return None, None
            src += 1
            new_key.append(x)
    if found is None:  # d after every key entry: kept
        found = out_dim + (d - src)
    return split(found), [(tuple(new_key),)] * k


def _dims(arg) -> tuple:
    return tuple(arg) if isinstance(arg, (tuple, list)) else (arg,)


use_global(global_apply, read_whole)
views.GLOBAL_VIEW[0] = global_view
