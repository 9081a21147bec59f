"""Spec: the shape, dtype and device of one array of a piece; and the piece helpers.

A piece (what flows between actors) is an array or tensor, a Python scalar, None, or a
tuple, list or dict of pieces. ``piece_spec`` describes one as the same structure with a
``Spec`` at each leaf; a register holds arrays laid out by that structure.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from ...device import Device
from ...device import device as as_device
from ...dtype import DType, as_dtype, float32, from_numpy_dtype
from ...errors import DeviceError, DTypeError, ShapeError, format_bytes
from ...tensor.meta import TensorMeta, as_shape
from ...tensor.tensor import Tensor


class Spec:
    """Shape, dtype and device of one array: what a register holds.

    Args:
        shape: a tuple of non-negative ints (or one int).
        dtype: any dtype actorflow accepts (default float32).
        device: "cpu", "null" (or "null:N") or "cuda:N" (default cpu).

    A register on the null device has a size but no data: an actor writing it computes
    nothing and gives None, or a stand-in of this shape and dtype (a null-device tensor such
    as ``af.empty(shape, dtype, device="null")``, or an array), which is checked; an actor
    reading it gets None in place of the array.

    Example::

        af.Spec((256, 784), af.float32)          # 784 KiB per register
        af.Spec((1 << 18,), af.float32, "null")  # 1 MiB, sizes and time only
    """

    __slots__ = ("shape", "dtype", "device")

    def __init__(
        self,
        shape: int | Sequence[int],
        dtype: DType | str | type | np.dtype = float32,
        device: str | Device = "cpu",
    ) -> None:
        self.shape = as_shape(shape, "Spec")
        self.dtype: DType = as_dtype(dtype)
        self.device: Device = device if isinstance(device, Device) else as_device(device)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @staticmethod
    def of(
        value: Tensor | np.ndarray | bool | int | float, device: str | Device | None = None
    ) -> Spec:
        """The Spec of an array, tensor or Python scalar."""
        if isinstance(value, Tensor):
            m = cast(TensorMeta, value._impl.meta)  # (a tensor's impl has its meta)
            return Spec(m.shape, m.dtype, device or m.device)
        arr = np.asarray(value)
        return Spec(arr.shape, from_numpy_dtype(arr.dtype, "Spec.of"), device or "cpu")

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, Spec)
            and self.shape == other.shape
            and self.dtype is other.dtype
            and self.device is other.device
        )

    def __hash__(self) -> int:
        return hash((self.shape, self.dtype, self.device))

    def __repr__(self) -> str:
        dev = "" if self.device.type == "cpu" else f", device='{self.device}'"
        return f"Spec({self.shape}, {self.dtype}{dev})"

    def describe(self, sizes: bool = True) -> str:
        text = f"{self.dtype.name}{list(self.shape)} on {self.device}"
        return text + f" ({format_bytes(self.nbytes)})" if sizes else text


# -- pieces as trees of arrays -------------------------------------------------------------


def flatten(piece) -> tuple[list, object]:
    """``(leaves, structure)``: the arrays of a piece in a fixed order, and how to rebuild it.
    Leaves are anything that is not a tuple, list, dict or None."""
    leaves: list = []
    return leaves, _flatten(piece, leaves)


def _flatten(piece, leaves):
    if piece is None:
        return None
    if isinstance(piece, (tuple, list)):
        return (type(piece), tuple(_flatten(p, leaves) for p in piece))
    if isinstance(piece, dict):
        keys = tuple(piece)
        return (dict, keys, tuple(_flatten(piece[k], leaves) for k in keys))
    leaves.append(piece)
    return 0


def unflatten(structure, leaves) -> Any:
    """Rebuilds a piece of ``structure`` from ``leaves`` (consumed in order)."""
    it = iter(leaves)
    return _unflatten(structure, it)


def _unflatten(s, it):
    if s is None:
        return None
    if s == 0:
        return next(it)
    if s[0] is dict:
        return {k: _unflatten(c, it) for k, c in zip(s[1], s[2], strict=True)}
    kind, children = s
    items = [_unflatten(c, it) for c in children]
    return tuple(items) if kind is tuple else items


def structure_words(structure) -> str:
    """A piece's structure (``flatten``'s) in words: "an array", "a tuple of 2", "a dict
    with keys 'x', 'y'", "None"."""
    if structure is None:
        return "None"
    if structure == 0:
        return "an array"
    if structure[0] is dict:
        keys = ", ".join(repr(k) for k in structure[1])
        return f"a dict with keys {keys}" if keys else "an empty dict"
    kind, children = structure
    return f"a {kind.__name__} of {len(children)}"


def structure_difference(got, want, at: str = ""):
    """Where two piece structures first differ: ``(at, got, want)``, ``at`` the place as
    an index path (``""``: the whole piece, ``"[1]['x']"``: inside it) and the two in
    words (``structure_words``); None when they are the same."""
    if got == want:
        return None
    if (
        got is None
        or want is None
        or got == 0
        or want == 0
        or got[0] is not want[0]
        or (got[0] is dict and got[1] != want[1])
        or (got[0] is not dict and len(got[1]) != len(want[1]))
    ):
        return at, structure_words(got), structure_words(want)
    keys = got[1] if got[0] is dict else range(len(got[1]))
    children = zip(got[-1], want[-1], strict=True)
    for k, (a, b) in zip(keys, children, strict=True):
        found = structure_difference(a, b, f"{at}[{k!r}]")
        if found is not None:
            return found
    return None


def structure_mismatch(what: str, got, want, origin: str) -> str:
    """The message for a piece of structure ``got`` where the register holds ``want``
    (``origin`` says where that came from: "piece 0 gave", "its declared Spec is"): the
    difference in words, then the fix."""
    at, g, w = structure_difference(got, want)
    if at:
        text = (
            f"{what} gave {structure_words(got)} whose item {at} is {g}, where {origin} {w} there"
        )
    else:
        text = f"{what} gave {g} where {origin} {w}"
    if not at and w == "an array" and got[0] in (tuple, list) and len(got[1]) == 1:
        fix = f"give the array itself, not a {got[0].__name__} of 1 holding it"
    elif not at and g == "an array" and want[0] in (tuple, list):
        fix = f"give {w} (one array per item) for every piece"
    else:
        fix = f"give {structure_words(want)}, the same structure, for every piece"
    return f"{text}; {fix}"


def null_meta(leaf):
    """The TensorMeta of a tensor on a null device (a stand-in: it has no data), else None."""
    if not isinstance(leaf, Tensor):
        return None
    meta = leaf._impl.meta
    return meta if meta is not None and meta.device.type == "null" else None


def own_copy(leaf, what: str):
    """A contiguous copy of a leaf that outlives the act (None for a null-device tensor)."""
    if null_meta(leaf) is not None:
        return None
    return np.array(as_array(leaf, what), order="C", copy=True)


def as_array(leaf, what: str) -> np.ndarray:
    """A leaf of a piece as a numpy array (tensors are fetched, scalars become 0-d arrays)."""
    if isinstance(leaf, np.ndarray):
        return leaf
    if isinstance(leaf, Tensor):
        return leaf.numpy()
    if isinstance(leaf, (bool, int, float, np.generic)):
        # a Python float is float32 (actorflow's default float); numpy scalars keep theirs
        return np.asarray(leaf, dtype=np.float32 if type(leaf) is float else None)
    try:
        arr = np.asarray(leaf)
    except Exception:  # noqa: BLE001 - reported with the value's type below
        arr = None
    if arr is None or arr.dtype == object:
        raise DTypeError(
            f"{what} is a {type(leaf).__name__}; a piece holds arrays, tensors, "
            f"numbers, or tuples/lists/dicts of them"
        )
    return arr


class PieceSpec:
    """The structure of a piece and a Spec per array in it."""

    __slots__ = ("structure", "specs")

    def __init__(self, structure, specs: list):
        self.structure = structure
        self.specs = tuple(specs)

    @staticmethod
    def of(piece, what: str, device=None) -> PieceSpec:
        leaves, structure = flatten(piece)
        specs = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):  # from its metadata: nothing is read
                m = cast(TensorMeta, leaf._impl.meta)  # (a tensor's impl has its meta)
                if m.device.type == "null":  # a stand-in: on its device
                    specs.append(Spec(m.shape, m.dtype, device or m.device))
                    continue
                if m.shape is not None:
                    specs.append(Spec(m.shape, m.dtype, device or "cpu"))
                    continue
            arr = as_array(leaf, f"{what} (array {i})")
            from_numpy_dtype(arr.dtype, what)  # raises DTypeError naming what to do
            specs.append(Spec(arr.shape, arr.dtype, device or "cpu"))
        return PieceSpec(structure, specs)

    @staticmethod
    def from_user(out) -> PieceSpec:
        """``out=`` as given by a user: a Spec, or a tuple/list/dict of Specs."""
        leaves, structure = flatten(out)
        for leaf in leaves:
            if not isinstance(leaf, Spec):
                raise TypeError(
                    f"out= takes an af.Spec or a tuple/list/dict of them, got "
                    f"{type(leaf).__name__} {leaf!r}"
                )
        return PieceSpec(structure, leaves)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def bytes_on(self) -> dict:
        """``{Device: bytes}`` of one register."""
        out: dict = {}
        for s in self.specs:
            out[s.device] = out.get(s.device, 0) + s.nbytes
        return out

    def describe(self, sizes: bool = True) -> str:
        if len(self.specs) == 1 and self.structure == 0:
            return self.specs[0].describe(sizes)
        if not self.specs:
            return "nothing"
        return "(" + ", ".join(s.describe(sizes) for s in self.specs) + ")"

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, PieceSpec)
            and self.structure == other.structure
            and self.specs == other.specs
        )

    def __repr__(self) -> str:
        return repr(unflatten(self.structure, self.specs))


def check_piece(value, spec: PieceSpec, what: str, declared: bool) -> list:
    """The piece an actor gave, checked against its register: the one check every engine
    makes of every act's output (the local engine copies the leaves into the register, the
    Ray engine sends them). Returns the leaves as the register holds them: numpy arrays
    (a tensor's values, a Python float as float32), None for a null-device stand-in.

    Args:
        value: the piece (an array, tensor, number, None, or a tuple/list/dict of them).
        spec: the register's layout.
        what: who gave it, for messages: "actor 'f' (piece 3)".
        declared: the layout is the actor's ``out=`` (else: what piece 0 gave).

    Raises:
        TypeError: None from an actor with an output, an awaitable from a plain function,
            or a piece nested otherwise than the register.
        ShapeError: a leaf of another shape than the register's.
        DTypeError: a leaf of another dtype.
        DeviceError: a null-device stand-in for a register with data, or a tensor in a
            device's own memory (cuda) for a register on the host (``refuse_device_tensor``).
    """
    if value is None and none_is_fine(spec, what):
        return [None] * len(spec.specs)
    if type(value) is np.ndarray and spec.structure == 0:  # the common case
        s = spec.specs[0]
        if value.shape == s.shape and value.dtype == s.dtype.np:
            return [value]
    refuse_awaitable(value, what)
    leaves, structure = flatten(value)
    if structure != spec.structure:
        origin = "its declared Spec (out=) is" if declared else "piece 0 gave"
        raise TypeError(
            structure_mismatch(what, structure, spec.structure, origin)
            + f" (got {_spec_words(value)}, the register holds {spec!r})"
        )
    return [
        _checked_leaf(v, s, f"{what} (array {i})", what)
        for i, (v, s) in enumerate(zip(leaves, spec.specs, strict=True))
    ]


def refuse_device_tensor(v, device, what: str) -> None:
    """A leaf for a register on ``device`` (the host's: cpu, or a null stand-in's) that is a
    tensor in a device's own memory (cuda) is refused (DeviceError): the host reads it only
    by a copy, which the graph makes with a copy actor, not hidden in every act."""
    if isinstance(v, Tensor):
        on = cast(TensorMeta, v._impl.meta).device  # (a tensor's impl has its meta)
        if on.type not in ("cpu", "null") and on is not device:
            raise DeviceError(
                f"{what} returned a tensor on {on}, but its register is on {device}; return "
                f"a host array (a stage on the host), or keep the stage on {on} and copy its "
                f"output to the host with a copy actor: g.copy(x, {str(device)!r}) "
                f"(a Pipeline entry af.Copy({str(device)!r}))"
            )


def _checked_leaf(v, s: Spec, leaf_what: str, what: str):
    meta, arr = null_meta(v), None
    if meta is None:
        refuse_device_tensor(v, s.device, leaf_what)
        arr = as_array(v, leaf_what)
        shape, dtype, got = arr.shape, arr.dtype, f"{arr.dtype}{list(arr.shape)}"
    elif s.device.type != "null":
        raise DeviceError(
            f"{what} returned a tensor on {meta.device}, which has no data, "
            f"but its register is on {s.device}; return an array or a "
            f"{s.device} tensor"
        )
    else:
        shape, dtype = meta.shape, meta.dtype.np
        got = f"{meta.dtype.name}{list(shape)} on {meta.device}"
    want = f"{s.dtype.name}{list(s.shape)}"
    if shape != s.shape:
        raise ShapeError(
            f"{what} returned {got} but its register holds {want}; return the "
            f"same shape for every piece, or declare out=af.Spec(...)"
        )
    if dtype != s.dtype.np:
        raise DTypeError(
            f"{what} returned {got} but its register holds {want}; cast it "
            f"(.astype(numpy.{s.dtype.np.name})) or declare out=af.Spec(...)"
        )
    return arr


def none_is_fine(spec: PieceSpec | None, what: str) -> bool:
    """An actor gave None: fine when it declared no output (``out=()``) or its output is
    on the null device (a stand-in: only size and time count); else a mistake (a function
    that forgot to return), raised as TypeError with the fix."""
    if spec is not None and all(s.device.type == "null" for s in spec.specs):
        return True
    raise TypeError(
        f"{what} returned None; a stage or source gives its output piece (an "
        f"array, a tensor, a number, or a tuple/list/dict of them): did the "
        f"function forget to return? If it has no output, declare out=() "
        f"and None is accepted"
    )


def refuse_awaitable(value, what: str) -> None:
    """A plain function gave a coroutine (it wraps an ``async def`` one): closed, so it
    warns of nothing, and refused with the fix (TypeError)."""
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError(
            f"{what} returned a {type(value).__name__} instead of a piece: the "
            f"function is not 'async def' but gives an awaitable; declare it "
            f"'async def' (async def f(x): return await g(x)) so the run awaits it "
            f"on its loop"
        )


def _spec_words(value) -> str:
    try:
        return repr(PieceSpec.of(value, "value"))
    except Exception:  # noqa: BLE001 - only used in a message
        return type(value).__name__


NOTHING = PieceSpec(None, [])
"""The output spec of an actor that ended before its piece 0 (an empty source, or what
reads from one): it holds no register and nothing is ever sent."""
