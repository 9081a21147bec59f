"""Global tensors: one tensor laid out over a placement's ranks by an SBP (see ``sbp.py``);
ops on them run on every rank's part (``interpreter``), conversions between layouts are
boxing (``boxing``), what each op accepts is its SBP rule (``rules``), and who holds the
parts is a ``Ranks`` (``ranks``): kept in this process, worker processes, or Ray actors
(``ray_ranks``) (``use_ranks``)."""

from __future__ import annotations

from typing import Any

from ..sbp import Placement
from ..tensor.tensor import Tensor, wrap
from .interpreter import part, to_layout
from .ranks import KINDS, InlineRanks, ProcessRanks, ranks_of, use_ranks
from .recording import Recording, record


def _ray_ranks(placement: Placement, threads: int | None = None) -> Any:
    """Ray ranks (``ray_ranks``), imported (and Ray with them) only when a placement first
    runs on them."""
    from .ray_ranks import RayRanks

    return RayRanks(placement, threads=threads)


KINDS["ray"] = _ray_ranks


def to_global(x: Tensor, placement: Placement | None = None, sbp: Any = None) -> Tensor:
    """``x`` as a global tensor on ``placement`` laid out by ``sbp`` (each left out: x's
    own, for a global ``x``). A local ``x`` is the whole value: each rank gets its part of
    it; a global one is converted (boxed). Differentiable. Always a new tensor.

    Example: ``w.to_global(af.placement("cpu", ranks=2), af.sbp.broadcast)``"""
    from ..eager.interpreter import apply
    from ..ops import get as op_def

    if not isinstance(x, Tensor):
        raise TypeError(f"to_global: expected a Tensor, got {type(x).__name__}")
    lay = to_layout(placement, sbp, x._impl, "to_global")
    return wrap(apply(op_def("copy"), [x._impl], {}, device=lay)[0])


def to_local(x: Tensor, rank: int | None = None) -> Tensor:
    """A global tensor's whole value as a local tensor (partial sums added, splits joined);
    with ``rank``, a copy of that rank's part alone (an index into the placement's ranks),
    which autograd does not follow. A local ``x`` is returned as it is."""
    if not isinstance(x, Tensor):
        raise TypeError(f"to_local: expected a Tensor, got {type(x).__name__}")
    impl = x._impl
    if not impl.meta.device.placed:
        if rank is not None:
            raise ValueError("to_local(rank=...): the tensor is local already")
        return x
    if rank is not None:
        return wrap(part(impl, rank))
    from ..device import device
    from ..eager.interpreter import apply
    from ..ops import get as op_def

    return wrap(apply(op_def("copy"), [impl], {}, device=device("cpu"))[0])


__all__ = [
    "to_global",
    "to_local",
    "record",
    "Recording",
    "use_ranks",
    "ranks_of",
    "InlineRanks",
    "ProcessRanks",
]
