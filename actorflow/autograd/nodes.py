"""What autograd records: each tensor's ``Meta`` and the backward ``Node`` of each op call.

Armed the first time a tensor requires grad (``eager.interpreter.use_autograd``), the
recorder sees every op call before it runs. When grad mode is on and an input requires
grad, the call runs below it, and a ``Node`` is made: the op's grad rule (``rules.py``), its
attrs, one edge per input (to the node that made it, to a leaf's ``Meta``, or None) and the
tensors the rule reads, with their blobs' versions. A floating-point output gets a ``Meta``
pointing at the node. Views record a node of their own (``record_view``).

In-place writes (an op given ``outs``) bump the version of each blob they write, so a rule
reading a tensor that was overwritten since it was saved raises instead of computing a
wrong gradient. A leaf that requires grad cannot be written in place while grad mode is on
(the optimizers write under ``no_grad``).
"""

from __future__ import annotations

import itertools
import weakref

from .. import ops
from ..eager import interpreter
from .mode import MODE

_SEQ = itertools.count()
_COPY = ops.get("copy")
_STATE = interpreter.STATE


class Meta:
    """A tensor's autograd record: ``requires_grad``; ``grad_fn`` (None for a leaf) and
    ``output_nr``, which of its outputs this tensor is; ``grad``, a leaf's accumulated
    gradient (a Tensor); ``retains_grad``, a non-leaf that keeps its gradient too."""

    __slots__ = ("requires_grad", "grad_fn", "output_nr", "grad", "retains_grad")

    def __init__(self, grad_fn=None, output_nr: int = 0, requires_grad: bool = True):
        self.requires_grad = requires_grad
        self.grad_fn = grad_fn
        self.output_nr = output_nr
        self.grad = None
        self.retains_grad = False


class Node:
    """The backward of one op call (``name``: the op's, as in ``grad_fn=<mul>``)."""

    __slots__ = (
        "name",
        "rule",
        "attrs",
        "edges",
        "ins",
        "outs",
        "saved_in",
        "saved_out",
        "versions",
        "seq",
        "released",
        "retained",
        "watch",
        "__weakref__",
    )

    def __init__(self, name, rule, attrs, edges, ins, outs):
        self.name = name
        self.rule = rule  # rules.Rule, or None: no gradient formula for this op
        self.attrs = attrs
        self.edges = edges  # per input: (Node or leaf Meta, output_nr) or None
        self.ins = ins  # per input: its TensorMeta (shape, dtype, device)
        self.outs = outs  # per output: its TensorMeta
        self.saved_in = None  # TensorImpls the rule reads (None: none)
        self.saved_out = None
        self.versions = ()
        self.seq = next(_SEQ)  # later nodes run first in backward
        self.released = False
        self.retained = None  # {output_nr: Meta} of outputs that retain their grad
        self.watch = None  # (weakref to blob, meta, version): a view's base, not to change since

    def save(self, inputs, outputs) -> None:
        rule = self.rule
        if rule is None:
            return
        if rule.saves_inputs:
            self.saved_in = tuple(inputs)
        if rule.saves_outputs:
            # (blob, meta), its blob pinned: holding the output's own tensor would make a
            # cycle (output -> its Meta -> this node -> output) that only the cycle
            # collector frees when backward never runs
            for o in outputs:
                o.blob.pin()
            self.saved_out = tuple((o.blob, o.meta) for o in outputs)
        self.versions = tuple(
            t.blob.version if t is not None else 0 for t in (self.saved_in or ())
        ) + tuple(b.version for b, _ in (self.saved_out or ()))

    def release(self) -> None:
        """After its backward (unless retain_graph): the saved tensors go (a node that
        saved none can run again, as in PyTorch)."""
        if self.saved_in is not None or self.saved_out is not None:
            self._unpin()
            self.saved_in = self.saved_out = None
            self.released = True

    def _unpin(self) -> None:
        out, self.saved_out = self.saved_out, None
        for blob, _ in out or ():
            blob.unpin()

    def __del__(self):
        try:
            self._unpin()
        except Exception:  # noqa: BLE001 - interpreter shutdown: module globals may be gone
            pass

    def __repr__(self) -> str:
        return f"<{self.name} backward>"


def edge_of(impl):
    ag = impl.ag
    if ag is None or not ag.requires_grad:
        return None
    if ag.grad_fn is None:
        return (ag, 0)
    return (ag.grad_fn, ag.output_nr)


def _needs_grad(inputs) -> bool:
    for i in inputs:
        ag = i.ag
        if ag is not None and ag.requires_grad:
            return True
    return False


def record(op, inputs, attrs, device, outs):
    """The recorder ``eager.interpreter.apply`` calls while autograd is armed; None when
    nothing needs recording (the call then runs as usual)."""
    need = False  # the common case first: nothing requires grad
    for i in inputs:
        ag = i.ag
        if ag is not None and ag.requires_grad:
            need = True
            break
    if outs is None and not need:
        return None
    if _STATE.below_grad:  # the call the recorder itself runs
        return None
    enabled = MODE.enabled
    if outs is not None:
        for o in outs:
            o.blob.version += 1
        if enabled:
            _check_inplace(op.name, inputs, outs)
    if not enabled or not need:
        if outs is not None and enabled:
            for o in outs:
                ag = o.ag
                if ag is not None and ag.requires_grad:
                    # overwritten by values that need no gradient (y.zero_()): it still
                    # requires grad, as in PyTorch, and sends nothing back past the write
                    o.ag = Meta(Node(op.name, _CONSTANT, attrs, (), (), (o.meta,)), 0)
        return None
    edges = tuple([edge_of(i) for i in inputs])
    ins = tuple([i.meta for i in inputs])
    rule = _RULES.get(op.name)
    st = _STATE
    st.below_grad = True  # (a flag, not a context manager: this runs per op)
    try:
        saved = inputs
        if outs is not None and rule is not None and rule.saves_inputs:
            saved = _before_write(inputs, outs, rule)
        res = interpreter.apply(op, inputs, attrs, device, outs)
    finally:
        st.below_grad = False
    node = Node(op.name, rule, attrs, edges, ins, tuple([o.meta for o in res]))
    node.save(saved, res)
    for k, o in enumerate(res):
        if o.meta.dtype.is_floating_point:
            o.ag = Meta(node, k)
    return res


def _before_write(inputs, outs, rule) -> list:
    """What an in-place op's rule reads of its inputs: an input the op overwrites is saved
    as a copy taken before the write (or not at all, for a rule that never reads it)."""
    written = {id(o.blob) for o in outs}
    saved = []
    for i in inputs:
        if id(i.blob) not in written:
            saved.append(i)
        elif rule.unread_written:
            saved.append(None)
        else:
            saved.append(interpreter.apply(_COPY, [i], {})[0])
    return saved


def _check_inplace(name, inputs, outs) -> None:
    for o in outs:
        ag = o.ag
        if ag is not None and ag.requires_grad and ag.grad_fn is None:
            raise RuntimeError(
                f"{name}: a leaf tensor that requires grad is being written in place; that "
                f"would lose what backward() needs. Update parameters under "
                f"'with af.no_grad():' (as the optimizers do), or write into a copy"
            )
        base = o.base
        if base is not None and _needs_grad(list(inputs) + [o, base]):
            raise RuntimeError(
                f"{name}: writing in place into a view (a slice, x[i] = ...) of a tensor is "
                f"not supported when either side requires grad: the gradient would be lost. "
                f"Build the result out of place (af.cat, af.stack, af.where, or index "
                f"assignment with a tensor index), or write under 'with af.no_grad():'"
            )


def record_view(t, out, kind: str, arg) -> None:
    """``out`` is a view of ``t`` (made by Tensor.view/permute/expand/indexing...): under
    grad mode it gets a node whose backward maps its gradient back onto ``t``'s shape."""
    impl = t._impl
    edge = edge_of(impl)
    if edge is None or not MODE.enabled:
        return
    node = Node(
        kind,
        _VIEW_RULES[kind],
        {"key": arg, "view": out._impl.meta},
        (edge,),
        (impl.meta,),
        (out._impl.meta,),
    )
    # a later write into the base makes backward raise; held weakly, so that a node kept
    # (the loss a caller keeps) keeps no base alive: a base gone is written no more
    node.watch = (weakref.ref(impl.blob), impl.meta, impl.blob.version)
    out._impl.ag = Meta(node, 0)


class _Constant:
    """The rule of a write whose values depend on no input that requires grad."""

    saves_inputs = saves_outputs = unread_written = False

    @staticmethod
    def fn(ctx, *grads):
        return ()


_CONSTANT = _Constant()
_RULES: dict = {}
_VIEW_RULES: dict = {}


def use_rules(rules: dict, view_rules: dict) -> None:
    """The grad rules by op name, and the view kinds' (``rules.py`` hands them in)."""
    _RULES.update(rules)
    _VIEW_RULES.update(view_rules)


def rule_of(name: str):
    return _RULES.get(name)
