"""Process-wide waiting: ``synchronize`` and ``synchronize_async``; and the hand-off of
tensors' storage to code that writes it outside the VM (``lend_arrays``,
``written_outside``: a compiled step's kernels writing parameters in place) or only reads
it there (``peek_array``)."""

from __future__ import annotations

from .eager.interpreter import read
from .errors import DeviceError
from .runtime.graph.device_acts import use_settled
from .vm import get_vm


def synchronize(timeout: float | None = None) -> None:
    """Waits until every instruction issued so far has run, then raises the first kernel
    error that no sync point has reported yet (later ones are dropped).

    Example: ``y = af.relu(x); af.synchronize()``.
    """
    get_vm().synchronize(timeout)


async def synchronize_async() -> None:
    """``synchronize`` for coroutines: awaits without blocking the running event loop."""
    await get_vm().synchronize_async()


def lend_arrays(tensors: list) -> list:
    """The arrays of ``tensors``' storage, for code that reads and writes them outside the
    VM (``nn.Graph``'s compiled step): taken once every instruction issued so far has run
    (``synchronize``, which raises a kernel error not reported yet), so no VM work is
    pending on them. Hand them back with ``written_outside`` once written, before the VM
    uses the tensors again."""
    synchronize()
    return [t._impl.array() for t in tensors]


def written_outside(tensors: list) -> None:
    """Tells the VM's side that ``tensors`` (lent by ``lend_arrays``) were written in place
    outside it: as after an in-place op, a backward that saved one of them raises instead
    of using the new values."""
    for t in tensors:
        t._impl.blob.version += 1


def peek_array(t, stand_in: bool = False):
    """``t``'s values for code that only reads them outside the VM (a compiled step's
    arguments and the tensors it captures): its own array when nothing is being written
    into it (no copy, no wait), else a copy taken once those writes are done (raising the
    error that poisoned it, as ``numpy()`` does). A tensor on a device without data is
    refused as ``numpy()`` refuses it, unless ``stand_in``: then its storage is given as it
    is (shapes only)."""
    impl = t._impl
    blob = impl.blob
    if not blob.backend.has_data:
        if stand_in:
            return impl.array()
        raise DeviceError(
            f"numpy(): the {impl.meta.device} device has no data; null "
            f"tensors have only shapes, dtypes and bytes"
        )
    if blob.allocated and blob.error is None and blob.idle() and impl.meta.shape is not None:
        return impl.array()
    return read(impl, blob.backend.allocator.copy_out, "numpy")


def _pending(tensors: list) -> list:
    """The instructions issued so far that write or read ``tensors``' storage, not done."""
    out = []
    for t in tensors:
        blob = t._impl.blob
        w = blob.last_write
        if w is not None and not w.done:
            out.append(w)
        out.extend(r for r in tuple(blob.reads or ()) if not r.done)
    return out


async def settled_async(tensors: list) -> None:
    """Awaits every instruction issued so far that writes or reads ``tensors``' storage
    (a device's complete on their driver events: no polling), then raises the error that
    poisoned one of them. What a device actor's act awaits before it ends (its register
    written, its inputs read: ``runtime/graph/device_acts.py``)."""
    vm = get_vm()
    for instr in _pending(tensors):
        await vm.wait_async(instr)
    for t in tensors:
        err = t._impl.blob.error
        if err is not None:
            raise err.to_raise()


def settled(tensors: list) -> None:
    """Waits (blocking) for every instruction issued so far that writes or reads
    ``tensors``' storage; errors stay for the next sync point. What a plan waits on before
    it frees device registers (a copy out of the last piece may still be reading one)."""
    vm = get_vm()
    for instr in _pending(tensors):
        vm.wait(instr)


use_settled(settled_async, settled)
