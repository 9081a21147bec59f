"""Interpreters turn an op call into work. The eager one checks devices, infers output
metadata, makes the output tensors and hands the VM an instruction; a lazy (tracing)
interpreter records the call instead. The interpreter is chosen per call, per thread."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from ..backends import get_backend
from ..dtype import bfloat16 as BF16
from ..errors import DeviceError, TraceError, VMError
from ..ops import get as _op
from ..tensor.blob import Blob
from ..tensor.impl import TensorImpl
from ..tensor.meta import TensorMeta, contiguous_meta, numel
from ..vm import ACCESS, OP_CALL, Instruction, get_vm
from ..vm.opcall import (allocate, call_fresh, call_op, null_kernel, run_access, run_op,
                         wide_kernel)
from ..vm.run_cuts import ELEMENTWISE


class _State(threading.local):
    interpreter = None      # None: eager
    streams = None          # {Device: Stream} overrides of the default compute streams
    below_grad = False      # inside autograd's recorder: the call is not recorded again


STATE = _State()
_OVERRIDES = [0]            # threads inside use_interpreter/use_stream: 0 skips the lookups
_OVERRIDES_LOCK = threading.Lock()
_meta = tuple.__new__        # builds a TensorMeta without its Python-level __new__
_VM = get_vm()
_GRAD: list = [None]        # autograd's recorder, once armed (use_autograd)
_COPY = _op("copy")


class Interpreter:
    """The seam: ``apply(op, inputs, attrs, device=None, outs=None) -> output TensorImpls``.
    ``outs`` given means the op writes those tensors in place."""

    def apply(self, op, inputs, attrs, device=None, outs=None):
        raise NotImplementedError


def check_same_device(inputs, op_name: str = ""):
    """The inputs' common device; DeviceError names the first two that differ."""
    dev = inputs[0].meta.device
    for i, t in enumerate(inputs):
        d = t.meta.device
        if d is not dev:
            first = dev
            raise DeviceError(
                f"Expected all tensors to be on the same device, but found at least two "
                f"devices, {first} (positional 0) and {d} (positional {i})! "
                f"{'(op ' + repr(op_name) + ') ' if op_name else ''}"
                f"Move one with .to({str(first)!r}) or .to({str(d)!r}).")
    return dev


def resolve(impl) -> None:
    """Waits for the writer of a tensor whose shape is known only after compute."""
    w = impl.blob.last_write
    if w is not None:
        _VM.wait(w)
    err = impl.blob.error
    if err is not None and not err.intact:     # (an intact note: the values are there)
        raise err.to_raise()
    if impl.meta.shape is None:
        raise VMError("internal error: a dynamic-shape tensor was never computed")


def current_stream(backend):
    if not _OVERRIDES[0]:
        return backend.compute
    streams = STATE.streams
    return (streams and streams.get(backend.device)) or backend.compute


class EagerInterpreter(Interpreter):
    def apply(self, op, inputs, attrs, device=None, outs=None):
        prev = STATE.interpreter
        STATE.interpreter = None
        try:
            return apply(op, inputs, attrs, device, outs)
        finally:
            STATE.interpreter = prev



def apply(op, inputs, attrs, device=None, outs=None):
    """Runs ``op`` through the current thread's interpreter (eager unless one is installed
    with ``use_interpreter``); returns the output TensorImpls."""
    rec = _GRAD[0]
    if rec is not None:
        recorded = rec(op, inputs, attrs, device, outs)   # None: nothing to record
        if recorded is not None:
            return recorded
    overridden = _OVERRIDES[0]
    if overridden:
        interp = STATE.interpreter
        if interp is not None:
            return interp.apply(op, inputs, attrs, device, outs)
    # The eager per-op hot path: one pass over the inputs (metas, device check, cost).
    metas = []
    consts = ()             # (tuples grown by concatenation: cheaper than list + tuple())
    cost = 0
    dev = None
    wide = False            # a bfloat16 operand: the kernel computes in float32
    for i in inputs:
        m = i.meta
        if m.shape is None:
            resolve(i)
            m = i.meta
        if dev is None:
            dev = m.device
        elif m.device is not dev:
            check_same_device(inputs, op.name)
        if m.dtype is BF16:
            wide = True
        metas.append(m)
        b = i.blob
        consts += (b,)
        cost += b.nbytes if i.base is None else numel(m.shape) * m.dtype.itemsize
    if device is not None:
        dev = device
    backend = dev.backend or get_backend(dev)
    specs = op.infer(metas, attrs)
    fresh = None
    if outs is None:
        outs = []
        muts = ()
        for shape, dtype in specs:
            if dtype is BF16:
                wide = True
            if shape is None:
                b = Blob(dev, backend, 0)
                o = TensorImpl(_meta(TensorMeta, (None, dtype, dev, None, 0)), b)
            else:
                nbytes = dtype.itemsize
                for s in shape:
                    nbytes *= s
                b = Blob(dev, backend, nbytes)
                o = TensorImpl(dev.metas.get((shape, dtype)) or contiguous_meta(shape, dtype, dev),
                               b)
                cost += nbytes
            outs.append(o)
            muts += (b,)
        # a fresh kernel (single-output ops only: see OpDef) for a small output (b, dtype: its
        # blob and dtype); run_inline itself turns down costs too large to run on the spot
        if op.fresh and not wide:
            alloc = backend.allocator
            if alloc.budget is None and b.nbytes < alloc.cache_min_bytes:
                fresh = op.fresh.get(dev.type)
    else:
        muts = tuple([o.blob for o in outs])
        consts = tuple([b for b in consts if b not in muts])
        for o in outs:
            m = o.meta
            cost += o.blob.nbytes if o.base is None else numel(m.shape) * m.dtype.itemsize
            if m.dtype is BF16:
                wide = True
    if op.dynamic and not backend.has_data:
        raise DeviceError(f"{op.name}: the {dev} device has no data, so an op whose output "
                          f"shape depends on tensor values cannot run there; use cpu")
    if overridden:
        streams = STATE.streams
        stream = (streams and streams.get(dev)) or backend.compute
    else:
        stream = backend.compute
    cost >>= 2
    if fresh is not None and _VM.run_inline(stream, consts, muts, cost, op.name, call_fresh,
                                            (fresh, inputs, b, attrs, dtype.np, alloc)):
        return outs
    # the kernel is looked up only now: most small ops ran through their fresh kernel above
    kernel = ((op.kernels.get(dev.type) or op.kernel_for(dev.type)) if backend.has_data
              else null_kernel)
    if wide and backend.has_data:
        kernel = wide_kernel(op, kernel, dev, [o.meta.dtype for o in outs])
    args = (kernel, inputs, outs, attrs, op.dynamic, op.name)
    if fresh is not None or not _VM.run_inline(stream, consts, muts, cost, op.name, call_op,
                                               args):
        _VM.submit(Instruction(OP_CALL, op.name, stream, consts, muts, run_op, args, cost,
                               muts if op.dynamic else (), ELEMENTWISE if op.elementwise else None))
    return outs


@contextmanager
def _override(name: str, value):
    prev = getattr(STATE, name)
    setattr(STATE, name, value)
    with _OVERRIDES_LOCK:
        _OVERRIDES[0] += 1
    try:
        yield
    finally:
        with _OVERRIDES_LOCK:
            _OVERRIDES[0] -= 1
        setattr(STATE, name, prev)


def use_autograd(recorder) -> None:
    """Arms autograd (once a tensor requires grad): every op call goes first to
    ``recorder(op, inputs, attrs, device, outs)``, which returns None when there is nothing
    to record (no input needs a gradient, or the call comes from inside the recorder:
    ``below_grad``) and the call then runs as usual, or runs the call below it and returns
    its outputs with their backward node attached. Autograd lives above and hands
    its recorder in; an unarmed process pays nothing for it."""
    _GRAD[0] = recorder


@contextmanager
def use_interpreter(interp):
    """Within the block, op calls on this thread go to ``interp`` (e.g. a tracer)."""
    with _override("interpreter", interp):
        yield interp


@contextmanager
def use_stream(stream):
    """Within the block, ops on ``stream.device`` issued by this thread go to ``stream``."""
    streams = dict(STATE.streams or {})
    streams[stream.device] = stream
    with _override("streams", streams):
        yield stream


def access(impl, fn, write: bool, name: str = "access"):
    """Issues an access-blob-by-callback instruction: ``fn(array)`` runs once the blob's
    earlier writes (and, for a write, reads) are done. Returns the instruction."""
    blob = impl.blob
    if blob.traced:
        raise TraceError(f"{name}: this tensor is being traced, so it has no values yet; "
                         f"return it from the traced function instead of reading it")
    backend = blob.backend
    consts, muts = ((), (blob,)) if write else ((blob,), ())
    instr = Instruction(ACCESS, name, current_stream(backend), consts, muts, run_access,
                        (impl, fn), blob.nbytes >> 2)
    _VM.submit(instr)
    return instr


def _on_host_or_whole(impl):
    """``impl``, or for a view of device memory (which the host cannot stride into) a
    contiguous copy of it made on its device."""
    if impl.base is None or impl.blob.backend.host_memory:
        return impl
    return apply(_COPY, [impl], {})[0]


def transfer(impl, dev, name: str = "to"):
    """A copy of ``impl`` on ``dev`` where one side is device memory the host cannot read
    (cuda): an instruction on the device's current stream reads ``impl`` and writes the new
    tensor, once their earlier uses are done; the device's allocator issues the copy on its
    copy stream (see ``backends/cuda``). Returns the new TensorImpl at once."""
    impl = _on_host_or_whole(impl)
    m = impl.meta
    out = TensorImpl.new(m.shape, m.dtype, dev)
    src_b, dst_b = impl.blob.backend, out.blob.backend
    if not src_b.host_memory and not dst_b.host_memory:
        raise DeviceError(f"{name}(): copies between two devices with their own memory "
                          f"({m.device} to {dev}) are not built yet; go through the host: "
                          f".to('cpu').to({str(dev)!r})")
    device_b = dst_b if src_b.host_memory else src_b
    instr = Instruction(ACCESS, name, current_stream(device_b), (impl.blob,), (out.blob,),
                        _run_transfer, (impl, out), (impl.blob.nbytes + out.blob.nbytes) >> 2)
    _VM.submit(instr)
    return out


def _run_transfer(instr) -> None:
    impl, out = instr.args
    allocate((out,), instr.name)
    dst = out.blob
    if not dst.backend.host_memory:
        dst.backend.allocator.copy_in(dst.array, impl.array())
    else:
        src = impl.blob
        alloc = src.backend.allocator
        staging = alloc.backend.driver().pinned(dst.array.shape, dst.array.dtype)
        alloc.copy_out_into(staging, src.array, dst.array)


def read(impl, fn, name: str):
    """``fn(array)`` on ``impl``'s values once every write issued before is done, from plain
    code (blocks the caller); returns what ``fn`` returned or raises the error that poisoned
    the values. What ``Tensor.numpy`` and friends call."""
    impl = _on_host_or_whole(impl)
    instr = access(impl, fn, write=False, name=name)
    if not instr.done:
        _VM.wait(instr)
    return _result(instr, impl.blob)


async def read_async(impl, fn, name: str):
    """``read`` that awaits without blocking the running event loop."""
    if impl.meta.shape is None:
        w = impl.blob.last_write
        if w is not None:
            await _VM.wait_async(w)
        resolve(impl)
    impl = _on_host_or_whole(impl)
    instr = access(impl, fn, write=False, name=name)
    await _VM.wait_async(instr)
    return _result(instr, impl.blob)


def _result(instr, blob):
    err = instr.error
    if err is not None:
        raise err.to_raise()
    err = blob.error
    if err is not None and err.intact and not err._reported:
        raise err.to_raise()       # a failed write left it as it was: said once, here
    return instr.result
