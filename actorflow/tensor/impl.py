"""TensorImpl: a tensor's metadata plus its blob. Views share their base's blob."""

from __future__ import annotations

from typing import Any

from ..backends import get_backend
from .blob import _SMALL, RELEASED, Blob
from .meta import TensorMeta, contiguous_strides, strided


class TensorImpl:
    """``meta`` (its ``shape`` None until computed for outputs whose shape is known only
    after compute),
    ``blob``, ``base``: the TensorImpl owning the blob, or None if this one owns it, and
    ``ag``: autograd's record of it (``actorflow.autograd``), None outside autograd."""

    __slots__ = ("meta", "blob", "base", "ag", "__weakref__")

    def __init__(
        self,
        meta: TensorMeta,
        blob: Blob,
        base: TensorImpl | _Detached | _Pinned | None = None,
    ):
        self.meta = meta
        self.blob = blob
        self.base = base
        self.ag: Any = None  # autograd's record (autograd sits above: no import of its type)

    @staticmethod
    def new(shape: tuple, dtype, device) -> TensorImpl:
        """A fresh contiguous tensor whose blob the VM allocates when its writer runs."""
        nbytes = dtype.itemsize
        for s in shape:
            nbytes *= s
        blob = Blob(device, get_backend(device), nbytes)
        return TensorImpl(TensorMeta(shape, dtype, device, contiguous_strides(shape), 0), blob)

    def view(self, shape: tuple, strides: tuple, offset: int) -> TensorImpl:
        m = self.meta
        return TensorImpl(
            TensorMeta(shape, m.dtype, m.device, strides, offset), self.blob, self.base or self
        )

    def array(self):
        """The numpy array this tensor sees. Only valid inside an instruction's kernel."""
        arr = self.blob.array
        if self.base is None or arr is None:
            return arr
        return strided(arr, self.meta)

    def __del__(self):
        # The last tensor owning the blob is gone (on any thread, even inside the garbage
        # collector). A small blob with no recorded use is freed here and now through the
        # allocator's lock-free count; anything else is queued for the VM to free after its
        # pending uses. (Inline rather than a Blob method: this runs once per op.)
        if self.base is None:
            b = self.blob
            try:
                if b.pins and b.orphan():
                    return  # autograd still holds it: freed at its unpin
                if b.last_write is None and b.reads is None and b.nbytes < _SMALL:
                    if b.allocated:
                        b.allocated = False
                        if b.nbytes:
                            b.backend.allocator.log.append(-b.nbytes)  # lock-free count
                    b.array = None
                    b.released = True
                else:
                    RELEASED.append(b)
            except Exception:  # interpreter shutdown: module globals may be gone
                pass


class _Pinned:
    """The base of a tensor made over a pinned blob (``TensorImpl.pinned``): never frees
    it, and is no tensor of autograd's."""

    ag = None


PINNED = _Pinned()


class _Detached:
    """The base of what ``Tensor.detach()`` makes: it keeps the storage's owner alive (the
    blob lives while either tensor does) and, as in PyTorch, is no view of autograd's, so a
    write in place into the detached tensor (or a view of it) is checked as a write into a
    tensor of its own. The blob's ``version`` still moves, so a rule that saved the original
    tensor refuses to run on the changed values."""

    __slots__ = ("owner",)
    ag = None

    def __init__(self, owner: TensorImpl):
        self.owner = owner

    @property
    def meta(self) -> TensorMeta | None:
        return self.owner.meta


def detached(impl: TensorImpl) -> TensorImpl:
    """A tensor over ``impl``'s storage and metadata that autograd sees as a tensor of its
    own (``Tensor.detach``)."""
    base = impl.base
    if base is None or isinstance(base, TensorImpl):
        base = _Detached(base or impl)
    # (a detached or pinned tensor's base is no tensor of autograd's already: shared)
    return TensorImpl(impl.meta, impl.blob, base)


def pinned(meta, blob) -> TensorImpl:
    """A tensor over ``blob`` (pinned by the caller) that never frees it: how autograd reads
    an output it saved without keeping the output's own tensor alive."""
    return TensorImpl(meta, blob, PINNED)
