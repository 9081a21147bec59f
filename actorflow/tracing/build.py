"""From a traced function to an ActorGraph with one actor per recorded op (``traced_graph``)
and, for a function with state (``nn.Graph``'s step), one actor per op plus one writing
each state's new value back, kept in piece order by state gates (``stateful_graph``)."""

from __future__ import annotations

from ..errors import KernelError, TraceError
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.graph.actors import OpActor
from ..runtime.graph.device_acts import device_memory
from ..runtime.plan.spec import PieceSpec, Spec, unflatten
from ..vm.opcall import kernel_of
from .program import Program, Step
from .recording import Recording


def traced_graph(traced, specs, source, graph_kwargs) -> ActorGraph:
    for s in specs:
        if not isinstance(s, Spec):
            raise TypeError(
                f"actor_graph: expected one af.Spec per argument, got {type(s).__name__} {s!r}"
            )
    rec = Recording(traced.fn, specs, list)
    g = ActorGraph(**graph_kwargs)
    out = specs[0] if len(specs) == 1 else tuple(specs)
    name = f"inputs of {getattr(traced.fn, '__name__', 'the traced function')}"
    one = len(specs) == 1  # (x,) as well as x, as (x, w) for two
    inp = (
        g.input(out=out, name=name, one_argument=one)
        if source is None
        else g.source(source, out=out, name=name, one_argument=one)
    )
    actor_of = _node_actors(g, rec, inp, None)
    _outputs(g, rec, inp, actor_of)
    return g


def stateful_graph(
    fn,
    spec: PieceSpec,
    state_specs: list,
    name: str,
    graph_kwargs: dict,
    state_names=None,
    source=None,
    count=None,
    seed=None,
):
    """``fn(piece, states=[...]) -> (output, new states)`` as an ActorGraph fed by
    ``run(feed=...)``, or by the actors ``source(graph)`` adds (it returns the one whose
    register holds a piece of ``spec``: a loader's): an actor per op, reading that register,
    and per state with a new value an actor copying it back. The tensors ``fn`` captures
    are read live, as states after ``state_specs`` (``Recording``'s ``live``). Returns
    ``(graph, state arrays list, captured tensors)``: the caller fills the list (the same
    list object every program reads) with the states' arrays, then the captured tensors',
    before a run. ``graph.replay(arrays)`` runs one piece through the op actors in the
    order the ops were recorded (``replay_piece``). ``state_names``: what each state is,
    for error messages. ``count``, ``seed``: as ``stateful_program``'s (the random ops'
    step count, a state read and written in piece order like the others)."""
    new_states: list = []

    def body(piece, states):
        out, new = fn(piece, states=states)
        new_states.extend(new)
        return out

    rec = Recording(
        body,
        spec.specs,
        lambda leaves: [unflatten(spec.structure, leaves)],
        state_specs=state_specs,
        live=True,
        state_names=state_names,
        count=count,
        seed=seed,
    )
    if rec.counted is not None:
        new_states[count] = rec.counted
    g = ActorGraph(**graph_kwargs)
    device = next((s.device for s in (*spec.specs, *state_specs) if device_memory(s.device)), None)
    if source is None:
        inp = g.input(out=unflatten(spec.structure, list(spec.specs)), name=f"inputs of {name}")
    else:
        inp = source(g)
    shared: list = [None] * len(rec.state_specs)
    # a training step is many small kernels: each acts on the graph's loop, where a hop to
    # a thread would cost more than most of them (measured in bench_training)
    actor_of = _node_actors(g, rec, inp, shared, inline=True, device=device)
    ops = [actor_of[n] for n in range(len(rec.nodes))]
    if device is None:  # (on a device, the failed op's own act names it)
        g.replay = lambda arrays: replay_piece(ops, inp, arrays)
    for i, t in enumerate(new_states):
        if t is None:
            continue
        src = rec.source(t._impl)
        if src == ("state", i):
            continue  # unchanged
        if src[0] in ("const", "state"):
            raise TraceError(
                f"state {i} would be set to a value that does not depend on the "
                f"step's inputs; nn.Graph writes back computed values only"
            )
        leaf = src[1] if src[0] == "in" else src[2]
        ref = rec.ref(src, t._impl.meta, lambda s, leaf=leaf: ("in", 0, leaf))
        program = Program([], PieceSpec((tuple, ()), []), [], [], [])
        program.state_specs, program.state_arrays = [state_specs[i]], shared
        program.assigns = [(i, ref)]
        g.op_program(
            _on_device(program, device, shared),
            _producer(src, inp, actor_of),
            name=f"set state {i}",
            state_writes=(f"state {i}",),
        )
    _outputs(g, rec, inp, actor_of, copy_input=False)
    return g, shared, rec.captured


def replay_piece(ops: list, inp, arrays: list) -> None:
    """Runs one piece (``arrays``: the input register's) through the op actors ``ops`` one
    after the other, in the order their ops were recorded (the order a Program of the same
    function runs them), writing no state back: the first op that fails raises its
    KernelError, with ``actor`` set to its actor's name. ``nn.Graph.run`` asks it when an
    op actor failed, to name the op ``step()`` names (actors act in data order, so another
    may have failed first)."""
    outs_of = {inp: arrays}
    for a in ops:
        try:
            outs_of[a] = a.program.run_new([outs_of[x] for x in a.inputs], write_back=False)
        except KernelError as e:
            e.actor = a.name
            raise


def _producer(src, inp, actor_of: dict):
    """The actor whose output holds what a recorded source ``src`` names: the input actor
    ``inp`` for a traced input, else the op actor of node ``src[1]`` (``actor_of``)."""
    return inp if src[0] == "in" else actor_of[src[1]]


def _on_device(program, device, shared):
    """``program`` as its op actor runs it: as it is on the host; on a CUDA device
    (``device``) a ``DeviceSteps`` whose kernels are launched on the compute stream, reading
    and writing the graph's state through ``shared`` (the state tensors, then the captured
    ones, filled before each run)."""
    if device is None:
        return program
    from .device import DeviceProgram, DeviceSteps

    return DeviceSteps(DeviceProgram(program, device, program.name), cuda_graph=False, state=shared)


def _node_actors(g, rec: Recording, inp, shared, inline=None, device=None) -> dict:
    """One op actor per recorded node (``shared``: the state arrays, for stateful ones, or
    on a CUDA ``device`` the state tensors; ``inline``: as ``g.op_program``'s)."""
    actor_of: dict[int, OpActor] = {}  # node index -> its OpActor

    for n, node in enumerate(rec.nodes):
        ports: list = []
        for src, _ in node.refs:
            if src[0] not in ("const", "state"):
                a = _producer(src, inp, actor_of)
                if a not in ports:
                    ports.append(a)
        if not ports:
            ports.append(inp)  # reads only state: paced by the pieces

        def port_of(src, ports=ports):
            if src[0] in ("const", "state"):
                return (src[0], src[1], 0)
            leaf = src[1] if src[0] == "in" else src[2]
            return ("in", ports.index(_producer(src, inp, actor_of)), leaf)

        refs = [rec.ref(src, meta, port_of) for src, meta in node.refs]
        consts = sorted({src[1] for src, _ in node.refs if src[0] == "const"})
        remap = {c: i for i, c in enumerate(consts)}
        refs = [(k, remap[i], j, m) if k == "const" else (k, i, j, m) for k, i, j, m in refs]
        outs = [("out", k, 0, None) for k in range(len(node.metas))]
        dev = node.metas[0].device
        kernel = kernel_of(node.op, dev, [m for _, m in node.refs] + list(node.metas))
        step = Step(node.op, kernel, refs, node.attrs, outs)
        leaves = [Spec(m.shape, m.dtype, m.device) for m in node.metas]
        structure_n = 0 if len(leaves) == 1 else (tuple, (0,) * len(leaves))
        all_consts = rec.const_arrays() if consts else []
        program = Program(
            [step], PieceSpec(structure_n, leaves), [], [all_consts[c] for c in consts], []
        )
        if shared is not None:
            program.state_arrays = shared
        reads = sorted({f"state {src[1]}" for src, _ in node.refs if src[0] == "state"})
        actor_of[n] = g.op_program(
            _on_device(program, device, shared), *ports, inline=inline, state_reads=reads
        )
    return actor_of


def _outputs(g, rec: Recording, inp, actor_of, copy_input: bool = True) -> None:
    if not rec.outputs:  # a function that returns nothing: a run yields
        if copy_input:  # the input per piece (copy_input), or None
            g.sink(inp)
            g.yields_nothing = True
        else:
            g._set_outputs([inp], [], None, yields_nothing=True)
        return
    picks, sinks = [], []
    host: dict = {}  # a register on a device -> its copy to the host
    for t in rec.outputs:
        src = rec.source(t._impl)
        if src[0] in ("const", "state"):
            raise TraceError(
                "a traced function's output does not depend on its inputs; "
                "return something computed from them"
            )
        a = _producer(src, inp, actor_of)
        if getattr(a, "device", None) is not None:  # (the run yields host arrays)
            if a not in host:
                host[a] = g.copy(a, "cpu", name=f"{a.name} to host")
            a = host[a]
        if a not in sinks:
            sinks.append(a)
        meta = t._impl.meta
        picks.append(
            (
                sinks.index(a),
                src[1] if src[0] == "in" else src[2],
                rec.ref(src, meta, lambda s: ("in", 0, 0))[3],
            )
        )
    g._set_outputs(sinks, picks, rec.structure)
