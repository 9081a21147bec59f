"""backward(): an iterative sweep over the recorded nodes, latest first.

From the roots it counts, for every node it can reach, how many edges lead into it; a node
runs once all of them have delivered (its gradients summed in the order they arrived), the
ready ones by decreasing creation order (a heap on ``Node.seq``), so the same program
accumulates in the same order every time. Leaves accumulate into ``.grad``. Rules run under
no_grad: their ops are queued on the VM like any others; nothing here waits for values.
"""

from __future__ import annotations

import heapq
import weakref

from .. import functional as F
from ..tensor.impl import pinned
from ..tensor.tensor import wrap
from .mode import no_grad
from .nodes import Meta, Node


class Ctx:
    """What a rule sees of its node (see ``rules.py``)."""

    __slots__ = ("node", "needs")

    def __init__(self, node: Node, needs: tuple):
        self.node = node
        self.needs = needs

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def attrs(self) -> dict:
        return self.node.attrs

    def shape(self, k: int) -> tuple:
        return self.node.ins[k].shape

    def x(self, k: int):
        return wrap(self.node.saved_in[k])

    def y(self, k: int):
        blob, meta = self.node.saved_out[k]
        return wrap(pinned(meta, blob))


def _check_saved(node: Node) -> None:
    if node.released:
        raise RuntimeError(
            f"backward through {node.name!r} a second time: its saved tensors were freed by "
            f"the first backward(); pass retain_graph=True to the first call if you need "
            f"to run backward twice"
        )
    saved = [(t.blob, t.meta) if t is not None else None for t in node.saved_in or ()]
    saved += list(node.saved_out or ())
    pairs = list(zip(saved, node.versions, strict=True))
    if node.watch is not None:
        ref, m, v = node.watch
        blob = ref()
        if blob is not None:
            pairs.append(((blob, m), v))
    for bm, v in pairs:
        if bm is not None and bm[0].version != v:
            blob, m = bm
            raise RuntimeError(
                f"one of the tensors {node.name!r} saved for backward ({m.dtype}{list(m.shape)}) "
                f"was modified by an in-place operation after it was saved (version {v}, now "
                f"{blob.version}); compute out of place (x = x * 2, not x.mul_(2)) or clone "
                f"it before modifying it"
            )


def _fit(g, meta, node: Node, k: int):
    """A rule's gradient for input ``k``: checked against the input's shape, in its dtype
    and on its device."""
    gm = g._impl.meta
    if gm.shape != meta.shape:
        raise RuntimeError(
            f"internal error: the grad rule of {node.name!r} gave input {k} a "
            f"gradient of shape {gm.shape}, expected {meta.shape}"
        )
    if gm.dtype is not meta.dtype:
        g = F.cast(g, meta.dtype)
    if gm.device is not meta.device and not _sum_of_parts(gm.device, meta, node.edges[k]):
        g = F.to_device(g, meta.device)
    return g


def _sum_of_parts(dev, meta, edge) -> bool:
    """Whether a broadcast gradient (on ``dev``) goes on as it is to ``meta``, a partial
    sum made inside the graph: the gradient of a sum of parts is each part's, the same on
    every rank, so it stays broadcast (made partial, it would be summed again, across the
    ranks, wherever a later rule needs it split: a collective for nothing). A leaf's
    ``.grad`` is still made partial, in its tensor's layout."""
    if edge is None or isinstance(edge[0], Meta) or not dev.placed or not meta.device.placed:
        return False
    to, got = meta.device, dev
    return (
        to.placement is got.placement
        and all(s.kind == "P" for s in to.sbp)
        and all(s.kind == "B" for s in got.sbp)
    )


class _Held:
    """The gradients more than one place may hold (handed to a node, a retained grad, the
    caller's ``gradient=``), by identity: weakly, so that a tensor freed during backward
    neither stays alive for it nor marks a later tensor that takes its ``id``."""

    __slots__ = ("refs",)

    def __init__(self, tensors: list) -> None:
        self.refs: dict = {}
        for t in tensors:
            self.add(t)

    def add(self, t) -> None:
        self.refs[id(t)] = weakref.ref(t)

    def __contains__(self, t) -> bool:
        r = self.refs.get(id(t))
        return r is not None and r() is t


def _accumulate(meta: Meta, g, shared: _Held) -> None:
    """Adds ``g`` to a leaf's ``.grad``. A first gradient becomes ``.grad`` itself unless
    something else holds it too (``shared``: handed to another input, a retained grad, the
    caller's ``gradient=``) or it is a view: then a copy, so every ``.grad`` owns its storage
    and scaling one in place changes no other. A later one is added into ``.grad`` in place
    (PyTorch's ``grad += g``: the same tensor, no new memory, one pass over it) where it
    can be (``_adds_in_place``); else ``.grad`` becomes the sum."""
    grad = meta.grad
    if grad is not None:
        if _adds_in_place(grad, g, shared):
            F.add_(grad, g)
        else:
            meta.grad = F.add(grad, g)
        return
    if g in shared or g._impl.base is not None or not g.is_contiguous():
        g = F.clone(g)
    shared.add(g)
    meta.grad = g


def _adds_in_place(grad, g, shared: _Held) -> bool:
    """Whether ``g`` is added into ``grad`` in place: both local tensors of one device,
    shape and dtype, ``grad`` a tensor of its own storage (not a view, which the user may
    have set, over memory others read), not one this backward handed out (its first
    gradient here, which a rule may also have given a node that has not run yet), and
    neither traced (a traced step records the sum out of place); a global ``.grad`` keeps
    its sum's layout, out of place."""
    a, b = grad._impl, g._impl
    ma, mb = a.meta, b.meta
    return (
        a.base is None
        and grad not in shared
        and ma.device is mb.device
        and not ma.device.placed
        and ma.dtype is mb.dtype
        and ma.shape == mb.shape
        and not a.blob.traced
        and not b.blob.traced
    )


def _graph(roots: list) -> dict:
    """Edges leading into every node reachable from ``roots`` (iteratively)."""
    deps: dict = {}
    stack = [n for n in roots if isinstance(n, Node)]
    seen = set(stack)
    while stack:
        node = stack.pop()
        for e in node.edges:
            if e is None or not isinstance(e[0], Node):
                continue
            nxt = e[0]
            deps[nxt] = deps.get(nxt, 0) + 1
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return deps


def run_backward(roots: list, grads: list, retain_graph: bool = False) -> None:
    """``roots``: Metas of the tensors to differentiate; ``grads``: their gradients."""
    with no_grad():
        deps = _graph([m.grad_fn for m in roots if m.grad_fn is not None])
        buffers: dict = {}
        shared = _Held(grads)  # tensors more than one place may hold
        for meta, g in zip(roots, grads, strict=True):
            if meta.grad_fn is None:  # a leaf itself
                _accumulate(meta, g, shared)
            else:
                _deliver(buffers, meta.grad_fn, meta.output_nr, g)
        heap = [(-n.seq, n) for n in buffers if deps.get(n, 0) == 0]
        heapq.heapify(heap)
        while heap:
            _, node = heapq.heappop(heap)
            _run(node, buffers.pop(node), buffers, heap, deps, retain_graph, shared)


def _deliver(buffers, node, nr, g) -> None:
    buf = buffers.get(node)
    if buf is None:
        buf = buffers[node] = [None] * len(node.outs)
    buf[nr] = g if buf[nr] is None else F.add(buf[nr], g)


def _run(node: Node, got: list, buffers, heap, deps, retain_graph, shared) -> None:
    if node.retained:
        for nr, meta in node.retained.items():
            if got[nr] is not None:
                shared.add(got[nr])
                meta.grad = got[nr] if meta.grad is None else F.add(meta.grad, got[nr])
    needs = tuple(e is not None for e in node.edges)
    rule = node.rule
    if rule is None:
        raise RuntimeError(
            f"no gradient rule for op {node.name!r}: backward() cannot go "
            f"through it; compute that part under af.no_grad() or detach() "
            f"its inputs"
        )
    _check_saved(node)
    grads = [g if g is not None else _zeros(m) for g, m in zip(got, node.outs, strict=True)]
    out = rule.fn(Ctx(node, needs), *grads)
    if len(out) != len(node.edges):
        raise RuntimeError(
            f"internal error: the grad rule of {node.name!r} gave "
            f"{len(out)} gradients for {len(node.edges)} inputs"
        )
    if not retain_graph:
        node.release()
    for k, (edge, g) in enumerate(zip(node.edges, out, strict=True)):
        if edge is None:
            continue
        if g is None:  # (the target still counts on this delivery)
            g = _zeros(node.ins[k])
        g = _fit(g, node.ins[k], node, k)
        target, nr = edge
        if isinstance(target, Meta):
            _accumulate(target, g, shared)
            continue
        shared.add(g)
        _deliver(buffers, target, nr, g)
        deps[target] -= 1
        if deps[target] == 0:
            heapq.heappush(heap, (-target.seq, target))


def _zeros(meta):
    from ..creation import zeros

    return zeros(meta.shape, dtype=meta.dtype, device=meta.device)
