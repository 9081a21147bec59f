"""Global tensors' layout: a placement (a device type and ranks) and an SBP per placement
axis, as OneFlow's global tensors have them.

A global tensor is seen whole by the program and laid out over its placement's ranks:
``split(d)`` gives each rank a slice along dim ``d`` (balanced: the first ``n % k`` ranks
one element more), ``broadcast`` a full copy everywhere, ``partial_sum`` a summand of the
value on each rank. PyTorch's DTensor calls them Shard, Replicate and Partial.

A global tensor's ``device`` is its :class:`Layout`, the pair (placement, sbp): a Device
whose ``placed`` is True, interned like every device, so a tensor's metadata says where
each part lives and the eager interpreter sends a call on such tensors to the global one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .device import KNOWN_TYPES, Device
from .errors import DeviceError


class SBP:
    """One placement axis's layout of a global tensor (``split(d)``, ``broadcast``,
    ``partial_sum``). Interned: compare with ``is`` or ``==``."""

    __slots__ = ("kind", "dim", "_str")

    def __init__(self, kind: str, dim: int | None = None) -> None:
        # dim: the split dim (S), None for B and P
        self.kind = kind  # "S", "B" or "P"
        self.dim = dim
        self._str = f"S({dim})" if kind == "S" else kind

    def __repr__(self) -> str:
        names = {"B": "broadcast", "P": "partial_sum"}
        return f"sbp.split({self.dim})" if self.kind == "S" else f"sbp.{names[self.kind]}"

    def __str__(self) -> str:
        return self._str

    def __reduce__(self) -> tuple:
        return (_sbp, (self.kind, self.dim))

    @property
    def is_split(self) -> bool:
        return self.kind == "S"


def _sbp(kind: str, dim: int | None) -> SBP:
    if kind == "S":
        assert dim is not None
        return split(dim)
    return broadcast if kind == "B" else partial_sum


broadcast = SBP("B")
partial_sum = SBP("P")
_SPLITS: dict[int, SBP] = {}


def split(dim: int) -> SBP:
    """Each rank holds a slice along ``dim`` (balanced: sizes differ by at most one)."""
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
        raise ValueError(
            f"sbp.split(dim): dim must be a non-negative int (a dim of the tensor), got {dim!r}"
        )
    s = _SPLITS.get(dim)
    if s is None:
        s = _SPLITS[dim] = SBP("S", dim)
    return s


def split_sizes(n: int, k: int) -> list[int]:
    """The sizes ``split`` gives ``k`` ranks of a dim of size ``n``: the first ``n % k``
    ranks one more."""
    q, r = divmod(n, k)
    return [q + (1 if i < r else 0) for i in range(k)]


def split_starts(n: int, k: int) -> list[int]:
    """Where each rank's slice of a dim of size ``n`` split over ``k`` ranks starts."""
    out, at = [], 0
    for s in split_sizes(n, k):
        out.append(at)
        at += s
    return out


class Placement:
    """Where a global tensor's parts live: a device type and the ranks holding one part
    each (``af.placement("cpu", ranks=[0, 1])``; ``ranks=2`` means ``[0, 1]``). Interned
    by (type, ranks). The ranks are the ranks of the world that runs them
    (``af.parallel``): worker processes, or parts kept in this process."""

    __slots__ = ("type", "ranks", "_str")
    _INTERNED: dict = {}
    type: str
    ranks: tuple[int, ...]
    _str: str

    def __new__(cls, type: str = "cpu", ranks: int | Sequence[int] = 1) -> Placement:
        if type not in KNOWN_TYPES:
            raise DeviceError(
                f"placement: unknown device type {type!r}; use one of {', '.join(KNOWN_TYPES)}"
            )
        if isinstance(ranks, int) and not isinstance(ranks, bool):
            if ranks < 1:
                raise ValueError(f"placement: ranks={ranks}: need at least one rank")
            ranks = tuple(range(ranks))
        else:
            try:
                ranks = tuple(ranks)  # type: ignore[arg-type]  # (a bool is refused below)
            except TypeError:
                raise ValueError(
                    f"placement: ranks must be a count or a list of ranks, got {ranks!r}"
                ) from None
            if (
                not ranks
                or any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks)
                or len(set(ranks)) != len(ranks)
            ):
                raise ValueError(
                    f"placement: ranks must be distinct non-negative ints, got {list(ranks)}"
                )
        key = (type, ranks)
        p = cls._INTERNED.get(key)
        if p is None:
            p = object.__new__(cls)
            p.type, p.ranks = type, ranks
            p._str = f"placement(type={type!r}, ranks={list(ranks)})"
            cls._INTERNED[key] = p
        return p

    def __repr__(self) -> str:
        return self._str

    def __reduce__(self) -> tuple:
        return (Placement, (self.type, self.ranks))

    @property
    def size(self) -> int:
        return len(self.ranks)


placement = Placement


def as_sbp(sbp: Any, op: str) -> tuple[SBP, ...]:
    """An sbp argument as a tuple, one per placement axis (one: placements are 1-D)."""
    seq = tuple(sbp) if isinstance(sbp, (list, tuple)) else (sbp,)
    if len(seq) != 1 or not isinstance(seq[0], SBP):
        raise ValueError(
            f"{op}: sbp must be one of sbp.split(d), sbp.broadcast, sbp.partial_sum (or a "
            f"1-tuple of one: placements are one-dimensional), got {sbp!r}"
        )
    return seq


class Layout(Device):
    """A global tensor's device: its placement and its sbp (a tuple, one per placement
    axis). Interned. ``placed`` is True: the eager interpreter sends a call on tensors with
    a layout to the global interpreter (``actorflow.parallel``)."""

    __slots__ = ("placement", "sbp")
    placed = True
    _INTERNED: dict = {}

    def __init__(self, placement: Placement, sbp: tuple[SBP, ...]) -> None:
        super().__init__("global", 0)
        self.placement = placement
        self.sbp = sbp
        self._str = f"{placement!r}, sbp={'(' + ', '.join(map(str, sbp)) + ',)'}"
        self._hash = hash(self._str)

    def __repr__(self) -> str:
        return f"layout({self._str})"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        return (layout, (self.placement, self.sbp))


def layout(placement: Placement, sbp: tuple[SBP, ...]) -> Layout:
    """The interned Layout of (placement, sbp)."""
    key = (placement, sbp)
    lay = Layout._INTERNED.get(key)
    if lay is None:
        lay = Layout._INTERNED[key] = Layout(placement, sbp)
    return lay
