"""Interpreters turn an op call into work. The eager one checks devices, infers output
metadata, makes the output tensors and hands the VM an instruction; a lazy (tracing)
interpreter records the call instead. The interpreter is chosen per call, per thread.
What the eager one decides from a call's signature is kept in the op's dispatch cache (see
``Plan``): a call seen before makes its outputs and runs at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ..backends import get_backend
from ..backends.base import Stream
from ..device import Device
from ..dtype import DType
from ..dtype import bfloat16 as BF16
from ..errors import DeviceError, TraceError, VMError
from ..ops import get as _op
from ..ops.registry import NO_MEMO
from ..tensor.blob import Blob
from ..tensor.impl import TensorImpl
from ..tensor.meta import TensorMeta, contiguous_meta, numel
from ..vm import ACCESS, OP_CALL, Instruction, get_vm
from ..vm.opcall import allocate, call_op, null_kernel, run_access, run_op, wide_kernel
from ..vm.run_cuts import ELEMENTWISE


class _State(threading.local):
    interpreter = None  # None: eager
    streams = None  # {Device: Stream} overrides of the default compute streams
    below_grad = False  # inside autograd's recorder: the call is not recorded again


STATE = _State()
_OVERRIDES = [0]  # threads inside use_interpreter/use_stream: 0 skips the lookups
_OVERRIDES_LOCK = threading.Lock()
_meta = tuple.__new__  # builds a TensorMeta without its Python-level __new__
_new_impl = TensorImpl.__new__
_VM = get_vm()
_GRAD: list = [None]  # autograd's recorder, once armed (use_autograd)
_GLOBAL: list = [None]  # the global interpreter (use_global)
_GLOBAL_READ: list = [None]  # a global tensor's whole value as a local one (use_global)
_COPY = _op("copy")


class Interpreter:
    """The seam: ``apply(op, inputs, attrs, device=None, outs=None) -> output TensorImpls``.
    ``outs`` given means the op writes those tensors in place."""

    def apply(self, op, inputs, attrs, device=None, outs=None):
        raise NotImplementedError


def check_same_device(inputs, op_name: str = ""):
    """The inputs' common device; DeviceError names the first two that differ. Global
    tensors of one placement pass whatever their sbp (the global interpreter boxes them);
    a global tensor beside a local one, or beside one of another placement, does not."""
    dev = inputs[0].meta.device
    for i, t in enumerate(inputs):
        d = t.meta.device
        if d is not dev:
            first = dev
            if d.placed or first.placed:
                _check_placed(first, d, i, op_name)
                continue
            raise DeviceError(
                f"Expected all tensors to be on the same device, but found at least two "
                f"devices, {first} (positional 0) and {d} (positional {i})! "
                f"{'(op ' + repr(op_name) + ') ' if op_name else ''}"
                f"Move one with .to({str(first)!r}) or .to({str(d)!r})."
            )
    return dev


def _check_placed(first, d, i: int, op_name: str) -> None:
    where = f"op {op_name!r}: " if op_name else ""
    if not (d.placed and first.placed):
        glob, local = (first, d) if first.placed else (d, first)
        raise DeviceError(
            f"{where}expected all tensors to be global or all local, but found a global "
            f"tensor ({glob}) and a local one on {local}; make the local one global with "
            f".to_global(placement, sbp) (the global one's placement is "
            f"{glob.placement!r}), or the global one local with .to_local()"
        )
    if d.placement is not first.placement:
        raise DeviceError(
            f"{where}expected all global tensors on one placement, but found "
            f"{first.placement!r} and {d.placement!r} (positional {i}); move one with "
            f".to_global(placement={first.placement!r})"
        )


def resolve(impl) -> None:
    """Waits for the writer of a tensor whose shape is known only after compute."""
    w = impl.blob.last_write
    if w is not None:
        _VM.wait(w)
    err = impl.blob.error
    if err is not None and not err.intact:  # (an intact note: the values are there)
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
        recorded = rec(op, inputs, attrs, device, outs)  # None: nothing to record
        if recorded is not None:
            return recorded
    overridden = _OVERRIDES[0]
    if overridden:
        interp = STATE.interpreter
        if interp is not None:
            return interp.apply(op, inputs, attrs, device, outs)
    if outs is None and not op.dynamic:
        plan = None
        if device is None and inputs:
            key = attrs_key(op, attrs)
            if key is not None:
                plan = plan_of(op, inputs, attrs, key)
        if plan is None:  # decided for this call alone
            STATS["uncached"] += 1
            plan = _decide(op, inputs, attrs, device)
        if plan is not None:
            return _run(plan, op, inputs, attrs, overridden)
    return _apply(op, inputs, attrs, device, outs, overridden)


def apply1(op, x, y, attrs, key):
    """``apply(op, [x], attrs)[0]``, or ``apply(op, [x, y], attrs)[0]`` where ``y`` is not
    None, for an op with one output: the functional layer's hot functions call it. ``key``
    stands for the attrs in the signature: ``attrs_key(op, attrs)``, or a cheaper value the
    caller knows to stand for them alone for this op (``()`` for no attrs, a scalar's type
    for a ``typed_attrs`` scalar, cast's dtype); never one of ``attrs_key``'s tuples for
    other attrs. Returns the output TensorImpl."""
    if y is None:
        if (_GRAD[0] is not None and x.ag is not None) or _OVERRIDES[0]:
            return apply(op, [x], attrs)[0]
        memo = op.plans[0]  # the latest one-input signature's: a chain of calls asks
        if memo[0] is not x.meta or (memo[1] is not key and memo[1] != key):  # the same
            memo = _memo(op, (x,), attrs, key)
            if memo is None:
                return apply(op, [x], attrs)[0]
    else:
        if (_GRAD[0] is not None and (x.ag is not None or y.ag is not None)) or _OVERRIDES[0]:
            return apply(op, [x, y], attrs)[0]
        memo = op.plans[1]
        if (
            memo[0] is not x.meta
            or memo[1] is not y.meta
            or (memo[2] is not key and memo[2] != key)
        ):
            memo = _memo(op, (x, y), attrs, key)
            if memo is None:
                return apply(op, [x, y], attrs)[0]
    dev, backend, meta, nbytes, fresh, dtype, cost, plan = memo[-1]
    if fresh is not None and dev.backend is backend:
        alloc = backend.allocator
        if alloc.budget is None and nbytes < alloc.cache_min_bytes:
            b = Blob(dev, backend, nbytes)
            o = _new_impl(TensorImpl)  # (TensorImpl(meta, b) without its __init__)
            o.meta = meta
            o.blob = b
            o.base = o.ag = None
            if not _VM.run_fresh(
                backend.compute, x, y, b, cost, op.name, fresh, attrs, dtype, alloc
            ):
                if y is None:
                    ins, consts = (x,), (x.blob,)
                else:
                    ins, consts = (x, y), (x.blob, y.blob)
                _issue(plan, op, ins, attrs, [o], (b,), backend.compute, consts, False)
            return o
    return _run(plan, op, (x,) if y is None else (x, y), attrs, 0)[0]


def _memo(op, inputs, attrs, key):
    """The memo of ``apply1`` for this call's signature, made from its plan and
    kept as the op's latest; None where the cache does not take the call."""
    plan = plan_of(op, inputs, attrs, key)
    if plan is None or not plan.single:
        return None
    fast = (
        plan.dev,
        plan.backend,
        plan.meta,
        plan.nbytes,
        plan.fresh,
        plan.np_dtype,
        plan.cost,
        plan,
    )
    if len(inputs) == 1:
        memo = (inputs[0].meta, key, fast)
        op.plans[0] = memo
    else:
        memo = (inputs[0].meta, inputs[1].meta, key, fast)
        op.plans[1] = memo
    return memo


# -- the dispatch cache ----------------------------------------------------------------------
#
# What an eager op call decides from its signature (the op, its inputs' metas, its attrs) is
# kept in a ``Plan``, per op (``OpDef.plans``): the device, the backend, each output's meta
# and bytes, whether a bfloat16 operand makes the kernel compute in float32, the fresh
# kernel, the kernel, the cost. A call with a signature seen before makes its outputs and
# runs at once. Everything in a plan is a pure function of the signature (metas are
# immutable NamedTuples, devices and dtypes singletons, ``infer`` pure); what may change
# between two calls of one signature is read per call: the allocator's budget and small-block
# bound (a fresh kernel runs only without a budget), the device's backend (forgotten when a
# CUDA driver is switched), the VM's inline limit, profiler and errors, ``use_stream``,
# autograd's recorder and the installed interpreter. A signature that cannot be keyed (an
# attr that is not a plain value, an input whose shape is not computed yet, an op whose
# output shapes depend on values) takes the uncached path. The cache is bounded: an op's
# dict starts over once it holds ``PLANS_MAX`` signatures.

PLANS_MAX = 256
# attr types keyed by value (with the type: 1, 1.0 and True are equal in Python, not to an
# op's dtype inference); dtypes and devices are singletons
_PLAIN = frozenset((bool, int, float, str, type(None), complex, DType, Device))
# counts for diagnostics and tests: signatures decided (the cache's misses; every other call
# of a cached signature is a hit) and calls the cache did not take
STATS = {"decided": 0, "uncached": 0}


class Plan:
    """What an op call decided for one signature (see above). ``outs``: ``(meta, nbytes)``
    per output; ``fresh``: the fresh kernel for the one output, where the op has one and no
    operand is bfloat16; ``kernel``: looked up at first need."""

    __slots__ = (
        "dev",
        "backend",
        "outs",
        "single",
        "meta",
        "nbytes",
        "wide",
        "fresh",
        "np_dtype",
        "cost",
        "kernel",
        "elementwise",
    )

    def __init__(self, dev, backend, outs, wide, fresh, cost, elementwise):
        self.dev = dev
        self.backend = backend
        self.outs = outs
        self.single = len(outs) == 1
        self.meta, self.nbytes = outs[0] if outs else (None, 0)
        self.wide = wide
        self.fresh = fresh if self.single else None
        self.np_dtype = self.meta.dtype.np if self.single else None
        self.cost = cost
        self.kernel = None
        self.elementwise = elementwise


def _plain_key(v):
    """A hashable key of an attr's value with the types of its parts, or raises TypeError
    where a part is not plain (see ``_PLAIN``)."""
    t = type(v)
    if t in _PLAIN:
        return (t, v)
    if t is tuple:
        return (t,) + tuple([_plain_key(x) for x in v])
    raise TypeError(t)


def attrs_key(op, attrs):
    """The attrs' part of a call's signature, or None where it cannot be keyed: ``()`` for
    none, else each attr's name, its value's type and the value (1, 1.0 and True are equal
    in Python, not to an op's dtype inference; a tuple's parts are typed too), or for
    ``OpDef.typed_attrs`` the name and type alone, where the op's decisions depend on
    nothing else. One flat tuple: read name by name it decodes one way, since an op's typed
    attrs are fixed. Values that are not plain (numbers, strings, None, dtypes, devices,
    tuples of them) are never keyed: a list, an array, a tensor take the uncached path."""
    if not attrs:
        return ()
    typed = op.typed_attrs
    key = ()
    for k, v in attrs.items():
        t = type(v)
        if k in typed:
            key += (k, t)
        elif t in _PLAIN:
            key += (k, t, v)
        elif t is tuple:
            types = tuple(map(type, v))  # (a shape, dims: ints, in one C pass)
            if not _PLAIN.issuperset(types):
                try:
                    types = _plain_key(v)  # nested tuples
                except TypeError:
                    return None
            key += (k, types, v)
        else:
            return None
    return key


def plan_of(op, inputs, attrs, key):
    """The op's plan for this call's signature: found, or decided and kept; None for a call
    the cache does not take (see above). Raises what the uncached call raises: a device
    mismatch, ``infer``'s errors."""
    metas = []
    for i in inputs:
        m = i.meta
        if m.shape is None:
            return None
        metas.append(m)
    metas.append(key)
    k = tuple(metas)
    plans = op.plans[2]
    plan = plans.get(k)
    if plan is not None and plan.dev.backend is plan.backend:
        return plan
    plan = _decide(op, inputs, attrs)
    if plan is not None:
        STATS["decided"] += 1
        if len(plans) >= PLANS_MAX:
            plans.clear()
        plans[k] = plan
    return plan


def _operands(op, inputs):
    """One pass over an op call's inputs: ``(metas, device, wide, nbytes)``: their metas
    (waiting for a value-dependent shape first), their common device, whether one is
    bfloat16 (the kernel then computes in float32), the bytes they span. Raises DeviceError
    naming the first two inputs on different devices."""
    metas = []
    dev = None
    wide = False
    cost = 0
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
        cost += numel(m.shape) * m.dtype.itemsize
    return metas, dev, wide, cost


def _decide(op, inputs, attrs, device=None):
    """The plan of an op call that makes new outputs (``device``: where, for calls that
    say, such as factories; else the inputs'), or None for outputs whose shapes depend on
    values."""
    metas, dev, wide, cost = _operands(op, inputs)
    if (dev is not None and dev.placed) or (device is not None and device.placed):
        return None  # a global call: the global interpreter's (see _apply)
    if device is not None:
        dev = device
    backend = dev.backend or get_backend(dev)
    outs = []
    for shape, dtype in op.infer(metas, attrs):
        if shape is None:
            return None
        if dtype is BF16:
            wide = True
        nbytes = dtype.itemsize
        for s in shape:
            nbytes *= s
        cost += nbytes
        outs.append((dev.metas.get((shape, dtype)) or contiguous_meta(shape, dtype, dev), nbytes))
    fresh = op.fresh.get(dev.type) if op.fresh and not wide else None
    return Plan(dev, backend, tuple(outs), wide, fresh, cost >> 2, op.elementwise)


def _kernel(plan, op):
    """The plan's kernel (looked up at first need: most small calls run a fresh kernel)."""
    k = plan.kernel
    if k is None:
        k = plan.kernel = _kernel_of(
            op, plan.dev, plan.backend, plan.wide, [m.dtype for m, _ in plan.outs]
        )
    return k


def _kernel_of(op, dev, backend, wide, dtypes):
    """The kernel an op call on ``dev`` runs: the op's (on float32 copies where ``wide``:
    a bfloat16 operand or output, ``dtypes`` the outputs'), or none where the device has no
    data."""
    if not backend.has_data:
        return null_kernel
    k = op.kernels.get(dev.type) or op.kernel_for(dev.type)
    return wide_kernel(op, k, dev, dtypes) if wide else k


def _run(plan, op, inputs, attrs, overridden):
    """Runs a call of ``plan``: its output tensors made from the plan, then the fresh kernel
    on the spot where it may, else the op call inline or as an instruction. Returns the
    outputs."""
    backend = plan.backend
    dev = plan.dev
    if dev.backend is not backend:  # forgotten since: the backend the device has now
        op.plans[0] = op.plans[1] = NO_MEMO
        return _apply(op, inputs, attrs, dev, None, overridden)
    outs = []
    muts = ()
    for meta, nbytes in plan.outs:
        b = Blob(dev, backend, nbytes)
        outs.append(TensorImpl(meta, b))
        muts += (b,)
    consts = tuple([i.blob for i in inputs])
    stream = current_stream(backend) if overridden else backend.compute
    inline = True
    fresh = plan.fresh
    if fresh is not None:
        alloc = backend.allocator  # (a budget set since: the kernel writes allocated
        if alloc.budget is None and b.nbytes < alloc.cache_min_bytes:  # memory instead)
            if _VM.run_fresh(
                stream,
                inputs[0],
                inputs[1] if len(inputs) > 1 else None,
                b,
                plan.cost,
                op.name,
                fresh,
                attrs,
                plan.np_dtype,
                alloc,
            ):
                return outs
            inline = False  # (it waits for pending work: no use trying again)
    _issue(plan, op, inputs, attrs, outs, muts, stream, consts, inline)
    return outs


def _issue(plan, op, inputs, attrs, outs, muts, stream, consts, inline):
    """The op call of ``plan`` writing ``outs`` as the VM runs it: on the spot where
    ``inline`` and nothing it touches is pending, else as an instruction."""
    args = (
        plan.kernel or _kernel(plan, op),
        inputs if inputs.__class__ is list else list(inputs),
        outs,
        attrs,
        False,
        op.name,
    )
    if not inline or not _VM.run_inline(stream, consts, muts, plan.cost, op.name, call_op, args):
        _VM.submit(
            Instruction(
                OP_CALL,
                op.name,
                stream,
                consts,
                muts,
                run_op,
                args,
                plan.cost,
                (),
                ELEMENTWISE if plan.elementwise else None,
            )
        )


def _apply(op, inputs, attrs, device, outs, overridden):
    """The eager call no plan covers: in place (``outs``: the op writes those tensors), or
    an op whose output shapes depend on values (``op.dynamic``: outputs without a shape
    until it ran). Returns the outputs."""
    metas, dev, wide, cost = _operands(op, inputs)
    if (
        (dev is not None and dev.placed)
        or (device is not None and device.placed)
        or (outs and outs[0].meta.device.placed)
    ):
        return _GLOBAL[0](op, inputs, attrs, device, outs)
    consts = tuple([i.blob for i in inputs])
    if device is not None:
        dev = device
    backend = dev.backend or get_backend(dev)
    specs = op.infer(metas, attrs)
    if outs is None:
        outs = []
        for shape, dtype in specs:
            if dtype is BF16:
                wide = True
            if shape is None:
                o = TensorImpl(
                    _meta(TensorMeta, (None, dtype, dev, None, 0)), Blob(dev, backend, 0)
                )
            else:
                nbytes = dtype.itemsize
                for s in shape:
                    nbytes *= s
                o = TensorImpl(
                    dev.metas.get((shape, dtype)) or contiguous_meta(shape, dtype, dev),
                    Blob(dev, backend, nbytes),
                )
                cost += nbytes
            outs.append(o)
        muts = tuple([o.blob for o in outs])
    else:
        muts = tuple([o.blob for o in outs])
        consts = tuple([b for b in consts if b not in muts])
        for o in outs:
            m = o.meta
            cost += o.blob.nbytes if o.base is None else numel(m.shape) * m.dtype.itemsize
            if m.dtype is BF16:
                wide = True
    if op.dynamic and not backend.has_data:
        raise DeviceError(
            f"{op.name}: the {dev} device has no data, so an op whose output "
            f"shape depends on tensor values cannot run there; use cpu"
        )
    stream = current_stream(backend) if overridden else backend.compute
    cost >>= 2
    kernel = _kernel_of(op, dev, backend, wide, [o.meta.dtype for o in outs])
    args = (kernel, inputs, outs, attrs, op.dynamic, op.name)
    if not _VM.run_inline(stream, consts, muts, cost, op.name, call_op, args):
        _VM.submit(
            Instruction(
                OP_CALL,
                op.name,
                stream,
                consts,
                muts,
                run_op,
                args,
                cost,
                muts if op.dynamic else (),
                ELEMENTWISE if op.elementwise else None,
            )
        )
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


def use_global(interpreter, reader) -> None:
    """Hands in the global interpreter (``actorflow.parallel``): a call on global tensors
    (whose device is a placed ``sbp.Layout``), or one that makes some (``device=`` a
    layout), goes to ``interpreter(op, inputs, attrs, device, outs)``, and reading a global
    tensor reads ``reader(impl)``, a local tensor of its whole value. Found on the
    uncached path only: a cached signature is a local one."""
    _GLOBAL[0], _GLOBAL_READ[0] = interpreter, reader


def use_autograd(recorder) -> None:
    """Arms autograd (once a tensor requires grad): every op call goes first to
    ``recorder(op, inputs, attrs, device, outs)``, which returns None when there is nothing
    to record (no input needs a gradient, or the call comes from inside the recorder:
    ``below_grad``) and the call then runs as usual, or runs the call below it and returns
    its outputs with their backward node attached. Autograd lives above and hands
    its recorder in; an unarmed process pays nothing for it. (A call that writes nothing in
    place and none of whose inputs has an autograd record, ``ag``, has nothing to record:
    ``apply1`` does not hand it over.)"""
    _GRAD[0] = recorder


@contextmanager
def use_interpreter(interp: Interpreter) -> Iterator[Interpreter]:
    """Within the block, op calls on this thread go to ``interp`` (e.g. a tracer)."""
    with _override("interpreter", interp):
        yield interp


@contextmanager
def use_stream(stream: Stream) -> Iterator[Stream]:
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
        raise TraceError(
            f"{name}: this tensor is being traced, so it has no values yet; "
            f"return it from the traced function instead of reading it"
        )
    backend = blob.backend
    consts, muts = ((), (blob,)) if write else ((blob,), ())
    instr = Instruction(
        ACCESS,
        name,
        current_stream(backend),
        consts,
        muts,
        run_access,
        (impl, fn),
        # (what ``fn`` touches: a view's elements, not its whole blob's, so reading one
        # element of a large tensor runs on the spot rather than on a pool thread)
        blob.nbytes >> 2
        if impl.base is None or impl.meta.shape is None
        else numel(impl.meta.shape),
    )
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
        raise DeviceError(
            f"{name}(): copies between two devices with their own memory "
            f"({m.device} to {dev}) are not built yet; go through the host: "
            f".to('cpu').to({str(dev)!r})"
        )
    device_b = dst_b if src_b.host_memory else src_b
    instr = Instruction(
        ACCESS,
        name,
        current_stream(device_b),
        (impl.blob,),
        (out.blob,),
        _run_transfer,
        (impl, out),
        (impl.blob.nbytes + out.blob.nbytes) >> 2,
    )
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
    if impl.meta.device.placed:
        impl = _GLOBAL_READ[0](impl)
    impl = _on_host_or_whole(impl)
    instr = access(impl, fn, write=False, name=name)
    if not instr.done:
        _VM.wait(instr)
    return _result(instr, impl.blob)


async def read_async(impl, fn, name: str):
    """``read`` that awaits without blocking the running event loop."""
    if impl.meta.device.placed:
        impl = _GLOBAL_READ[0](impl)
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
        raise err.to_raise()  # a failed write left it as it was: said once, here
    return instr.result
