"""Deadlock detection: the wait-for graph of a stalled run, and DeadlockError.

A run is stalled when nothing is running and nothing can start. Each waiting party then
waits for something another party holds:

- an op at the head of a stream waits for memory; the memory it needs is held by outputs
  that are freed when their last consumer finishes;
- an op waits behind the op ahead of it on its stream;
- an op not issued yet waits for the producer of an input;
- an actor waits for an input register, a free output register (credit) or a token.

``find_cycle`` walks those edges and ``DeadlockError`` says the cycle in words, e.g.
"O1 waits for 5.0 MiB on cpu (4.0 MiB free); 3.0 MiB is held by M2's output, freed when O2
finishes; O2 waits behind O1 on stream cpu:0".
"""

from __future__ import annotations

from ...errors import ActorError, DeadlockError


class WaitFor:
    """A wait-for graph: ``edges[a]`` is a list of ``(b, reason)``: a waits for b, and
    ``reason`` says why in words."""

    def __init__(self):
        self.edges: dict = {}
        self.notes: dict = {}  # a -> text said before its edges (what it waits for)

    def add(self, a, b, reason: str) -> None:
        self.edges.setdefault(a, []).append((b, reason))

    def note(self, a, text: str) -> None:
        self.notes[a] = text

    def find_cycle(self) -> list | None:
        """A cycle as ``[(a, b, reason), ...]`` (deterministic: the first found from the
        parties in insertion order), or None."""
        state: dict = {}
        stack: list = []

        def visit(a):
            state[a] = 1
            for b, reason in self.edges.get(a, ()):
                stack.append((a, b, reason))
                if state.get(b) == 1:
                    start = next(i for i, (x, _, _) in enumerate(stack) if x == b)
                    return stack[start:]
                if state.get(b) is None:
                    found = visit(b)
                    if found:
                        return found
                stack.pop()
            state[a] = 2
            return None

        for a in list(self.edges):
            if state.get(a) is None:
                found = visit(a)
                if found:
                    return found
        return None

    def describe(self, cycle: list) -> str:
        parts = []
        for a, _b, reason in cycle:
            note = self.notes.get(a)
            parts.append(f"{note}; {reason}" if note and note != reason else reason)
        return "; ".join(parts)


def deadlock(graph: WaitFor, what: str, stalled: list) -> DeadlockError:
    """The DeadlockError for a stalled run: its cycle in words, or (when the waits do not
    close a cycle) who waits for what."""
    cycle = graph.find_cycle()
    if cycle:
        text = graph.describe(cycle)
        return DeadlockError(
            f"{what} deadlocked: {text}", [(str(a), str(b), r) for a, b, r in cycle]
        )
    waits = "; ".join(graph.notes.get(a, f"{a} waits") for a in stalled)
    return DeadlockError(f"{what} stalled with nothing running: {waits}", [])


def stalled(sched) -> DeadlockError:
    """The DeadlockError of a credit scheduler with nothing running and nothing able to
    start (the actor runtime's own detector; its plan makes this impossible, so it firing
    means a bug, reported instead of a hang)."""
    g, waiting = wait_graph(sched)
    return deadlock(g, "the actor graph", waiting)


def describe_waits(sched) -> str:
    """Who does what in a run now (or at its end), a line per actor that has not ended:
    acting, or waiting for what and on whom; then the wait-for cycle if the waits close
    one. What a failing test prints (``actorflow.testing``)."""
    g, waiting = wait_graph(sched)
    failed = failure_of(sched)
    lines = []
    for st in sched.actor_runs:
        name = st.actor.name
        if st.ended:
            continue
        if failed is not None and name == failed[0]:
            lines.append(failed[1])
        elif st.piped and st.cause is None:
            lines.append(f"{name} is acting (on its thread; next piece {st.next_piece})")
        elif st.in_flight and not st.piped:
            clock = getattr(sched, "clock", None)
            if clock is not None and clock.held and st.mode != "thread":
                lines.append(
                    f"{name} has {st.in_flight} act(s) in simulated time, which "
                    f"stands still until the caller takes the outputs it was given"
                )
                continue
            lines.append(
                f"{name} is acting ({st.in_flight} act(s) in flight; next piece {st.next_piece})"
            )
        elif name in g.notes:
            lines.append(g.notes[name])
        elif st.cause is not None:
            lines.append(f"{name} waits for {st.cause}")
        else:
            lines.append(f"{name} is ready to act")
    if not lines:
        lines.append("every actor has ended")
    cycle = g.find_cycle()
    if cycle and not any(
        st.in_flight and not st.piped or st.piped and st.cause is None
        for st in sched.actor_runs
        if not st.ended
    ):
        lines.append(
            "wait-for cycle: " + " -> ".join(str(a) for a, _, _ in cycle) + f" -> {cycle[0][0]}"
        )
    return "\n".join(lines)


def failure_of(sched):
    """``(actor name, "NAME failed on piece P: Error: message")`` when an act of the run
    raised and stopped it, else None."""
    e = getattr(sched, "error", None)
    if not isinstance(e, ActorError):
        return None
    first = str(e.original).strip().splitlines()
    where = f"piece {e.piece}" if e.piece is not None else "its setup"
    return e.actor, (
        f"{e.actor} failed on {where}: {type(e.original).__name__}"
        + (f": {first[0]}" if first else "")
    )


def wait_graph(sched) -> tuple:
    """The wait-for graph of a credit scheduler's actors that have not ended (but the
    one whose act stopped the run by raising: it waits for nothing), and their names."""
    g = WaitFor()
    waiting = []
    failed = failure_of(sched)
    for st in sched.actor_runs:
        if st.ended or failed is not None and st.actor.name == failed[0]:
            continue
        name = st.actor.name
        waiting.append(name)
        if st.piped:  # a piped thread blocked on its queues
            if st.cause is None:
                continue  # (acting)
            if st.cause == "input":
                prod = st.ins[0].producer.actor.name
                g.note(name, f"{name} waits for piece {st.next_piece} from {prod}")
                g.add(name, prod, f"{name} waits for piece {st.next_piece} from {prod}")
            else:
                held = []
                for r in st.out.registers:
                    at = r.at
                    if at is None or at == name:  # (handed to the loop: a queue there?)
                        at = next((c.actor.name for c in st.out.consumers if r in c.queue), None)
                    if at is None:
                        continue
                    held.append(
                        f"#{r.index} at {at}" + ("" if r.piece is None else f" (piece {r.piece})")
                    )
                    g.add(
                        name,
                        at,
                        f"{name} waits for its register #{r.index}, which {at} has not handed back",
                    )
                g.note(
                    name,
                    f"{name} waits for a free register ("
                    + (", ".join(held) if held else "none is with a piped actor")
                    + ")",
                )
            continue
        for p in st.ins:
            if not p.queue:
                g.note(name, f"{name} waits for piece {st.next_piece} from {p.producer.actor.name}")
                g.add(
                    name,
                    p.producer.actor.name,
                    f"{name} waits for piece {st.next_piece} from {p.producer.actor.name}",
                )
        if st.out is not None and not st.out.free:
            if name not in g.notes:
                g.note(
                    name,
                    f"{name} waits for a free register (0 of {st.out.buffers} free, "
                    f"{len(st.out.registers)} allocated)",
                )
            for reg in st.out.registers:
                for c in st.out.consumers:
                    if reg in c.queue:
                        g.add(
                            name,
                            c.actor.name,
                            f"{name} waits for a free register; one (piece {reg.piece}) is "
                            f"queued at {c.actor.name}",
                        )
        if st.cause == "resource":
            g.note(name, f"{name} waits for tokens {dict(st.tokens)}")
        share = st.share
        if share is not None and st.out is not None and st.out.free:
            for other in share.preds + share.succs:
                if not other.ended:
                    why = (
                        f"{name} waits for the bytes its register shares with "
                        f"{other.actor.name}'s (a control edge of the memory plan)"
                    )
                    g.note(name, why)
                    g.add(name, other.actor.name, why)
    return g, waiting
