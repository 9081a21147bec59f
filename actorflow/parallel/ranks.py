"""The ranks of a placement: who holds each part of a global tensor and runs the ops on it.

A ``Ranks`` object is what the global interpreter and boxing talk to, one method per thing
a rank does: run an op on its parts (``call``), take a view of a part (``view``), receive a
copy of another rank's part (``move``), receive a tensor from this process (``put``) and
give one back (``get``). A part is whatever the kind of ranks keeps for it; ``meta(part)``
is its local metadata.

``InlineRanks``: every rank's parts are tensors of this process, on the placement's device
type (``cpu``; ``null:r`` / ``cuda:r`` for rank r of those types), and every op runs
through the eager interpreter like any other call. It is exact and simple, and what the
tests compare the other kinds with; it computes the ranks one after another.
"""

from __future__ import annotations

from typing import Any

from ..backends import get_backend
from ..device import Device, device
from ..eager.interpreter import apply, resolve, transfer
from ..errors import DeviceError
from ..ops import get as op_def
from ..sbp import Placement
from ..tensor import views

_COPY = op_def("copy")
NO_ATTRS: dict = {}
VIEWS = {
    "view": views.view,
    "permute": views.permute,
    "unsqueeze": views.unsqueeze,
    "squeeze": views.squeeze,
    "expand": views.expand,
    "basic_index": views.basic_index,
}


class Ranks:
    """The interface (see the module doc)."""

    placement: Placement
    size: int
    kind: str = ""

    def device(self, rank: int) -> Device:
        raise NotImplementedError

    def meta(self, part: Any) -> Any:
        raise NotImplementedError

    def call(self, rank: int, op: Any, ins: list, attrs: dict, outs: list | None = None) -> list:
        raise NotImplementedError

    def view(self, rank: int, name: str, part: Any, *args: Any) -> Any:
        raise NotImplementedError

    def move(self, part: Any, src: int, dst: int) -> Any:
        raise NotImplementedError

    def put(self, rank: int, impl: Any) -> Any:
        raise NotImplementedError

    def get(self, rank: int, part: Any) -> Any:
        raise NotImplementedError


class InlineRanks(Ranks):
    kind = "inline"

    def __init__(self, placement: Placement) -> None:
        self.placement = placement
        self.size = placement.size
        t = placement.type
        try:
            self._devices = [
                device(t) if t == "cpu" else device(f"{t}:{i}") for i in range(self.size)
            ]
        except DeviceError as e:
            raise DeviceError(f"{placement}: {e}") from None

    def device(self, rank: int) -> Device:
        return self._devices[rank]

    def meta(self, part: Any) -> Any:
        if part.meta.shape is None:
            resolve(part)
        return part.meta

    def call(self, rank: int, op: Any, ins: list, attrs: dict, outs: list | None = None) -> list:
        if outs is not None:
            apply(op, ins, attrs, None, outs)
            return outs
        return apply(op, ins, attrs, self._devices[rank] if not ins else None)

    def view(self, rank: int, name: str, part: Any, *args: Any) -> Any:
        return VIEWS[name](part, *args)

    def move(self, part: Any, src: int, dst: int) -> Any:
        return self._copy(part, self._devices[dst])

    def put(self, rank: int, impl: Any) -> Any:
        return self._copy(impl, self._devices[rank])

    def get(self, rank: int, part: Any) -> Any:
        return self._copy(part, device("cpu"))

    @staticmethod
    def _copy(impl: Any, dev: Device) -> Any:
        if impl.meta.device is dev:
            return apply(_COPY, [impl], NO_ATTRS)[0]
        if get_backend(dev).host_memory and impl.blob.backend.host_memory:
            return apply(_COPY, [impl], NO_ATTRS, device=dev)[0]
        return transfer(impl, dev)  # across the host boundary


_GROUPS: dict = {}
# the kind of ranks a placement gets: "inline" (this process) until a world is started
KIND = ["inline"]


def ranks_of(placement: Placement) -> Ranks:
    """The ranks running ``placement`` in the current world (made once per placement)."""
    key = (KIND[0], placement)
    g = _GROUPS.get(key)
    if g is None:
        if KIND[0] != "inline":
            raise DeviceError(f"no ranks of kind {KIND[0]!r} are built")
        g = _GROUPS[key] = InlineRanks(placement)
    return g
