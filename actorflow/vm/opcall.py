"""How an op's kernel runs on arrays, the one place for it: which kernel an op runs on a
device (``kernel_of``), and what a kernel's exception becomes (``kernel_error``), for the
VM's op calls and for a compiled ``Program``'s steps (``actorflow.tracing``, locally and in
a Ray process) alike.

The VM's op call (a plain tuple, see ``instruction.py``): allocate outputs from the
device's allocator (on first write), hand the kernel numpy views (``call_op``; a dynamic op
returns its arrays, adopted with their shapes), run a small op through its fresh kernel
(``call_fresh``) and, for large elementwise kernels, cut the work into slices that CPU
workers run in parallel (``split_op``)."""

from __future__ import annotations

import numpy as np

from ..backends import get_backend
from ..backends.cuda.driver import Kernel
from ..errors import DeviceError, KernelError
from ..ops.registry import DERIVED
from ..tensor.meta import contiguous_meta, strided

_ND = np.ndarray


def kernel_of(op, device):
    """The kernel ``op`` runs on ``device``: its kernel for the device type (on cuda, a
    ``DeviceKernel`` made of its numpy kernel), or ``null_kernel`` on a device without data.

    Raises:
        DeviceError: the op has no kernel for the device type (names the ones it has)."""
    if not (device.backend or get_backend(device)).has_data:
        return null_kernel
    return op.kernels.get(device.type) or op.kernel_for(device.type)


class DeviceKernel:
    """An op's kernel on a CUDA device (``OpDef.kernel_for("cuda")`` makes it): ``kernel``,
    a driver ``Kernel`` whose ``reference`` is the op's numpy kernel, run on the device's
    stream by ``device_call_op`` (the emulator runs the reference; a compiled driver will
    take generated sources instead). Its launch arguments: the number of outputs, each
    operand's view (None: the whole block), the attrs, then the device arrays, outputs first.

    Raises:
        DeviceError: the op's output shape depends on the values (the host would have to
            read the device first: not built yet)."""

    __slots__ = ("kernel",)

    def __init__(self, op, fn, device_type: str = "cuda"):
        if op.dynamic:
            raise DeviceError(f"op '{op.name}': its output shape depends on the values, "
                              f"which {device_type} devices cannot run yet; run it on cpu "
                              f"(x.to('cpu')) and move the result back with .to(...)")

        def reference(n_out, views, attrs, *arrays):
            arrays = [a if m is None else strided(a, m) for a, m in zip(arrays, views)]
            fn(arrays[:n_out], arrays[n_out:], attrs)
        self.kernel = Kernel(op.name, reference=reference)

    def __call__(self, outs, ins, attrs):
        raise DeviceError(f"op '{self.kernel.name}': a CUDA kernel runs on its device's "
                          f"stream (device_call_op), never on host arrays")


def _device_kernel(op):
    """``OpDef.kernel_for``'s way to a CUDA kernel: the op's numpy kernel wrapped (None when
    it has none: kernel_for then names the devices it runs on)."""
    fn = op.kernels.get("cpu")
    return None if fn is None else DeviceKernel(op, fn)


DERIVED["cuda"] = _device_kernel


def device_call_op(args, stream) -> None:
    """Issues one op call (``args`` as ``call_op``'s) on the driver ``stream`` of a device
    with its own memory: allocates the outputs, then launches the kernel over the operands'
    device arrays (views described by their metas, applied where the kernel runs)."""
    kernel, ins, outs, attrs, dynamic, name = args
    allocate(outs, name)
    arrays, views = [], []
    for t in (*outs, *ins):
        arrays.append(t.blob.array.darray)
        views.append(None if t.base is None else t.meta)
    launch_kernel(kernel, stream, len(outs), views, attrs, arrays)


def launch_kernel(kernel, stream, n_out: int, views: list, attrs, arrays: list) -> None:
    """Launches ``kernel`` (a ``DeviceKernel``) on the driver ``stream`` over ``arrays``
    (device arrays, its ``n_out`` outputs first), each seen through its view in ``views``
    (a ``TensorMeta``, or None for the whole array): the one launch of an op's kernel on a
    device, for the VM's op calls and a compiled ``Program``'s steps alike."""
    stream.launch(kernel.kernel, (n_out, views, attrs, *arrays))


def kernel_error(op: str, device, e: BaseException, intact: bool = False,
                 note: str = "") -> KernelError:
    """What op ``op``'s kernel raising ``e`` on ``device`` becomes: ``e`` itself when it is
    a KernelError already (a kernel that ran ops of its own), else ``KernelError.of`` (the
    kind of fault kept, the traceback as text only). ``intact``: the op wrote nothing;
    ``note``: where the op was (a Program's step)."""
    if isinstance(e, KernelError):
        return e
    return KernelError.of(op, str(device), e, intact, note)


def allocate(outs, what: str) -> None:
    for o in outs:
        b = o.blob
        if not b.allocated:
            m = o.meta
            if m.shape is not None:
                b.array = b.backend.allocator.empty(m.shape, m.dtype.np, b.nbytes, what)
                b.allocated = True


def run_op(instr) -> None:
    call_op(instr.args)


def call_op(args) -> None:
    """Runs one op call: ``args`` is ``(kernel, ins, outs, attrs, dynamic, name)``."""
    kernel, ins, outs, attrs, dynamic, name = args
    allocate(outs, name)
    if dynamic:
        _run_dynamic(name, kernel, ins, outs, attrs)
        return
    out_arrays = []
    for o in outs:
        out_arrays.append(o.blob.array if o.base is None else o.array())
    in_arrays = []
    for i in ins:
        in_arrays.append(i.blob.array if i.base is None else i.array())
    kernel(out_arrays, in_arrays, attrs)


def call_fresh(args) -> None:
    """Runs a small op call through its fresh kernel, which returns the output array (numpy
    allocates it): ``args`` is ``(fresh, ins, out_blob, attrs, numpy dtype, allocator)``.
    The array is counted in the log as ``empty`` would have (small arrays are never cached,
    only counted)."""
    fresh, ins, b, attrs, dtype, alloc = args
    in_arrays = []              # (a loop, not a comprehension: no function object per call)
    for i in ins:
        in_arrays.append(i.blob.array if i.base is None else i.array())
    r = fresh(in_arrays, attrs, dtype)
    if r.__class__ is not _ND or r.dtype is not dtype or (r.ndim > 1
                                                          and not r.flags.c_contiguous):
        r = np.array(r, dtype=dtype, order="C")      # a 0-d result, an unusual layout
    b.array = r
    b.allocated = True
    if b.nbytes:
        log = alloc.log
        log.append(b.nbytes)
        if len(log) > alloc.fold_at:
            alloc.fold()


def _run_dynamic(name, kernel, ins, outs, attrs) -> None:
    results = kernel(None, [i.array() for i in ins], attrs)
    for o, arr in zip(outs, results):
        b = o.blob
        m = o.meta
        b.backend.allocator.adopt(arr.nbytes, name)
        b.array, b.nbytes, b.owned, b.allocated = arr, arr.nbytes, False, True
        o.meta = contiguous_meta(arr.shape, m.dtype, m.device)


def null_kernel(outs, ins, attrs) -> None:
    """Every op on the null device: no data, only the allocation and the simulated time."""


def split_op(instr, n: int, first_share: float = 0.0):
    """Allocates the outputs and returns up to ``n`` callables that each run the kernel on
    one slice of the outputs (and the matching slices of broadcast inputs), or None when the
    op cannot be cut (overlapping in-place views, too small a shape). The first slice gets
    ``first_share`` of the work (0: an equal share)."""
    kernel, ins, outs, attrs, dynamic, _ = instr.args
    if dynamic or len(outs) != 1:
        return None
    out = outs[0]
    out_blob = out.blob
    for i in ins:
        if i.blob is out_blob and i.meta != out.meta:
            return None
    allocate(outs, instr.name)
    o = out.array()
    axis = next((ax for ax, s in enumerate(o.shape) if s >= n), None)
    if axis is None:
        return None
    arrays = [i.array() for i in ins]
    size = o.shape[axis]
    if first_share > 0:
        first = int(size * first_share)
        bounds = [0] + [first + (size - first) * k // (n - 1) for k in range(n)]
    else:
        bounds = [size * k // n for k in range(n + 1)]
    lead = (slice(None),) * axis
    pieces = []
    for lo, hi in zip(bounds, bounds[1:]):
        sl = lead + (slice(lo, hi),)
        part_ins = []
        for a in arrays:
            ax = axis - (o.ndim - a.ndim)
            if ax >= 0 and a.shape[ax] == size and size != 1:
                a = a[(slice(None),) * ax + (slice(lo, hi),)]
            part_ins.append(a)
        pieces.append(_Piece(kernel, [o[sl]], part_ins, attrs))
    return pieces


class _Piece:
    __slots__ = ("kernel", "outs", "ins", "attrs")

    def __init__(self, kernel, outs, ins, attrs):
        self.kernel, self.outs, self.ins, self.attrs = kernel, outs, ins, attrs

    def __call__(self):
        self.kernel(self.outs, self.ins, self.attrs)


def run_access(instr) -> None:
    """Access-blob-by-callback: calls ``fn(array)`` in order with the blob's other uses."""
    impl, fn = instr.args
    instr.result = fn(impl.array())
