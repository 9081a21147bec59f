"""From a traced function to an ActorGraph with one actor per recorded op."""

from __future__ import annotations

from ..errors import TraceError
from ..runtime.graph import ActorGraph
from ..runtime.spec import PieceSpec, Spec
from .program import Program, Step, kernel_of
from .recording import Recording


def traced_graph(traced, specs, source, graph_kwargs) -> ActorGraph:
    for s in specs:
        if not isinstance(s, Spec):
            raise TypeError(f"actor_graph: expected one af.Spec per argument, got "
                            f"{type(s).__name__} {s!r}")
    rec = Recording(traced.fn, specs, list)
    out_leaves, structure = rec.outputs, rec.structure
    g = ActorGraph(**graph_kwargs)
    out = specs[0] if len(specs) == 1 else tuple(specs)
    name = f"inputs of {getattr(traced.fn, '__name__', 'the traced function')}"
    inp = g.input(out=out, name=name) if source is None else g.source(source, out=out,
                                                                       name=name)
    actor_of = {}                           # node index -> its OpActor

    def producer(src):
        return inp if src[0] == "in" else actor_of[src[1]]

    for n, node in enumerate(rec.nodes):
        ports: list = []
        for src, _ in node.refs:
            if src[0] != "const" and producer(src) not in ports:
                ports.append(producer(src))

        def port_of(src, ports=ports):
            if src[0] == "const":
                return ("const", src[1], 0)
            leaf = src[1] if src[0] == "in" else src[2]
            return ("in", ports.index(producer(src)), leaf)

        refs = [rec.ref(src, meta, port_of) for src, meta in node.refs]
        consts = sorted({src[1] for src, _ in node.refs if src[0] == "const"})
        remap = {c: i for i, c in enumerate(consts)}
        refs = [(k, remap[i], j, m) if k == "const" else (k, i, j, m) for k, i, j, m in refs]
        outs = [("out", k, 0, None) for k in range(len(node.metas))]
        dev = node.metas[0].device
        step = Step(node.op, kernel_of(node.op, dev), refs, node.attrs, outs)
        leaves = [Spec(m.shape, m.dtype, m.device) for m in node.metas]
        structure_n = 0 if len(leaves) == 1 else (tuple, (0,) * len(leaves))
        all_consts = rec.const_arrays() if consts else []
        program = Program([step], PieceSpec(structure_n, leaves), [],
                          [all_consts[c] for c in consts], [])
        actor_of[n] = g.op(_prebuilt(program), *ports)
        actor_of[n].build = lambda specs, p=program: p
    picks, sinks = [], []
    for t in out_leaves:
        src = rec.source(t._impl)
        if src[0] == "const":
            raise TraceError("a traced function's output does not depend on its inputs; "
                             "return something computed from them")
        a = producer(src)
        if a not in sinks:
            sinks.append(a)
        meta = t._impl.meta
        picks.append((sinks.index(a), src[1] if src[0] == "in" else src[2],
                      rec.ref(src, meta, lambda s: ("in", 0, 0))[3]))
    g._set_outputs(sinks, picks, structure)
    return g


def _prebuilt(program):
    def op(*_):
        raise AssertionError("prebuilt programs are not traced again")
    op.__name__ = program.steps[0].op.name
    return op
