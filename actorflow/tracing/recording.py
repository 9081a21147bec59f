"""Recording a function of tensors: a lazy interpreter that records op calls on placeholder
tensors instead of running them (``Recorder``), and ``Recording``, one recorded call with
what the builders (``trace.op_program``, ``build.traced_graph``) read from it.

The recorder is installed with ``use_interpreter`` for the duration of one call of the
function; its inputs are placeholder tensors (shape, dtype and device from a Spec, no data).
An op call with a placeholder among its inputs is recorded; one without (a constant made
inside the function) runs eagerly, and its result is captured as a constant.
"""

from __future__ import annotations

from ..backends import get_backend
from ..eager.interpreter import (EagerInterpreter, Interpreter, check_same_device,
                                 use_interpreter)
from ..errors import TraceError
from ..runtime.spec import Spec, flatten
from ..tensor.blob import Blob
from ..tensor.impl import TensorImpl
from ..tensor.meta import contiguous_meta, is_contiguous
from ..tensor.tensor import Tensor, wrap


_RANDOM = ("rand", "randn")


class TracedBlob(Blob):
    """The storage of a placeholder or of a recorded op's output: it never holds data."""

    __slots__ = ()
    traced = True


class Node:
    """One recorded op call: ``refs`` per input ``(source, meta)``, its output blobs."""

    __slots__ = ("op", "refs", "attrs", "outs", "metas")

    def __init__(self, op, refs, attrs, outs, metas):
        self.op, self.refs, self.attrs, self.outs, self.metas = op, refs, attrs, outs, metas


class Recorder(Interpreter):
    """Records op calls on placeholders. ``where[blob]`` says what made a traced blob:
    ``("in", j)`` placeholder leaf j, or ``("node", n, i)`` output i of node n."""

    def __init__(self):
        self.nodes: list = []
        self.where: dict = {}
        self.consts: dict = {}        # id(impl) -> (const index, TensorImpl kept alive)
        self._eager = EagerInterpreter()

    def placeholder(self, spec: Spec, j: int) -> Tensor:
        dev = spec.device
        impl = TensorImpl(contiguous_meta(spec.shape, spec.dtype, dev),
                          TracedBlob(dev, get_backend(dev), spec.nbytes))
        self.where[impl.blob] = ("in", j)
        return wrap(impl)

    def state(self, spec: Spec, i: int) -> Tensor:
        """A placeholder for state ``i``: an array the program reads and may write back
        (``nn.Graph``'s parameters and optimizer state), held across pieces."""
        t = self.placeholder(spec, -1)
        self.where[t._impl.blob] = ("state", i)
        return t

    def source(self, impl):
        blob = impl.blob
        if blob.traced:
            src = self.where.get(blob)
            if src is None:
                raise TraceError("a tensor traced by another trace was used here; trace one "
                                 "function at a time")
            return src
        entry = self.consts.get(id(impl))          # one copy per tensor (views included)
        if entry is None:
            entry = (len(self.consts), impl)
            self.consts[id(impl)] = entry
        return ("const", entry[0])

    def apply(self, op, inputs, attrs, device=None, outs=None):
        if not any(i.blob.traced for i in inputs):
            if op.name in _RANDOM:
                raise TraceError(f"{op.name}: a random op inside a traced function would run "
                                 f"once, while tracing, and repeat the same values for every "
                                 f"piece; make the random values outside and pass them in "
                                 f"(or use dropout outside graph mode)")
            return self._eager.apply(op, inputs, attrs, device, outs)
        if outs is not None:
            raise TraceError(f"{op.name}: in-place ops on traced tensors are not recorded; "
                             f"use the out-of-place form (e.g. x = x + y, not x.add_(y))")
        if op.dynamic:
            raise TraceError(f"{op.name}: its output shape depends on the values, so it "
                             f"cannot be planned ahead; run it eagerly outside the traced "
                             f"function")
        metas = [i.meta for i in inputs]
        dev = device or check_same_device(inputs, op.name)
        refs = [(self.source(i), i.meta) for i in inputs]
        specs = op.infer(metas, attrs)
        backend = get_backend(dev)
        out_impls = []
        n = len(self.nodes)
        for k, (shape, dtype) in enumerate(specs):
            nbytes = dtype.itemsize
            for s in shape:
                nbytes *= s
            impl = TensorImpl(contiguous_meta(shape, dtype, dev), TracedBlob(dev, backend, nbytes))
            self.where[impl.blob] = ("node", n, k)
            out_impls.append(impl)
        self.nodes.append(Node(op, refs, attrs, [o.blob for o in out_impls],
                               [o.meta for o in out_impls]))
        return out_impls

    def const_arrays(self) -> list:
        ordered = sorted(self.consts.values(), key=lambda e: e[0])
        return [wrap(impl).numpy() for _, impl in ordered]


class Recording:
    """One call of ``fn`` recorded on placeholders of ``leaf_specs`` (placeholder j has leaf
    spec j; ``args_of(placeholders)`` arranges them into ``fn``'s arguments).

    ``nodes``: the recorded op calls; ``outputs``: the tensors ``fn`` returned, flattened,
    with ``structure``. A *source* says what made a tensor: ``("in", j)``, ``("node", n,
    i)`` or ``("const", c)``."""

    def __init__(self, fn, leaf_specs, args_of, kwargs=None, state_specs=None):
        self.recorder = rec = Recorder()
        self.leaf_specs = list(leaf_specs)
        self.state_specs = list(state_specs or ())
        args = args_of([rec.placeholder(s, j) for j, s in enumerate(self.leaf_specs)])
        kwargs = dict(kwargs or {})
        if state_specs is not None:     # fn(*args, states=[placeholder per state], **kwargs)
            kwargs["states"] = [rec.state(s, i) for i, s in enumerate(self.state_specs)]
        with use_interpreter(rec):
            result = fn(*args, **kwargs)
        leaves, self.structure = flatten(result)
        for x in leaves:
            if not isinstance(x, Tensor):
                raise TraceError(f"a traced function must return tensors (or tuples/lists/"
                                 f"dicts of them), got {type(x).__name__}")
        self.outputs = leaves
        self.nodes = rec.nodes

    def source(self, impl):
        """What made the tensor ``impl`` (see the class doc)."""
        return self.recorder.source(impl)

    def const_arrays(self) -> list:
        """The values of the constants, by constant index."""
        return self.recorder.const_arrays()

    def meta_of(self, src):
        """The meta of the whole array a source names (None for a constant)."""
        if src[0] == "in":
            s = self.leaf_specs[src[1]]
            return contiguous_meta(s.shape, s.dtype, s.device)
        if src[0] == "node":
            return self.nodes[src[1]].metas[src[2]]
        if src[0] == "state":
            s = self.state_specs[src[1]]
            return contiguous_meta(s.shape, s.dtype, s.device)
        return None

    def ref(self, src, meta, port_of):
        """A Program ref ``(kind, i, j, view meta)`` for reading source ``src`` through
        ``meta``; ``port_of(src)`` maps a source to ``(kind, i, j)``. The view meta is None
        when the whole array is read as it is."""
        kind, i, j = port_of(src)
        if kind == "const":
            return (kind, i, j, None)               # captured as the tensor reads it
        whole = self.meta_of(src)
        if whole is not None and meta.shape == whole.shape and meta.offset == 0 \
                and is_contiguous(meta.shape, meta.strides):
            meta = None                             # the whole array, as it is
        return (kind, i, j, meta)
