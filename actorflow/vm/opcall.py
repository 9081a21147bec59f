"""How an op's kernel runs on arrays, the one place for it: which kernel an op runs on a
device (``kernel_of``), and what a kernel's exception becomes (``kernel_error``), for the
VM's op calls and for a compiled ``Program``'s steps (``actorflow.tracing``, locally and in
a Ray process) alike.

On a device with its own memory (cuda) an op's kernel is a ``DeviceKernel``, launched in
its generated form (CUDA C of ``backends/cuda/kernels.py`` with a numpy reference over the
same packed arguments) or its reference form, planned by one code for both callers: an
eager call (``device_call_op``: the plan cached by the operands' metas and attrs) and a
compiled program's step (``launch_of``: a ``Launch`` made once, each step packing only
the device arrays; ``run_launch``: a run of such steps as one generated kernel). An integer
division's zero flag is issued the same way for both (``_issue_zero``) and checked
differently: for an eager call when its instruction completes (``ZeroCheck``: only the op
fails), in a compiled step by a host function on the stream (its sticky error).

The VM's op call (a plain tuple, see ``instruction.py``): allocate outputs from the
device's allocator (on first write), hand the kernel numpy views (``call_op``; a dynamic op
returns its arrays, adopted with their shapes), run a small op through its fresh kernel
(``call_fresh``) and, for large elementwise kernels, cut the work into slices that CPU
workers run in parallel (``split_op``)."""

from __future__ import annotations

import itertools

import numpy as np

from ..backends import get_backend
from ..backends.cuda import kernels as KG
from ..backends.cuda.driver import DeviceArray, Kernel
from ..dtype import bfloat16, bfloat16_bits, bfloat16_values, from_numpy_dtype
from ..errors import DeviceError, DTypeError, KernelError
from ..ops.common import host as to_host
from ..ops.common import put
from ..ops.division import zero_division
from ..ops.elementwise import _common_np
from ..ops.registry import DERIVED
from ..tensor.meta import contiguous_meta, strided

_ND = np.ndarray


def kernel_of(op, device, metas=()):
    """The kernel ``op`` runs on ``device``: its kernel for the device type (on cuda, a
    ``DeviceKernel`` made of its numpy kernel), or ``null_kernel`` on a device without data.
    ``metas``: the call's inputs' then outputs' metas, for ``wide_kernel`` (bfloat16).

    Raises:
        DeviceError: the op has no kernel for the device type (names the ones it has)."""
    if not (device.backend or get_backend(device)).has_data:
        return null_kernel
    kernel = op.kernels.get(device.type) or op.kernel_for(device.type)
    if any(m.dtype is bfloat16 for m in metas):
        n_out = len(op.outputs)
        kernel = wide_kernel(op, kernel, device, [m.dtype for m in metas[len(metas) - n_out :]])
    return kernel


class Bfloat16Kernel:
    """An op's numpy kernel on bfloat16 operands (numpy has no bfloat16: its arrays hold the
    bits, uint16): it hands the kernel the inputs as float32, the bfloat16 outputs as
    float32 copies (an in-place op reads them), and rounds those back to bfloat16 after
    (``dtype.bfloat16_bits``). Only calls with a bfloat16 operand take it: the eager
    interpreter and a traced step pick it from the metas (``wide_kernel``)."""

    __slots__ = ("kernel", "narrow", "scalar")

    def __init__(self, kernel, narrow, scalar=None):
        self.kernel = kernel
        self.narrow = narrow  # per output: whether it is bfloat16
        self.scalar = scalar  # a Python number: None, "keep" or "reciprocal"

    def __call__(self, outs, ins, attrs):
        ins = [bfloat16_values(a) if a.dtype == _BITS else a for a in ins]
        if self.scalar == "reciprocal":  # number / x: x's reciprocal in bfloat16
            with np.errstate(divide="ignore", invalid="ignore"):  # times the number
                r = bfloat16_values(bfloat16_bits(np.float32(1) / ins[0]))
                outs[0][...] = bfloat16_bits(r * np.float32(attrs["scalar"]))
            return
        if self.scalar is None and type(attrs.get("scalar")) in (int, float):
            attrs = dict(attrs)  # a number meets a bfloat16 tensor in bfloat16, as
            attrs["scalar"] = float(bfloat16_values(bfloat16_bits([attrs["scalar"]]))[0])
        if outs is None:  # a dynamic op returns its outputs
            res = self.kernel(None, ins, attrs)
            return [bfloat16_bits(r) if n else r for r, n in zip(res, self.narrow, strict=True)]
        wide = [bfloat16_values(o) if n else o for o, n in zip(outs, self.narrow, strict=True)]
        self.kernel(wide, ins, attrs)
        for o, w, n in zip(outs, wide, self.narrow, strict=True):
            if n:
                o[...] = bfloat16_bits(w)


_BITS = np.dtype(np.uint16)
# PyTorch's cpu kernels take a number unrounded (in float32) in these; the others round it
# to bfloat16 first; number / x is x's reciprocal (rounded) times the number
_SCALAR_KEPT = {
    "mul_scalar": "keep",
    "rmul_scalar": "keep",
    "div_scalar": "keep",
    "floor_divide_scalar": "keep",
    "rdiv_scalar": "reciprocal",
}


def wide_kernel(op, kernel, device, out_dtypes):
    """``kernel`` computing in float32 for a call with a bfloat16 operand
    (``Bfloat16Kernel``).

    Raises:
        DTypeError: on a device other than cpu (bfloat16 is computed on cpu only)."""
    if device.type != "cpu":
        raise DTypeError(
            f"{op.name}: bfloat16 tensors are computed on cpu only, not on "
            f"{device}; move them with .to('cpu') or convert with .float()"
        )
    return Bfloat16Kernel(
        kernel, tuple(d is bfloat16 for d in out_dtypes), _SCALAR_KEPT.get(op.name)
    )


class DeviceKernel:
    """An op's kernel on a CUDA device (``OpDef.kernel_for("cuda")`` makes it), launched on
    the device's driver stream by ``device_call_op`` (an eager call) or as a planned
    ``Launch`` (a compiled program's step, ``launch_of``) in one of two forms:

    - generated (``generated``): an elementwise op that ``kernels.py`` covers, whose outputs
      and inputs are contiguous and each input either every element (``full``) or one
      (``scalar``): a driver ``Kernel`` with both halves for the same packed arguments, the
      CUDA C ``source`` of ``kernels.elementwise`` (what the CuPy driver compiles) and a numpy
      ``reference`` computing the same from those arguments (what the emulator runs), so
      every CI run packs the arguments a GPU launch takes. Arguments, as
      ``KernelSource.params`` lists them: the outputs and inputs (device arrays: a tensor's
      storage, or for a contiguous view one at its offset), the
      Python-number attrs as numpy scalars of the parameter's dtype (float16 as its 16 bits,
      a uint16), ``n`` (int64), and for integer division the zero flag (an int32 in device
      memory), read back after the launch: a 1 there fails the op with DivisionByZeroError,
      as on cpu (the elements divided by zero hold 0; on cpu nothing is written).
    - reference (``kernel``): anything else (a strided view, a broadcast neither full nor one
      element, an op the generator does not cover): the op's numpy kernel over the device
      arrays (the emulator's numpy views, the CuPy driver's cupy arrays); a ``host_only``
      op's over host copies of them (read when the stream gets there: the host waits for
      it), its outputs copied back. Its launch
      arguments: the number of outputs, each operand's view (None: the whole block), the
      attrs, then the device arrays, outputs first.

    Raises:
        DeviceError: the op's output shape depends on the values (the host would have to
            read the device first: not built yet)."""

    __slots__ = ("kernel", "op", "fn", "_generated", "_plans")

    def __init__(self, op, fn, device_type: str = "cuda"):
        if op.dynamic:
            raise DeviceError(
                f"op '{op.name}': its output shape depends on the values, "
                f"which {device_type} devices cannot run yet; run it on cpu "
                f"(x.to('cpu')) and move the result back with .to(...)"
            )

        def reference(n_out, views, attrs, *arrays):
            arrays = [
                a if m is None else _strided(a, m) for a, m in zip(arrays, views, strict=True)
            ]
            fn(arrays[:n_out], arrays[n_out:], attrs)

        def on_host(n_out, views, attrs, *arrays):
            arrays = [
                a if m is None else _strided(a, m) for a, m in zip(arrays, views, strict=True)
            ]
            host = [
                np.empty(a.shape, a.dtype) if i < n_out else to_host(a)  # (outputs:
                for i, a in enumerate(arrays)
            ]  # written whole)
            fn(host[:n_out], host[n_out:], attrs)
            for dst, h in zip(arrays[:n_out], host[:n_out], strict=True):
                put(dst, h)

        self.kernel = Kernel(op.name, reference=on_host if op.host_only else reference)
        self.op, self.fn = op, fn
        # signature (dtypes, layouts, attrs) -> _Generated, or None where the generator
        # refuses it; _plans: the operands' metas and attrs -> _plan's plan (a bounded cache)
        self._generated: dict | None = {} if op.name in KG.OPS and len(op.outputs) == 1 else None
        self._plans: dict = {}

    def __call__(self, outs, ins, attrs):
        raise DeviceError(
            f"op '{self.kernel.name}': a CUDA kernel runs on its device's "
            f"stream (device_call_op), never on host arrays"
        )

    def generated(self, ins, outs, attrs):
        """The generated kernel for this call and its packed arguments but the zero flag,
        ``(_Generated, args)``, or None when the call takes the reference form (``generated_for``
        refuses the operands, an output overlaps an input otherwise than element by
        element, a Python int attr is out of its parameter's range)."""
        if self._generated is None:
            return None
        out = outs[0]
        metas = [out.meta]
        for t in ins:
            metas.append(t.meta)
        plan = self.generated_for(metas, attrs)
        if plan is None:
            return None
        g, alias_ok, scalars, n64 = plan
        oblob = out.blob
        args = [_device_array(out)]
        for t, ok in zip(ins, alias_ok, strict=True):
            if t.blob is oblob and not ok:
                return None  # an output overlapping an input otherwise
            args.append(_device_array(t))
        if scalars and not _pack_scalars(scalars, attrs, args):
            return None
        args.append(n64)
        return g, args

    def generated_for(self, metas: list, attrs):
        """The generated kernel's plan for operands of ``metas`` (the output's, then each
        input's) and ``attrs``: ``(_Generated, whether each input may be the output's
        memory, scalar parameters, n as int64)``, or None where the generator cannot take
        them. Cached by the metas and the attrs (a Python number by its type: its value
        is a launch parameter, packed by ``_pack_scalars``)."""
        if self._generated is None:
            return None
        cache = self._plans
        key = metas.copy()
        for k, v in attrs.items():
            c = v.__class__
            key.append(k)
            key.append(c if c is bool or c is int or c is float else v)
        sig = tuple(key)
        try:
            plan = cache.get(sig)
        except TypeError:  # an attr that is not hashable
            return None
        if plan is None:
            if len(cache) >= _PLANS_MAX:
                cache.clear()
            plan = cache[sig] = self._plan(metas[1:], metas[0], attrs) or _NO_PLAN
        return None if plan is _NO_PLAN else plan

    def _plan(self, in_metas, m, attrs):
        """``generated_for``'s plan for inputs of ``in_metas`` and an output of meta ``m``, or None
        where the generator cannot take them."""
        n = m.numel
        if not n or not m.is_contiguous or m.dtype.name not in KG.CTYPE:
            return None
        sig, alias_ok = [m.dtype.name], []
        for im in in_metas:
            if not im.is_contiguous or im.dtype.name not in KG.CTYPE:
                return None
            layout = "full" if im.numel == n else "scalar" if im.numel == 1 else None
            if layout is None:
                return None  # a broadcast of another shape
            sig.append((im.dtype.name, layout, not im.shape))
            alias_ok.append(layout == "full" and im.offset == m.offset)
        scalars, fixed = [], []
        for k, v in attrs.items():
            c = v.__class__
            if c is bool or c is int or c is float:
                scalars.append((k, _PYTYPE[c]))
            elif isinstance(v, (int, float, complex, np.generic)):
                return None  # a number the generator takes no parameter for
            else:
                fixed.append((k, v))
        sig_key = (tuple(sig), tuple(scalars), tuple(fixed))
        g = self._generated.get(sig_key, _NO_PLAN)
        if g is _NO_PLAN:
            g = self._generated[sig_key] = _Generated.make(self, sig, scalars, fixed)
        if g is None:
            return None
        params = []
        for attr, ptype in g.scalar_params:
            dt = np.dtype(ptype)
            lo = hi = None
            if dt.kind in "iu":
                lo, hi = -(1 << (8 * dt.itemsize - 1)), 1 << (8 * dt.itemsize - 1)
            params.append((attr, dt.type, lo, hi, dt == np.float16))
        return g, tuple(alias_ok), tuple(params), np.int64(n)


_PYTYPE = {bool: "bool", int: "int", float: "float"}
_NO_PLAN = ()  # a cached "the generator cannot take these"
_PLANS_MAX = 1024  # plans kept per op (shapes seen), then started over
_ZERO32 = np.zeros(1, np.int32)  # the zero flag's initial value (never written)
_ZERO32.flags.writeable = False


def _pack_scalars(scalars, attrs, args: list) -> bool:
    """Appends to ``args`` the Python-number ``attrs`` as a plan's ``scalars`` say (each a
    numpy scalar of its parameter's dtype, float16 as its 16 bits); False where a value does
    not fit its parameter (the call then takes the reference form)."""
    for attr, typ, lo, hi, f16 in scalars:
        v = attrs[attr]
        if lo is not None and not lo <= v < hi:
            return False  # a Python int out of the parameter's range
        try:
            v = typ(v)
        except OverflowError:  # (an int past float64: the numpy kernel says so)
            return False
        args.append(v.view(np.uint16) if f16 else v)
    return True


def _device_array(t) -> DeviceArray:
    """Contiguous tensor ``t`` as a device array: its storage's own when it is not a view,
    else one of its shape at the view's offset."""
    d = t.blob.array.darray
    return d if t.base is None else _at(d, t.meta)


def _at(d: DeviceArray, m) -> DeviceArray:
    """The contiguous view ``m`` (a TensorMeta) of the whole device array ``d``."""
    return DeviceArray(d.memory, d.offset + m.offset * d.dtype.itemsize, m.shape, d.dtype)


def _strided(a, meta):
    """The view ``meta`` describes over the contiguous array ``a``: a numpy array through
    ``tensor.meta.strided``; another array type (the CuPy driver hands in cupy arrays) by
    its own constructor ``(shape, dtype, memptr, strides)``, as cupy.ndarray takes it."""
    if a.__class__ is np.ndarray:
        return strided(a, meta)
    size = a.itemsize
    if 0 in meta.shape:  # (of any base, a 0-dim one too: a scalar's gradient expanded)
        return a.reshape(-1)[:0].reshape(meta.shape)
    return a.__class__(
        meta.shape, a.dtype, a.data + meta.offset * size, tuple(s * size for s in meta.strides)
    )


class _Generated:
    """One signature's generated kernel: ``kernel`` (a driver Kernel with the source and a
    reference over the packed arguments), ``scalar_params`` ((attr, parameter dtype) in
    launch order), ``zero`` (whether it takes the zero flag); for ``run_launch``: ``step`` (the
    op as a ``kernels.Step`` over inputs ``a0, a1...``), ``ins`` ((dtype, layout, 0-d) per
    input) and ``dtype`` (the output's)."""

    __slots__ = ("kernel", "scalar_params", "zero", "divisor", "division", "step", "ins", "dtype")
    kernel: Kernel
    scalar_params: tuple  # ((attr, parameter dtype), ...)
    zero: bool
    divisor: int | None  # the operand whose zeros divide by zero (None: no division)
    division: str  # the division's name, for its error
    step: KG.Step
    ins: tuple  # ((dtype name, layout, 0-d), ...)
    dtype: str  # the output's dtype name

    @staticmethod
    def make(dk: DeviceKernel, sig, scalars, fixed):
        """The kernel of signature ``sig`` (output dtype, then (dtype, layout) per input),
        or None where the generator refuses it (the call then takes the reference form)."""
        op = dk.op
        name = op.name
        out_dtype, ins = sig[0], sig[1:]
        compute = None
        if name in KG.COMPARE_OPS and len(ins) == 2:
            a, b = (np.empty(() if zd else (1,), np.dtype(dt)) for dt, _, zd in ins)
            compute = from_numpy_dtype(_common_np(a, b)).name
        step = KG.Step(
            "out",
            name,
            tuple(f"a{j}" for j in range(len(ins))),
            out_dtype,
            tuple(scalars),
            tuple((k, v) for k, v in fixed if isinstance(v, str)),
            compute,
        )
        run = KG.FusedRun(
            tuple(KG.Value(a, dt, lay) for a, (dt, lay, _) in zip(step.args, ins, strict=True)),
            (step,),
            ("out",),
        )
        try:
            # all float32: the float4 form (it checks the pointers' alignment itself)
            src = KG.fused(run, 4 if KG.vectorizable(run) else 1)
        except (DeviceError, DTypeError, ValueError):
            return None
        g = _Generated()
        g.step, g.ins, g.dtype = step, tuple(ins), out_dtype
        g.scalar_params = tuple(
            (p.split("_", 1)[1], t) for p, kind, t in src.params if kind == "scalar"
        )
        g.zero = any(kind == "zero" for _, kind, _ in src.params)
        # the operand whose zeros divide by zero: b of a // b, x of s // x (x // s: s is
        # never 0 here, the op's inference refuses it); the division's name, for the error
        scalar_form = name.endswith("_scalar")
        reverse = scalar_form and name[:-7] not in KG.BINARY_OPS
        g.divisor = None if not g.zero else 1 if len(ins) == 2 else 0 if reverse else None
        g.division = name[1 if reverse else 0 : -7 if scalar_form else None]
        g.kernel = Kernel(
            name,
            entry=src.name,
            source=src.source,
            params=src.params,
            reference=g._reference(dk.fn, len(ins), ins, scalars, dict(fixed)),
        )
        return g

    def _reference(self, fn, n_in: int, ins, scalars, fixed):
        """The numpy function of the packed arguments: rebuilds the op's inputs (one-element
        inputs as they were, 0-d or not) and attrs from them and runs the op's numpy kernel;
        an integer division by zero sets the flag and writes 0 there, as the CUDA kernel."""
        zero_d = [zd for _, _, zd in ins]
        any_zero_d = any(zero_d)
        ptypes = dict(scalars)
        convs = [
            (attr, t == "float16", {"bool": bool, "int": int, "float": float}[ptypes[attr]])
            for attr, t in self.scalar_params
        ]
        first, last = 1 + n_in, 1 + n_in + len(convs)
        divisor = self.divisor

        def reference(*args):
            out = args[0]
            xs = list(args[1:first])
            if any_zero_d:
                xs = [a.reshape(()) if z else a for a, z in zip(xs, zero_d, strict=True)]
            attrs = dict(fixed)
            for (attr, f16, py), v in zip(convs, args[first:last], strict=True):
                attrs[attr] = py(v.view(np.float16) if f16 else v)
            if divisor is not None:
                flag = args[-1]
                d = xs[divisor]
                hit = d == 0
                if hit.any():
                    flag[0] = 1
                    xs[divisor] = np.where(hit, np.ones((), d.dtype), d)
                    fn([out], xs, attrs)
                    out[np.broadcast_to(hit, out.shape)] = 0
                    return
            fn([out], xs, attrs)

        return reference


def _device_kernel(op):
    """``OpDef.kernel_for``'s way to a CUDA kernel: the op's numpy kernel wrapped (None when
    it has none: kernel_for then names the devices it runs on)."""
    fn = op.kernels.get("cpu")
    return None if fn is None else DeviceKernel(op, fn)


DERIVED["cuda"] = _device_kernel


def device_call_op(args, stream) -> ZeroCheck | None:
    """Issues one op call (``args`` as ``call_op``'s) on the driver ``stream`` of a device
    with its own memory: allocates the outputs, then launches the op's generated kernel
    when it takes this call (``DeviceKernel.generated``), else its reference kernel over the
    operands' device arrays (views described by their metas, applied where it runs). A
    generated integer division reads its zero flag back (``_issue_zero``; the flag is a
    block of the device's cache, freed once issued: reused after this stream's work) and
    returns its ``ZeroCheck``, which the VM runs when the instruction completes; else None."""
    kernel, ins, outs, attrs, dynamic, name = args
    allocate(outs, name)
    gen = kernel.generated(ins, outs, attrs)
    if gen is not None:
        g, packed = gen
        if not g.zero:
            stream.launch(g.kernel, tuple(packed))
            return None
        backend = outs[0].blob.backend
        caching = backend.caching()
        block = caching.malloc(4, stream)
        seen = backend.driver().pinned((1,), np.int32)
        try:
            _issue_zero(stream, g, packed, block.array((1,), np.int32), seen, _ZERO32)
        finally:
            caching.free(block)  # reused after this stream's work (allocator.py)
        return ZeroCheck(seen, g.division, g.dtype)
    arrays, views = [], []
    for t in (*outs, *ins):
        arrays.append(t.blob.array.darray)
        views.append(None if t.base is None else t.meta)
    stream.launch(kernel.kernel, (len(outs), views, attrs, *arrays))
    return None


def _issue_zero(
    stream, g, packed: list, flag: DeviceArray, seen, zero, sticky: bool = False
) -> None:
    """Issues generated integer division ``g`` with its zero flag: ``flag`` (an int32 in
    device memory) set from ``zero`` (host memory holding 0) before the launch and copied
    to ``seen`` (pinned host memory) after it. ``sticky`` (a compiled step): then a host
    function that raises DivisionByZeroError when it is set, the stream's sticky error,
    which skips the stream's later commands; else the caller checks ``seen`` once the
    stream passed it (``ZeroCheck``), which fails only this op. Every command is one a
    CUDA graph captures (no allocation, no host sync)."""
    stream.copy_h2d(flag, zero)
    stream.launch(g.kernel, (*packed, flag))
    stream.copy_d2h(seen, flag)
    if sticky:
        division, dtype = g.division, g.dtype
        stream.add_callback(lambda: _check_zero(seen, division, dtype))


class ZeroCheck:
    """An eager integer division's zero flag, read back into pinned host memory ``seen``:
    the VM asks ``error()`` on its loop once the instruction's event completed (the flag is
    there then), and fails only that op (and, by the poison rules, what is computed from
    its outputs), as on cpu: no sticky stream error, so unrelated work goes on."""

    __slots__ = ("seen", "division", "dtype")

    def __init__(self, seen, division: str, dtype: str):
        self.seen, self.division, self.dtype = seen, division, dtype

    def error(self):
        """DivisionByZeroError when the kernel set the flag, else None."""
        return zero_division(self.division, self.dtype, True) if self.seen[0] else None


class Launch:
    """One launch of a kernel on a device, made once for operands of fixed metas and
    attrs (``launch_of``: a compiled program's step; ``run_launch``: a run of them). Each
    ``issue`` only packs the operands' device arrays (the whole arrays, outputs first):
    ``head``, then each array (seen through its contiguous view in ``at``, or whole where
    that is None), then ``tail``. ``name``: the op's (the ops' joined by ``+`` for a
    run: what the profiler and an injected fault name); ``gen``: the ``_Generated`` of a
    generated launch (None for the reference form and a run), ``scalars`` its packed
    attrs and ``n`` its element count (what ``run_launch`` takes); ``ops``: how many op
    steps it computes (more than 1: a run); ``zero``: the ``(flag, seen, zero)`` buffers
    of a generated integer division (``_issue_zero``), given by the caller before the
    first issue (``needs_zero``)."""

    __slots__ = ("name", "kernel", "head", "tail", "at", "gen", "scalars", "n", "zero", "ops")

    def __init__(
        self,
        name: str,
        kernel,
        head: tuple,
        tail: tuple,
        at: tuple,
        gen=None,
        scalars: tuple = (),
        n=None,
        ops: int = 1,
    ):
        self.name, self.kernel, self.head, self.tail, self.at = name, kernel, head, tail, at
        self.gen, self.scalars, self.n, self.ops = gen, scalars, n, ops
        self.zero = None

    @property
    def needs_zero(self) -> bool:
        return self.gen is not None and self.gen.zero

    def issue(self, stream, arrays: list) -> None:
        """Launches on the driver ``stream`` over ``arrays`` (device arrays, whole)."""
        packed = list(self.head)
        for a, m in zip(arrays, self.at, strict=True):
            packed.append(a if m is None else _at(a, m))
        packed.extend(self.tail)
        if self.zero is None:
            stream.launch(self.kernel, tuple(packed))
        else:
            flag, seen, zero = self.zero
            _issue_zero(stream, self.gen, packed, flag.blob.array.darray, seen, zero, True)


def launch_of(kernel, n_out: int, metas: list, views: list, attrs, aliased: tuple = ()) -> Launch:
    """The launch of ``kernel`` (an op's ``DeviceKernel``) over ``n_out`` outputs and then
    its inputs, made once: each operand's meta ``metas`` (the view it is read through,
    else its whole array's), ``views`` (each one's view, None for the whole array),
    ``aliased`` (per input, whether it is the output's memory). The generated kernel where
    ``DeviceKernel.generated_for`` takes these operands and the attrs fit their
    parameters, else the reference form (the op's numpy kernel over the views). An eager
    call (``generated``) takes the same plan and packing."""
    name = kernel.op.name
    if n_out == 1 and isinstance(kernel, DeviceKernel):
        plan = kernel.generated_for(list(metas), attrs)
        if plan is not None:
            g, alias_ok, scalars, n64 = plan
            packed: list = []
            if all(ok or not a for a, ok in zip(aliased, alias_ok, strict=True)) and _pack_scalars(
                scalars, attrs, packed
            ):
                return Launch(
                    name, g.kernel, (), (*packed, n64), tuple(views), g, tuple(packed), n64
                )
    return Launch(name, kernel.kernel, (n_out, tuple(views), attrs), (), (None,) * len(views))


def eager_part(args):
    """An eager op call's part of a run (``run_launch``): ``(launch, keys)`` where the call
    ``args`` (as ``call_op``'s; one output) takes its generated kernel, not an integer
    division, else None. ``keys`` name each operand's memory, the output first: a tensor
    over all of its blob by the blob (so an earlier member's output read whole is that
    value), any other view by its blob and meta."""
    kernel, ins, outs, attrs, dynamic, _ = args
    if (
        dynamic
        or len(outs) != 1
        or kernel.__class__ is not DeviceKernel
        or kernel._generated is None
    ):
        return None
    out = outs[0]
    ob = out.blob
    metas, views, keys, aliased = [], [], [], []
    for t in (out, *ins):
        m = t.meta
        b = t.blob
        metas.append(m)
        views.append(None if t.base is None else m)
        keys.append(
            b
            if not m.offset and m.is_contiguous and m.numel * m.dtype.itemsize == b.nbytes
            else (b, m)
        )
    for t in ins:
        aliased.append(t.blob is ob)
    launch = launch_of(kernel, 1, metas, views, attrs, tuple(aliased))
    if launch.gen is None or launch.gen.zero:
        return None
    return launch, keys


def run_launch(parts: list, writes: tuple | None = None) -> tuple | None:
    """One launch of ``kernels.fused`` (a run) for consecutive generated launches
    ``parts`` of one element count (none an integer division): ``[(launch, keys)]``,
    ``keys`` naming each operand's memory (the output first): an input whose key an
    earlier part's output has is that value, kept in registers; any other key is an
    operand of the run, once. ``writes``: the parts whose outputs the run writes to memory,
    in order (default: the last part's); the others stay in registers. The float4 form
    when every value is float32. Its numpy reference runs each part's own reference in turn
    over the packed arguments, each value in a numpy array of its dtype (rounded as the
    op's kernel rounds it). The kernel is made once per shape of run (its parts' generated
    kernels, which value each reads, what it writes: ``_RUN_KERNELS``), so a run that
    recurs generates no source again. Returns ``(launch, keys of its operands)``: the
    written outputs', then the run's inputs in first-read order; None where the generator
    refuses the run."""
    if writes is None:
        writes = (len(parts) - 1,)
    values: dict = {}
    operands: list = []
    at: list = []
    shape: list = []
    for k, (launch, keys) in enumerate(parts):
        args = []
        for j, key in enumerate(keys[1:]):
            v = values.get(key)
            if v is None:
                v = values[key] = len(operands)  # the run's input i<v>
                operands.append(key)
                at.append(launch.at[1 + j])
            args.append(v)
        values[keys[0]] = -1 - k  # the value of part k
        shape.append((launch.gen, tuple(args)))
    run = (tuple(shape), writes)
    made = _RUN_KERNELS.get(run)
    if made is None:
        made = _run_kernel(*run, len(operands))
        if len(_RUN_KERNELS) >= _RUN_KERNELS_MAX:
            _RUN_KERNELS.clear()
        _RUN_KERNELS[run] = made
    if made is _NO_PLAN:
        return None
    scalars = tuple(v for launch, _ in parts for v in launch.scalars)
    return (
        Launch(
            made.name,
            made,
            (),
            (*scalars, parts[-1][0].n),
            (*[parts[k][0].at[0] for k in writes], *at),
            ops=len(parts),
        ),
        [*[parts[k][1][0] for k in writes], *operands],
    )


_RUN_KERNELS: dict = {}  # a run's shape (run_launch) -> its Kernel
_RUN_KERNELS_MAX = 512


def _run_kernel(shape: tuple, writes: tuple, n_in: int):
    """The Kernel of a run of ``shape``: per part, its ``_Generated`` and what each of its
    inputs is (``v >= 0``: the run's input ``i<v>``; ``v < 0``: the value of part ``-1 - v``);
    ``writes``: the parts whose outputs it writes; ``n_in`` inputs. ``_NO_PLAN`` where the
    generator refuses it."""
    inputs: list = [None] * n_in
    layout_of, steps, order = {}, [], []
    for k, (g, args) in enumerate(shape):
        names = []
        for j, v in enumerate(args):
            if v >= 0:
                nm = f"i{v}"
                if inputs[v] is None:
                    dt, layout, zero_d = g.ins[j]
                    inputs[v] = KG.Value(nm, dt, layout)
                    layout_of[nm] = (layout, zero_d)
            else:
                nm = f"t{-1 - v}"
            names.append(nm)
        out = f"t{k}"
        steps.append(
            KG.Step(
                out,
                g.step.op,
                tuple(names),
                g.step.dtype,
                g.step.scalars,
                g.step.attrs,
                g.step.compute,
            )
        )
        order.append(
            (g.kernel.reference, tuple(names), out, np.dtype(g.dtype), len(g.scalar_params))
        )
    outputs = tuple(steps[k].out for k in writes)
    run = KG.FusedRun(tuple(inputs), tuple(steps), outputs)
    try:
        src = KG.fused(run, 4 if KG.vectorizable(run) else 1)
    except (DeviceError, DTypeError, ValueError):
        return _NO_PLAN  # (each step's own kernel took it: not expected)
    names = [v.name for v in inputs]
    n_out = len(outputs)
    written = {o: j for j, o in enumerate(outputs)}
    # after each step, the intermediates read for the last time (their buffers are reused)
    last_read = {}
    for k, (_, ins, o, _, _) in enumerate(order):
        last_read[o] = k
        for nm in ins:
            last_read[nm] = k
    done_after: list[list] = [[] for _ in order]
    for _, _, o, _, _ in order:
        if o not in written:
            done_after[last_read[o]].append(o)

    def reference(*args):
        n = int(args[-1])
        outs = args[:n_out]
        vals = {}
        for nm, a in zip(names, args[n_out:], strict=False):  # (the scalars and n follow)
            layout, zero_d = layout_of[nm]
            vals[nm] = a.reshape(n) if layout == "full" else a if zero_d else a.reshape(1)
        scal = args[n_out + len(names) : -1]
        s = 0
        spare: dict = {}  # dtype -> buffers of intermediates no longer read
        for (ref, ins, o, dt, n_scal), done in zip(order, done_after, strict=True):
            j = written.get(o)
            if j is not None:
                dst = outs[j].reshape(n)
            else:
                free = spare.get(dt)
                dst = free.pop() if free else np.empty(n, dt)
            ref(dst, *[vals[nm] for nm in ins], *scal[s : s + n_scal], n)
            s += n_scal
            vals[o] = dst
            for nm in done:
                spare.setdefault(vals[nm].dtype, []).append(vals.pop(nm))

    name = "+".join(g.step.op for g, _ in shape)
    return Kernel(name, entry=src.name, reference=reference, source=src.source, params=src.params)


_STICKY_ZERO = (
    " [in a compiled step on cuda the zero flag is checked by a host function on "
    "the device's stream, so this is the stream's sticky error: the step's later "
    "commands (its state's write-back) were skipped, and the work issued on that "
    "stream behind the step before it completed fails with this error too; an "
    "eager division fails only itself and what is computed from it]"
)


def _check_zero(seen, op: str, dtype: str) -> None:
    """A compiled step's integer division's host function: raises the op's cpu error,
    DivisionByZeroError, saying that it is the stream's sticky error, when the kernel set
    the zero flag."""
    if seen[0]:
        e = zero_division(op, dtype, True)
        e.args = (e.args[0] + _STICKY_ZERO,)
        raise e


def kernel_error(
    op: str, device, e: BaseException, intact: bool = False, note: str = ""
) -> KernelError:
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
    """``fresh_into`` with its arguments packed: ``args`` is ``(fresh, ins, out_blob, attrs,
    numpy dtype, allocator)``, an op call as ``VM.run_inline`` runs it."""
    fresh_into(*args)


def fresh_into(fresh, ins, b, attrs, dtype, allocator) -> None:
    """Runs a small op call through its fresh kernel, which returns the output array (numpy
    allocates it), and gives it to the output blob ``b``. The array is counted in the
    allocator's log as ``empty`` would have (small arrays are never cached, only counted)."""
    if len(ins) == 1:  # (no comprehension: no function object per call)
        i = ins[0]
        in_arrays = [i.blob.array if i.base is None else i.array()]
    else:
        in_arrays = []
        for i in ins:
            in_arrays.append(i.blob.array if i.base is None else i.array())
    r = fresh(in_arrays, attrs, dtype)
    if r.__class__ is not _ND or r.dtype is not dtype or (r.ndim > 1 and not r.flags.c_contiguous):
        r = as_fresh(r, dtype)
    b.array = r
    b.allocated = True
    if b.nbytes:
        log = allocator.log
        log.append(b.nbytes)
        if len(log) > allocator.fold_at:
            allocator.fold()


def as_fresh(r, dtype):
    """A fresh kernel's result that is not a C-contiguous array of ``dtype`` (a 0-d
    result, an unusual layout) as one."""
    return np.array(r, dtype=dtype, order="C")


def _run_dynamic(name, kernel, ins, outs, attrs) -> None:
    results = kernel(None, [i.array() for i in ins], attrs)
    for o, arr in zip(outs, results, strict=True):
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
    for lo, hi in itertools.pairwise(bounds):
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
