"""Tracing: ``af.trace`` and what is built from a recorded call (``recording.py``): a
Program (one op actor running several ops: ``op_program``, what ``ActorGraph.op`` runs) or an
ActorGraph with one actor per op (``Traced.actor_graph``, built in ``build.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from ..runtime.plan.spec import PieceSpec, Spec, flatten, unflatten
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
    outs = _outs_of(rec, rec.outputs)
    assigns = None if new_states is None else _assigns_of(rec, new_states)

    def in_port(src):
        k, j, _ = flat[src[1]]
        return ("in", k, j)

    return _part(rec, range(len(rec.nodes)), in_port, outs, rec.structure, assigns)


def _outs_of(rec: Recording, tensors: list) -> list:
    """Per tensor the call returns, ``(source, view meta, whole)`` (``whole``: not a view
    of another tensor): a program's outputs as ``_part`` takes them."""
    return [(rec.source(t._impl), t._impl.meta, t._impl.base is None) for t in tensors]


def _assigns_of(rec: Recording, new_states: list) -> list:
    """Per state a call writes back (its new value not itself), ``(state i, source, view
    meta)``."""
    return [
        (i, rec.source(t._impl), t._impl.meta)
        for i, t in enumerate(new_states)
        if t is not None and rec.source(t._impl) != ("state", i)
    ]


def _read_whole(m, whole: bool) -> bool:
    """Whether an output of meta ``m`` is its source's whole array, as it is."""
    return whole and m.offset == 0 and is_contiguous(m.shape, m.strides)


def _part(rec: Recording, members, in_port, outs: list, structure, assigns):
    """A Program of the recorded nodes ``members`` (indices, in recorded order):
    ``in_port(src)`` the input port ``("in", k, j)`` of a recorded input or of a value a
    node not among them made (an earlier part's); ``outs`` per output leaf ``(source, view
    meta, whole)`` (``whole``: not a view of another tensor); ``assigns``: per state
    written back ``(state i, source, view meta)`` (None: a program without state)."""
    mine = set(members)
    # node outputs that are program outputs (read whole) go straight into the register
    direct = {}
    for j, (src, m, whole) in enumerate(outs):
        if src[0] == "node" and src[1] in mine and src not in direct and _read_whole(m, whole):
            direct[src] = j
    nodes = [(n, rec.nodes[n]) for n in members]
    tmp_specs: list[Spec] = []
    tmp_of: dict = {}
    for n, node in nodes:
        for k, m in enumerate(node.metas):
            if ("node", n, k) not in direct:
                tmp_of[("node", n, k)] = len(tmp_specs)
                tmp_specs.append(Spec(m.shape, m.dtype, m.device))

    def port_of(src):
        if src[0] == "in" or (src[0] == "node" and src[1] not in mine):
            return in_port(src)
        if src[0] in ("const", "state"):
            return (src[0], src[1], 0)
        if src in direct:
            return ("out", direct[src], 0)
        return ("tmp", tmp_of[src], 0)

    steps = []
    for n, node in nodes:
        dev = node.metas[0].device if node.metas else None
        ins = [rec.ref(src, meta, port_of) for src, meta in node.refs]
        outs_n = [port_of(("node", n, k)) + (None,) for k in range(len(node.metas))]
        kernel = kernel_of(node.op, dev, [m for _, m in node.refs] + list(node.metas))
        steps.append(Step(node.op, kernel, ins, node.attrs, outs_n))
    copies = []
    for j, (src, m, _) in enumerate(outs):
        if direct.get(src) != j:
            copies.append((j, rec.ref(src, m, port_of)))
    out_spec = PieceSpec(structure, [Spec(m.shape, m.dtype, m.device) for _, m, _ in outs])
    program = Program(steps, out_spec, tmp_specs, rec.const_arrays(), copies)
    if assigns is not None:
        program.state_specs = list(rec.state_specs)
        program.assigns = [(i, rec.ref(src, m, port_of)) for i, src, m in assigns]
    return program


def crossing(rec: Recording, cut: int, after: int) -> list:
    """The values made before node ``cut`` (by a node, or given as an input) that the
    nodes from ``after`` on read, in the order first read: what a call cut at ``cut``
    keeps for its part from ``after`` on."""
    out: list = []
    seen: set = set()
    for node in rec.nodes[after:]:
        for src, _ in node.refs:
            if src not in seen and (src[0] == "in" or (src[0] == "node" and src[1] < cut)):
                seen.add(src)
                out.append(src)
    return out


def split_programs(rec: Recording, parts: list, inputs: list, outputs: list, states: list):
    """A recorded call split into Programs run one after the other: part k runs the
    recorded nodes ``parts[k]`` (indices in recorded order; each part's nodes read only the
    call's inputs, constants, states and the nodes of its own or earlier parts: the
    forward, then the backward of a pipeline stage, ``nn.stage_programs``). What a part
    reads of an earlier part's values, or of a recorded input it is not given, is passed
    on by the caller.

    ``inputs[k]``: the recorded inputs (leaf indices) part k is given first, in order, as
    the leaves of its one input register; ``outputs[k]``: the tensors (of the call) it
    returns; ``states[k]``: the new value of each state it writes back, as
    ``stateful_program``'s ``new_states`` (None: kept). Returns ``(programs, reads,
    made)``: part k's program reads its given inputs, then one array per source in
    ``reads[k]`` (``("in", j)``: recorded input j; ``("node", n, i)``: an earlier part's
    value); its outputs are its own, then the values later parts read that it made and does
    not return already; ``made[k]``: the source of each of its outputs, in order (where a
    caller finds what a later part reads)."""
    where = {n: k for k, part in enumerate(parts) for n in part}

    def srcs(ts):
        return [rec.source(t._impl) for t in ts if t is not None]

    reads: list = []
    for k, part in enumerate(parts):
        got: dict = {}
        wanted = [src for n in part for src, _ in rec.nodes[n].refs]
        for src in wanted + srcs(outputs[k]) + srcs(states[k]):
            if (src[0] == "in" and src[1] not in inputs[k]) or (
                src[0] == "node" and where[src[1]] < k
            ):
                got.setdefault(src, None)
        reads.append(list(got))
    programs, made = [], []
    for k, part in enumerate(parts):
        outs = _outs_of(rec, outputs[k])
        own = {src for src, m, whole in outs if _read_whole(m, whole)}
        later = dict.fromkeys(
            src
            for r in reads[k + 1 :]
            for src in r
            if src[0] == "node" and where[src[1]] == k and src not in own
        )
        outs += [(src, rec.meta_of(src), True) for src in later]
        given = {("in", j): ("in", 0, a) for a, j in enumerate(inputs[k])}
        given.update({src: ("in", 0, len(inputs[k]) + a) for a, src in enumerate(reads[k])})
        assigns = _assigns_of(rec, states[k])
        structure = flatten([0] * len(outs))[1]
        programs.append(_part(rec, part, given.__getitem__, outs, structure, assigns))
        made.append([src for src, _, _ in outs])
    return programs, reads, made


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
