"""Boxing: a global tensor's parts under one SBP made into its parts under another, as
OneFlow names it. Each conversion is written once, over ``Ranks``' primitives (an op on a
rank, a view, a move of a part from one rank to another), so every kind of ranks gets all
of them (what rank r does, of k):

- S(i) -> B, all-gather: every part moved to r, joined along i (k(k-1) moves);
- S(i) -> S(j), all-to-all: from each rank s the piece of its part in r's slice along j,
  joined along i (k(k-1) pieces);
- S(i) -> P: r's part padded with zeros to the whole shape (no move);
- B -> S(j): r's slice along j (no move); B -> P: rank 0 keeps its copy, the others zeros;
- P -> B, all-reduce: every part moved to r and summed in rank order, so every rank holds
  the same bits (k(k-1) moves);
- P -> S(j), reduce-scatter: r's slice of every part moved to r, summed in rank order.

Ranks that have collectives of their own (``all_reduce``, ``all_gather``,
``reduce_scatter``, ``all_to_all``: process ranks) run those conversions with them instead,
giving the same bits.

``cost`` is the bytes a conversion moves between ranks, which the interpreter minimises
when it picks an op's signature.
"""

from __future__ import annotations

from typing import Any, cast

from ..ops import get as op_def
from ..sbp import SBP, split, split_sizes, split_starts
from ..tensor.meta import numel
from . import recording
from .ranks import Ranks

_CAT = op_def("cat")
_ADD = op_def("add")
_FULL = op_def("full")
_COPY = op_def("copy")


def cost(src: SBP, dst: SBP, nbytes: int, k: int) -> float:
    """Bytes moved between ranks (all of them together) to turn a tensor of ``nbytes``
    from ``src`` into ``dst``, as the conversions below move them: S -> B (each rank gets
    the k - 1 other parts, n / k each): (k - 1) n; S -> S (k - 1 pieces of n / k^2 each):
    (k - 1) n / k; P -> B (the k - 1 other whole parts): k (k - 1) n; P -> S (the k - 1
    others' slices of n / k): (k - 1) n; B -> anything and S -> P move nothing."""
    if src is dst or k == 1:
        return 0.0
    if src.kind == "B" or dst.kind == "P" and src.kind == "S":
        return 0.0  # local slicing / zeros (cheap, but not free: a tie-breaker below)
    if src.kind == "S":
        return float(nbytes * (k - 1)) if dst.kind == "B" else nbytes * (k - 1) / k
    return float(nbytes * k * (k - 1)) if dst.kind == "B" else float(nbytes * (k - 1))


def local_cost(src: SBP, dst: SBP) -> float:
    """A tie-breaker among signatures that move nothing: conversions done on each rank
    without moving data still copy."""
    return 0.0 if src is dst else 1.0


def local_shape(shape: tuple, sbp: SBP, rank: int, k: int) -> tuple:
    """Rank ``rank``'s part's shape of a tensor of ``shape`` laid out as ``sbp``."""
    if sbp.kind != "S":
        return shape
    d = sbp.dim
    assert d is not None  # (a split has its dim)
    return shape[:d] + (split_sizes(shape[d], k)[rank],) + shape[d + 1 :]


def _narrow(ranks: Ranks, rank: int, part: Any, dim: int, start: int, size: int) -> Any:
    """A copy of ``part``'s elements [start, start + size) along ``dim``."""
    key = (slice(None),) * dim + (slice(start, start + size),)
    return ranks.call(rank, _COPY, [ranks.view(rank, "basic_index", part, key)], {})[0]


def _zeros(ranks: Ranks, rank: int, shape: tuple, dtype: Any) -> Any:
    attrs = {"shape": shape, "dtype": dtype, "device": ranks.device(rank), "value": 0}
    return ranks.call(rank, _FULL, [], attrs)[0]


def _cat(ranks: Ranks, rank: int, pieces: list, dim: int, dtype: Any) -> Any:
    if len(pieces) == 1:
        return pieces[0]
    return ranks.call(rank, _CAT, pieces, {"dim": dim, "dtype": dtype})[0]


def _sum(ranks: Ranks, rank: int, pieces: list) -> Any:
    acc = pieces[0]
    for p in pieces[1:]:
        acc = ranks.call(rank, _ADD, [acc, p], {})[0]
    return acc


def _gathered(ranks: Ranks, parts: list, rank: int, piece) -> list:
    """For rank ``rank``: ``piece(s, part)`` of every rank s's part, moved to ``rank``."""
    out = []
    for s, p in enumerate(parts):
        x = piece(s, p)
        out.append(x if s == rank else ranks.move(x, s, rank))
    return out


def box(
    ranks: Ranks, parts: list, src: SBP, dst: SBP, shape: tuple, dtype: Any, note: bool = True
) -> list:
    """The parts of a tensor of logical ``shape`` laid out as ``src``, laid out as ``dst``.
    A part that needs no change is returned as it is (the caller copies where it must
    not alias)."""
    if src is dst:
        return parts
    k = ranks.size
    if recording.OPEN and note:
        n = numel(shape) * dtype.itemsize
        recording.note(
            recording.Boxing(
                src,
                dst,
                tuple(shape),
                dtype,
                k,
                recording.COLLECTIVE[(src.kind, dst.kind)],
                int(cost(src, dst, n, k)),
            )
        )
    if len(shape) == 2 and all(transposed(ranks.meta(p)) for p in parts):
        # parts that are transposed matrices (a weight's gradient, of x @ w.T): boxed as the
        # blocks under them, and given back as transposed views, so a conversion keeps the
        # layout the gradient was made in (the values are the same: sums are elementwise,
        # splits and joins along the other dim), on every kind of ranks alike
        flat = [ranks.view(r, "permute", p, (1, 0)) for r, p in enumerate(parts)]
        out = box(ranks, flat, _flipped(src), _flipped(dst), shape[::-1], dtype, note=False)
        # (a part given back as it was is the part itself: a caller that must not alias
        # the input copies the parts it gets back unchanged, found by identity)
        return [
            parts[r] if o is flat[r] else ranks.view(r, "permute", o, (1, 0))
            for r, o in enumerate(out)
        ]
    native = _native(ranks, src, dst) if k > 1 else None
    if native is not None:  # (the same bits as the generic path below)
        return native(parts)
    out = []
    for r in range(k):
        out.append(_box_one(ranks, parts, src, dst, shape, dtype, r, k))
    return out


def transposed(m: Any) -> bool:
    """Whether a meta is the transpose of a contiguous matrix (and not one itself)."""
    s = m.shape
    return len(s) == 2 and s[0] > 1 and s[1] > 1 and m.strides == (1, s[0]) and not m.offset


def _flipped(s: SBP) -> SBP:
    """``s`` of a matrix, for its transpose (a split along dim d is one along 1 - d)."""
    return split(1 - cast(int, s.dim)) if s.kind == "S" else s


def _native(ranks: Ranks, src: SBP, dst: SBP) -> Any:
    """The ranks' own collective for a conversion that moves data, where they have one:
    ``all_reduce(parts)``, ``all_gather(parts, i)``, ``reduce_scatter(parts, j)``,
    ``all_to_all(parts, i, j)``; None for the generic path."""
    if src.kind == "P" and dst.kind == "B":
        return getattr(ranks, "all_reduce", None)
    name, args = {
        ("S", "B"): ("all_gather", (src.dim,)),
        ("P", "S"): ("reduce_scatter", (dst.dim,)),
        ("S", "S"): ("all_to_all", (src.dim, dst.dim)),
    }.get((src.kind, dst.kind), (None, ()))
    method = getattr(ranks, name, None) if name else None
    if method is None:
        return None
    return lambda parts: method(parts, *args)


def _box_one(ranks, parts, src, dst, shape, dtype, r, k):
    if src.kind == "B":
        if dst.kind == "S":
            d = dst.dim
            return _narrow(
                ranks, r, parts[r], d, split_starts(shape[d], k)[r], split_sizes(shape[d], k)[r]
            )
        return parts[r] if r == 0 else _zeros(ranks, r, shape, dtype)  # -> P
    if src.kind == "S":
        i = src.dim
        if dst.kind == "B":
            return _cat(ranks, r, _gathered(ranks, parts, r, lambda s, p: p), i, dtype)
        if dst.kind == "P":
            starts, sizes = split_starts(shape[i], k), split_sizes(shape[i], k)
            pieces = []
            before = shape[:i] + (starts[r],) + shape[i + 1 :]
            after = shape[:i] + (shape[i] - starts[r] - sizes[r],) + shape[i + 1 :]
            if starts[r]:
                pieces.append(_zeros(ranks, r, before, dtype))
            pieces.append(parts[r])
            if after[i]:
                pieces.append(_zeros(ranks, r, after, dtype))
            return _cat(ranks, r, pieces, i, dtype)
        j = dst.dim  # S(i) -> S(j): r's slice along j of every part, joined along i
        start, size = split_starts(shape[j], k)[r], split_sizes(shape[j], k)[r]
        return _cat(
            ranks,
            r,
            _gathered(ranks, parts, r, lambda s, p: _narrow(ranks, s, p, j, start, size)),
            i,
            dtype,
        )
    # P
    if dst.kind == "B":
        return _sum(ranks, r, _gathered(ranks, parts, r, lambda s, p: p))
    j = dst.dim  # P -> S(j)
    start, size = split_starts(shape[j], k)[r], split_sizes(shape[j], k)[r]
    return _sum(
        ranks, r, _gathered(ranks, parts, r, lambda s, p: _narrow(ranks, s, p, j, start, size))
    )
