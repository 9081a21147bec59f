"""Interpreters turn an op call into work. The eager one checks devices, infers output
metadata, makes the output tensors and hands the VM an instruction; a lazy (tracing)
interpreter records the call instead. The interpreter is chosen per call, per thread."""

from __future__ import annotations

import threading
from contextlib import contextmanager

from ..backends import get_backend
from ..errors import DeviceError, VMError
from ..tensor.impl import TensorImpl
from ..vm import ACCESS, OP_CALL, Instruction, get_vm
from .opcall import null_kernel, run_access, run_op, split_op


class _State(threading.local):
    interpreter = None      # None: eager
    streams = None          # {Device: Stream} overrides of the default compute streams


STATE = _State()
_VM = get_vm()


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
    if impl.blob.error is not None:
        raise impl.blob.error
    if impl.meta.shape is None:
        raise VMError("internal error: a dynamic-shape tensor was never computed")


def current_stream(backend):
    streams = STATE.streams
    if streams:
        s = streams.get(backend.device)
        if s is not None:
            return s
    return backend.compute


class EagerInterpreter(Interpreter):
    def apply(self, op, inputs, attrs, device=None, outs=None):
        for i in inputs:
            if i.meta.shape is None:
                resolve(i)
        if inputs:
            dev = check_same_device(inputs, op.name) if len(inputs) > 1 else inputs[0].meta.device
        else:
            dev = device
        if device is not None:
            dev = device
        backend = get_backend(dev)
        specs = op.infer([i.meta for i in inputs], attrs)
        cost = 0
        for i in inputs:
            cost += i.blob.nbytes
        if outs is None:
            consts = tuple([i.blob for i in inputs])
            outs = []
            for shape, dtype in specs:
                o = TensorImpl.new(shape, dtype, dev) if shape is not None else \
                    TensorImpl.new_dynamic(dtype, dev)
                outs.append(o)
                cost += o.blob.nbytes
        else:
            written = [o.blob for o in outs]
            consts = tuple([i.blob for i in inputs if i.blob not in written])
            for o in outs:
                cost += o.blob.nbytes
        if backend.has_data:
            kernel = op.kernel_for(dev.type)
        elif op.dynamic:
            raise DeviceError(f"{op.name}: the {dev} device has no data, so an op whose output "
                              f"shape depends on tensor values cannot run there; use cpu")
        else:
            kernel = null_kernel
        muts = tuple([o.blob for o in outs])
        _VM.submit(Instruction(OP_CALL, op.name, current_stream(backend), consts, muts, run_op,
                               (kernel, inputs, outs, attrs, op.dynamic), cost >> 2,
                               muts if op.dynamic else (),
                               split_op if op.elementwise else None))
        return outs


EAGER = EagerInterpreter()


def apply(op, inputs, attrs, device=None, outs=None):
    """Runs ``op`` through the current thread's interpreter; returns the output impls."""
    interp = STATE.interpreter
    if interp is None:
        return EAGER.apply(op, inputs, attrs, device, outs)
    return interp.apply(op, inputs, attrs, device, outs)


@contextmanager
def use_interpreter(interp):
    """Within the block, op calls on this thread go to ``interp`` (e.g. a tracer)."""
    prev = STATE.interpreter
    STATE.interpreter = interp
    try:
        yield interp
    finally:
        STATE.interpreter = prev


@contextmanager
def use_stream(stream):
    """Within the block, ops on ``stream.device`` issued by this thread go to ``stream``."""
    prev = STATE.streams
    STATE.streams = dict(prev or {})
    STATE.streams[stream.device] = stream
    try:
        yield stream
    finally:
        STATE.streams = prev


def access(impl, fn, write: bool, name: str = "access"):
    """Issues an access-blob-by-callback instruction: ``fn(array)`` runs once the blob's
    earlier writes (and, for a write, reads) are done. Returns the instruction."""
    blob = impl.blob
    backend = blob.backend
    consts, muts = ((), (blob,)) if write else ((blob,), ())
    instr = Instruction(ACCESS, name, current_stream(backend), consts, muts, run_access,
                        (impl, fn), blob.nbytes >> 2)
    _VM.submit(instr)
    return instr
