"""Device: where a tensor lives. 'cpu', 'cuda:N' or 'null' / 'null:N' (no data, simulated
time; each index is a device of its own, with its own memory, e.g. two budgeted stand-ins)."""

from __future__ import annotations

from typing import Any, TypeAlias

from .errors import DeviceError

KNOWN_TYPES = ("cpu", "cuda", "null")


class Device:
    """A device: ``type`` ('cpu', 'cuda', 'null') and ``index``. Interned: one object each.

    Example: ``af.device("cuda:1").index == 1``; ``af.device("null:1")`` is a second null
    device (its own allocator and budget); ``"null:0"`` is ``"null"``.
    """

    __slots__ = ("type", "index", "_str", "_hash", "backend", "metas")
    # a global tensor's layout (``sbp.Layout``) is a Device too, with ``placed`` True: the
    # one test the eager interpreter makes to send a call to the global interpreter
    placed = False

    def __init__(self, type: str, index: int) -> None:
        self.type, self.index = type, index
        self._str = f"{type}:{index}" if type == "cuda" or index else type
        self._hash = hash(self._str)
        # its backends.Backend (a layer above: not named here), set by
        # actorflow.backends.get_backend on first use
        self.backend: Any = None
        self.metas: dict[
            tuple[Any, Any], Any
        ] = {}  # (shape, dtype) -> contiguous TensorMeta (tensor/meta.py)

    def __repr__(self) -> str:
        return f"device(type='{self.type}', index={self.index})"

    def __str__(self) -> str:
        return self._str

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = device(other)
            except (DeviceError, TypeError):
                return False
        return self is other

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (device, (self._str,))


# a device as functions take it: a Device or its name ('cpu', 'cuda:1')
_DeviceLike: TypeAlias = Device | str

_CACHE: dict = {}  # (spec, index) as given -> Device
_INTERNED: dict = {}  # (type, index) -> Device


def device(spec: _DeviceLike = "cpu", index: int | None = None) -> Device:
    """Returns the Device for 'cpu', 'null', 'null:N', 'cuda', 'cuda:N' (or a Device).

    Raises DeviceError for an unknown name, with the accepted forms.
    """
    if isinstance(spec, Device) and index is None:
        return spec
    key_in = (spec, index)
    d = _CACHE.get(key_in) if isinstance(spec, str) else None
    if d is not None:
        return d
    if not isinstance(spec, str):
        raise DeviceError(f"expected a device such as 'cpu', 'cuda:0' or 'null', got {spec!r}")
    text = spec.strip().lower()
    kind, _, idx = text.partition(":")
    if kind not in KNOWN_TYPES:
        raise DeviceError(
            f"unknown device {spec!r}; use 'cpu', 'cuda', 'cuda:N', 'null' or 'null:N'"
        )
    if idx:
        if not idx.isdigit() or index is not None:
            raise DeviceError(f"cannot read a device index from {spec!r}; write e.g. 'cuda:0'")
        index = int(idx)
    if index is None:
        index = 0
    if kind == "cpu" and index != 0:
        raise DeviceError(f"device '{kind}' has only index 0, got {spec!r}")
    d = _INTERNED.get((kind, index))
    if d is None:
        d = _INTERNED[(kind, index)] = Device(kind, index)
    _CACHE[key_in] = d
    return d
