"""State gates: state that actors read and write across pieces (``nn.Graph``'s parameters
and optimizer state), kept in piece order without a register.

An actor declares the states it reads (``Actor.state_reads``) and writes
(``Actor.state_writes``, one writer per state). Per run, each written state gets a gate:
its ``version`` is the number of pieces whose write is done, ``reads`` the acts of the
current piece that have read it. Then, for piece k:

- a reader acts only once the write of piece k-1 is done (``version == k``): it reads the
  state as piece k must see it;
- the writer acts only once every reader has read piece k (``reads == readers``): nothing
  still needs the old value; its act makes ``version`` k+1 and wakes the readers.

Within a piece the data decide the order; across pieces the gates do, so a run can keep
several pieces in flight elsewhere (loading, the first layers) while the state is updated
in order. A state that nobody writes needs no gate. Waiting at a gate counts as waiting on
a resource in the stats.
"""

from __future__ import annotations


class StateGate:
    __slots__ = ("name", "version", "reads", "readers", "waiters")

    def __init__(self, name: str, readers: int):
        self.name = name
        self.version = 0
        self.reads = 0
        self.readers = readers
        self.waiters: set = set()


def make_gates(actors: list) -> dict:
    """``{actor: (gates it reads, gates it writes)}`` for one run (fresh versions)."""
    writers: dict = {}
    for a in actors:
        for s in getattr(a, "state_writes", ()):
            if s in writers:
                raise ValueError(
                    f"state {s!r} is written by {writers[s].name!r} and "
                    f"{a.name!r}; a state has one writer"
                )
            writers[s] = a
    readers = {s: 0 for s in writers}
    for a in actors:
        for s in getattr(a, "state_reads", ()):
            if s in readers:
                readers[s] += 1
    gates = {s: StateGate(s, n) for s, n in readers.items()}
    out = {}
    for a in actors:
        r = tuple(gates[s] for s in getattr(a, "state_reads", ()) if s in gates)
        w = tuple(gates[s] for s in getattr(a, "state_writes", ()))
        if r or w:
            out[a] = (r, w)
    return out


def gates_open(st) -> bool:
    """May ``st`` act on its next piece as far as its states go? If not, it waits on the
    gate that holds it (woken by ``gates_passed``)."""
    k = st.next_piece
    reads, writes = st.gates
    for g in reads:
        if g.version != k:
            g.waiters.add(st)
            return False
    for g in writes:
        if g.version != k or g.reads != g.readers:
            g.waiters.add(st)
            return False
    return True


def gates_passed(st, wake) -> None:
    """``st`` completed an act: count its reads, advance what it wrote, wake the waiters."""
    reads, writes = st.gates
    for g in reads:
        g.reads += 1
        if g.reads == g.readers:
            _wake_all(g, wake)
    for g in writes:
        g.version += 1
        g.reads = 0
        _wake_all(g, wake)


def _wake_all(g, wake) -> None:
    waiters = g.waiters
    while waiters:
        wake(waiters.pop())
