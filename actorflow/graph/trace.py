"""Tracing: a lazy interpreter that records op calls instead of running them, and what is
built from the record: a Program (one op actor running several ops) or an ActorGraph with
one actor per op.

The recorder is installed with ``use_interpreter`` for the duration of one call of the
traced function; its inputs are placeholder tensors (shape, dtype and device from a Spec,
no data). An op call with a placeholder among its inputs is recorded; one without (a
constant made inside the function) runs eagerly, and its result is captured as a constant.
"""

from __future__ import annotations

import functools

from ..backends import get_backend
from ..eager.interpreter import EagerInterpreter, Interpreter, check_same_device, use_interpreter
from ..errors import TraceError
from ..runtime.spec import PieceSpec, Spec, flatten, unflatten
from ..tensor.blob import Blob
from ..tensor.impl import TensorImpl
from ..tensor.meta import contiguous_meta, is_contiguous
from ..tensor.tensor import Tensor, wrap
from .program import Program, Step


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


def _run_traced(fn, args, kwargs, recorder):
    with use_interpreter(recorder):
        result = fn(*args, **kwargs)
    leaves, structure = flatten(result)
    for x in leaves:
        if not isinstance(x, Tensor):
            raise TraceError(f"a traced function must return tensors (or tuples/lists/dicts "
                             f"of them), got {type(x).__name__}")
    return leaves, structure


def _ref(src, meta, where_meta, port_of):
    """A Program ref for a source: ``port_of(src)`` maps a source to ``(kind, i, j)``."""
    kind, i, j = port_of(src)
    if kind == "const":
        return (kind, i, j, None)                   # captured as the tensor reads it
    if where_meta is not None and meta.shape == where_meta.shape and meta.offset == 0 \
            and is_contiguous(meta.shape, meta.strides):
        meta = None                                 # the whole array, as it is
    return (kind, i, j, meta)


def _meta_of(recorder, src, in_specs):
    if src[0] == "in":
        s = in_specs[src[1]]
        return contiguous_meta(s.shape, s.dtype, s.device)
    if src[0] == "node":
        return recorder.nodes[src[1]].metas[src[2]]
    return None


def op_program(fn, in_specs: list, kwargs: dict) -> Program:
    """Traces ``fn(*pieces, **kwargs)`` on placeholders of ``in_specs`` (a PieceSpec per
    input) into one Program: what ``ActorGraph.op`` runs per piece."""
    rec = Recorder()
    flat, placeholders = [], []
    for k, ps in enumerate(in_specs):
        leaves = []
        for j, s in enumerate(ps.specs):
            leaves.append(rec.placeholder(s, len(flat)))
            flat.append((k, j, s))
        placeholders.append(unflatten(ps.structure, leaves))
    out_leaves, structure = _run_traced(fn, placeholders, kwargs, rec)
    out_srcs = [rec.source(t._impl) for t in out_leaves]
    # node outputs that are program outputs (read whole) go straight into the register
    direct = {}
    for j, (t, src) in enumerate(zip(out_leaves, out_srcs)):
        m = t._impl.meta
        if src[0] == "node" and src not in direct and t._impl.base is None \
                and is_contiguous(m.shape, m.strides) and m.offset == 0:
            direct[src] = j
    tmp_specs, tmp_of = [], {}
    for n, node in enumerate(rec.nodes):
        for k, m in enumerate(node.metas):
            if ("node", n, k) not in direct:
                tmp_of[("node", n, k)] = len(tmp_specs)
                tmp_specs.append(Spec(m.shape, m.dtype, m.device))

    def port_of(src):
        if src[0] == "in":
            k, j, _ = flat[src[1]]
            return ("in", k, j)
        if src[0] == "const":
            return ("const", src[1], 0)
        if src in direct:
            return ("out", direct[src], 0)
        return ("tmp", tmp_of[src], 0)

    steps = []
    for n, node in enumerate(rec.nodes):
        dev = node.metas[0].device if node.metas else None
        ins = [_ref(src, meta, _meta_of(rec, src, [f[2] for f in flat]), port_of)
               for src, meta in node.refs]
        outs = [port_of(("node", n, k)) + (None,) for k in range(len(node.metas))]
        kernel = _kernel(node.op, dev)
        steps.append(Step(node.op, kernel, ins, node.attrs, outs))
    copies = []
    for j, (t, src) in enumerate(zip(out_leaves, out_srcs)):
        if direct.get(src) != j:
            copies.append((j, _ref(src, t._impl.meta, _meta_of(rec, src, [f[2] for f in flat]),
                                   port_of)))
    out_spec = PieceSpec(structure, [Spec(t._impl.meta.shape, t._impl.meta.dtype,
                                          t._impl.meta.device) for t in out_leaves])
    return Program(steps, out_spec, tmp_specs, rec.const_arrays(), copies)


def _kernel(op, dev):
    if dev is None or dev.type == "null":
        return None
    return op.kernels.get(dev.type) or op.kernel_for(dev.type)


class Traced:
    """A function of tensors, traced on demand. Calling it runs eagerly; ``actor_graph``
    records it on placeholders and returns an ActorGraph with one actor per op.

    Example::

        @af.trace
        def forward(x, w):
            return af.softmax(af.relu(x @ w), dim=1)

        g = forward.actor_graph(af.Spec((64, 100)), af.Spec((100, 10)))
        for y in g.run(feed=((x, w) for x in batches)): ...
    """

    def __init__(self, fn):
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def actor_graph(self, *specs, source=None, **graph_kwargs):
        """The ActorGraph of this function for inputs of ``specs`` (one Spec per argument).
        Its pieces come from ``source`` (an iterable of argument tuples) or, when None,
        from ``run(feed=...)``. ``graph_kwargs`` go to ActorGraph (memory, buffers...)."""
        from .build import traced_graph
        return traced_graph(self, specs, source, graph_kwargs)


def trace(fn) -> Traced:
    """Decorator: records ``fn``'s op calls instead of running them when asked for its
    ``actor_graph``; a plain call still runs eagerly."""
    return Traced(fn)
