"""Tracing: ``af.trace`` and what is built from a recorded call (``recording.py``): a
Program (one op actor running several ops: ``op_program``, what ``ActorGraph.op`` runs) or an
ActorGraph with one actor per op (``Traced.actor_graph``, built in ``build.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..runtime.plan.spec import PieceSpec, Spec, unflatten
from ..tensor.meta import is_contiguous
from ..vm.opcall import kernel_of
from .build import traced_graph
from .program import Program, Step
from .recording import Recording

if TYPE_CHECKING:
    from ..runtime import ActorGraph


def _args_of(in_specs: list):
    def args_of(leaves):
        args, at = [], 0
        for ps in in_specs:
            args.append(unflatten(ps.structure, leaves[at : at + len(ps.specs)]))
            at += len(ps.specs)
        return args

    return args_of


def op_program(fn, in_specs: list, kwargs: dict) -> Program:
    """Traces ``fn(*pieces, **kwargs)`` on placeholders of ``in_specs`` (a PieceSpec per
    input) into one Program: what ``ActorGraph.op`` runs per piece."""
    flat = [(k, j, s) for k, ps in enumerate(in_specs) for j, s in enumerate(ps.specs)]
    rec = Recording(fn, [f[2] for f in flat], _args_of(in_specs), kwargs)
    return _program(rec, flat)


def stateful_program(
    fn, in_specs: list, state_specs: list, state_names=None, count=None, seed=None
) -> Program:
    """Traces ``fn(*pieces, states=[placeholder per state])``, which returns ``(output,
    new_states)`` (per state its new value, or None to keep it), into one Program whose
    state (``Program.state_arrays``, attached by the caller) is read by its steps and
    written back after them, every piece: ``nn.Graph``'s training step.

    The tensors ``fn`` captures are read live (``Recording``'s ``live``): they are the
    program's state after ``state_specs``, listed in ``Program.captured``; the caller
    attaches their arrays after the others'. ``state_names``: what each state is, for
    error messages. ``count``: the state holding the step's count, which the random ops
    ``fn`` calls read (``Recording``'s), with ``seed`` their key's seed; the step adds one
    to it."""
    flat = [(k, j, s) for k, ps in enumerate(in_specs) for j, s in enumerate(ps.specs)]
    new_states: list = []

    def body(*args, states):
        out, new = fn(*args, states=states)
        new_states.extend(new)
        return out

    rec = Recording(
        body,
        [f[2] for f in flat],
        _args_of(in_specs),
        state_specs=state_specs,
        live=True,
        state_names=state_names,
        count=count,
        seed=seed,
    )
    if rec.counted is not None:
        new_states[count] = rec.counted
    program = _program(rec, flat, new_states)
    program.captured = rec.captured
    program.compile()
    return program


def _program(rec: Recording, flat: list, new_states=None) -> Program:
    out_leaves, structure = rec.outputs, rec.structure
    out_srcs = [rec.source(t._impl) for t in out_leaves]
    # node outputs that are program outputs (read whole) go straight into the register
    direct = {}
    for j, (t, src) in enumerate(zip(out_leaves, out_srcs, strict=True)):
        m = t._impl.meta
        if (
            src[0] == "node"
            and src not in direct
            and t._impl.base is None
            and is_contiguous(m.shape, m.strides)
            and m.offset == 0
        ):
            direct[src] = j
    tmp_specs: list[Spec] = []
    tmp_of: dict = {}
    for n, node in enumerate(rec.nodes):
        for k, m in enumerate(node.metas):
            if ("node", n, k) not in direct:
                tmp_of[("node", n, k)] = len(tmp_specs)
                tmp_specs.append(Spec(m.shape, m.dtype, m.device))

    def port_of(src):
        if src[0] == "in":
            k, j, _ = flat[src[1]]
            return ("in", k, j)
        if src[0] in ("const", "state"):
            return (src[0], src[1], 0)
        if src in direct:
            return ("out", direct[src], 0)
        return ("tmp", tmp_of[src], 0)

    steps = []
    for n, node in enumerate(rec.nodes):
        dev = node.metas[0].device if node.metas else None
        ins = [rec.ref(src, meta, port_of) for src, meta in node.refs]
        outs = [port_of(("node", n, k)) + (None,) for k in range(len(node.metas))]
        kernel = kernel_of(node.op, dev, [m for _, m in node.refs] + list(node.metas))
        steps.append(Step(node.op, kernel, ins, node.attrs, outs))
    copies = []
    for j, (t, src) in enumerate(zip(out_leaves, out_srcs, strict=True)):
        if direct.get(src) != j:
            copies.append((j, rec.ref(src, t._impl.meta, port_of)))
    out_spec = PieceSpec(
        structure,
        [Spec(t._impl.meta.shape, t._impl.meta.dtype, t._impl.meta.device) for t in out_leaves],
    )
    program = Program(steps, out_spec, tmp_specs, rec.const_arrays(), copies)
    if new_states is not None:
        program.state_specs = list(rec.state_specs)
        for i, t in enumerate(new_states):
            if t is None:
                continue
            src = rec.source(t._impl)
            if src != ("state", i):
                program.assigns.append((i, rec.ref(src, t._impl.meta, port_of)))
    return program


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

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def actor_graph(
        self,
        *specs: Spec,
        source: Iterable[tuple[Any, ...]] | None = None,
        **graph_kwargs: Any,
    ) -> ActorGraph:
        """The ActorGraph of this function for inputs of ``specs`` (one Spec per argument).
        Its pieces come from ``source`` (an iterable of argument tuples) or, when None,
        from ``run(feed=...)``. ``graph_kwargs`` go to ActorGraph (memory, buffers...)."""
        return traced_graph(self, specs, source, graph_kwargs)


def trace(fn: Callable[..., Any]) -> Traced:
    """Decorator: records ``fn``'s op calls instead of running them when asked for its
    ``actor_graph``; a plain call still runs eagerly."""
    return Traced(fn)
