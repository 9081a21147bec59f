"""``buffers="auto"``: registers per output chosen for throughput under the memory budget.

The model (tf.data's AUTOTUNE asks the same question of its buffers, with a RAM budget):
an actor's register is held from the start of its act until its slowest reader's act ends,
``hold = t(actor) + max t(reader)`` at least, so ``b`` registers let the edge pass at most
``b / hold`` pieces per second. The graph can go no faster than its slowest stage,
``replicas / t`` (its *bound*). The tuner starts every automatic actor at one register and
gives one more, each time, to the actor whose edge is slowest (fewest pieces per second),
while the edges are slower than the bound and the register fits the budgets; this raises
the slowest edge as far as memory allows (no other choice of counts does better under
the model). With memory left, the edges within 25% of the bound get one more each (stage
times jitter), cheapest first.

The default (``buffers`` given nowhere) is "auto" with double buffering as its floor
(``default_counts``): two registers per output (as many as a stage's replicas, or its
readers', can use at once), and up to HANDOFF for small host registers next to short acts
on threads, where the budget allows. It reads no stage time it would have to compute: a
stage whose time is unknown counts as short.

Stage times come from the last run of the graph (measured per act: the tuner re-tunes on
every plan, so the counts follow the times as they drift), else ``time=`` (the average of
the first pieces when it is a function), else the time to compute piece 0 while planning;
an actor with none of these counts as taking no time.
"""

from __future__ import annotations

import math

from ...errors import PlanError, format_bytes
from ..graph.actors import Collector
from ..graph.device_acts import DEVICE_ACTORS
from ..graph.source import SourceActor

AUTO = "auto"
FLOOR = 2  # registers per output the default gives at least: double buffering
MAX_AUTO = 16  # registers per output the tuner gives at most
JITTER = 1.25  # with memory left, edges within this of the bound get one more
SHORT_ACT_S = 1e-3  # thread stages whose register is held less than this per act...
SMALL_BYTES = 64 << 10  # ...and whose register is at most this big get HANDOFF registers:
HANDOFF = 16  # a thread then takes several pieces per turn on the GIL


class Tuning:
    """What the tuner chose: ``buffers`` (actor -> count), ``bound`` (pieces/s of the
    slowest stage, None when no time is known), ``rate`` (pieces/s the slowest edge
    allows), ``times`` (actor name -> seconds per act) and their ``sources``, and
    ``lines``: the choice explained."""

    def __init__(self):
        self.buffers: dict = {}
        self.bound = None
        self.rate = None
        self.times: dict = {}
        self.sources: dict = {}
        self.handoff: list = []  # actors given registers for cheaper hand-offs
        self.lines: list = []


def stage_time(a, measured: dict):
    """(seconds per act, where the figure comes from) for actor ``a``."""
    if a.name in measured:
        return measured[a.name], "measured in the last run"
    t = a.time
    if t is not None:
        own = getattr(a, "probe_s", 0.0) or 0.0
        if callable(t):
            seen = []
            for p in range(8):  # (a function of a short run may stop early)
                try:
                    seen.append(float(t(p)))
                except Exception as e:  # noqa: BLE001 - said with the actor on piece 0
                    if not seen:
                        raise PlanError(
                            f"actor {a.name!r}: time= raised on piece 0 while "
                            f'buffers="auto" read it: {type(e).__name__}: '
                            f"{e}"
                        ) from e
                    break
            return sum(seen) / len(seen) + own, f"time= (first {len(seen)} pieces)"
        return float(t) + own, "time="
    if getattr(a, "probe_s", None) is not None:
        return a.probe_s, "piece 0 while planning"
    return 0.0, "unknown (taken as 0)"


def tune(actors: list, auto: set, buffers: dict, budget, measured: dict) -> Tuning:
    """Chooses ``buffers[a]`` for the actors in ``auto`` (the others keep theirs);
    ``actors`` in plan order, the collector included or not."""
    tu = Tuning()
    nodes = [a for a in actors if not isinstance(a, Collector)]
    times = {}
    for a in nodes:
        times[a], tu.sources[a.name] = stage_time(a, measured)
        tu.times[a.name] = times[a]
    hold = {}
    for a in nodes:
        readers = [times[c] for c in a.consumers if c in times]
        hold[a] = times[a] + max(readers, default=0.0)
    # an async stage's acts overlap (as many as its registers): only its edge bounds it
    steady = [a for a in nodes if not getattr(a, "is_async", False) or isinstance(a, SourceActor)]
    slowest = max(steady, key=lambda a: times[a] / max(1, a.replicas), default=None)
    if slowest is not None and times[slowest] > 0:
        tu.bound = max(1, slowest.replicas) / times[slowest]
    bytes_of = {a: a.out_spec.bytes_on() if a.out_spec is not None else {} for a in nodes}
    used: dict = {}
    for a in nodes:  # op workspaces count against the budget too
        prog = getattr(a, "program", None)
        if prog is not None and prog.workspace_bytes:
            used[prog.device] = used.get(prog.device, 0) + prog.workspace_bytes
    for a in nodes:
        b = buffers[a] if a not in auto else 1
        buffers[a] = b
        for d, n in bytes_of[a].items():
            used[d] = used.get(d, 0) + n * b

    fits, grow = _room(budget, used, bytes_of, buffers)

    def rate(a):
        return math.inf if hold[a] <= 0 else buffers[a] / hold[a]

    stop = "no time is known for any actor: one register each" if tu.bound is None else ""
    tunable = [a for a in nodes if a in auto and hold[a] > 0]
    while tu.bound is not None and tunable:
        a = min(tunable, key=rate)
        if rate(a) >= tu.bound * (1 - 1e-9):
            stop = "every edge keeps up with the slowest stage"
            break
        if buffers[a] >= MAX_AUTO:
            stop = f"{a.name!r} has the most registers the tuner gives ({MAX_AUTO})"
            break
        if not fits(a):
            stop = f"one more register for {a.name!r} would not fit the budget"
            break
        grow(a)
    if tu.bound is not None and stop.startswith("every edge"):
        spare = sorted(
            (a for a in tunable if rate(a) < tu.bound * JITTER and buffers[a] < MAX_AUTO),
            key=lambda a: sum(bytes_of[a].values()),
        )
        for a in spare:
            if fits(a):
                grow(a)
    handoff = _hand_offs(nodes, auto, hold, bytes_of, buffers, fits, grow)
    tu.handoff = [a.name for a in handoff]
    tu.rate = min((rate(a) for a in nodes if hold[a] > 0), default=None)
    tu.buffers = {a: buffers[a] for a in nodes}
    tu.lines = _explain(tu, nodes, auto, hold, buffers, slowest, stop, used)
    return tu


def floor_of(a) -> int:
    """Registers the default gives ``a`` at least: FLOOR, or as many as its replicas or a
    reader's replicas can take at once."""
    n = max(FLOOR, a.replicas)
    for c in a.consumers:
        if c.replicas > n:
            n = c.replicas
    return n


def default_counts(
    nodes: list, default: set, buffers: dict, budget, measured: dict, lazy: bool = False
) -> list:
    """Chooses ``buffers[a]`` for the actors of ``nodes`` (sized ones, plan order) in
    ``default`` (no ``buffers`` given): ``floor_of(a)``, then up to HANDOFF for small host
    registers next to short acts on threads (``_hand_offs``), as far as each device's
    budget allows with every register of ``nodes`` counted (``lazy``: registers sized one
    at a time, so only on devices without a budget). A stage's time is the last run's,
    or its ``time=`` when a number; unknown counts as short, and a ``time=`` function as
    long (it is not read). Returns the actors given more than their floor."""
    times: dict = {}

    def t(a):
        if a not in times:
            if a.name in measured:
                times[a] = measured[a.name]
            elif callable(a.time):
                times[a] = math.inf
            else:
                times[a] = (a.time or 0.0) + (a.probe_s or 0.0)
        return times[a]

    bytes_of = {}
    for a in nodes:
        if a in default:
            buffers[a] = floor_of(a)
            if (
                a.out_spec is not None
                and not isinstance(a, DEVICE_ACTORS)
                and (_on_thread(a) or any(_on_thread(c) for c in a.consumers))
            ):
                on = a.out_spec.bytes_on()
                if on and all(d.type == "cpu" and n <= SMALL_BYTES for d, n in on.items()):
                    bytes_of[a] = on  # (small host registers: may get more)
    host = list(bytes_of)
    if not host:
        return []
    hold = {}
    for a in host:
        for x in (a, *a.consumers):
            if x not in hold and not isinstance(x, Collector):
                hold[x] = t(x) + max(
                    (t(c) for c in x.consumers if not isinstance(c, Collector)), default=0.0
                )
    used: dict = {}
    if not lazy:
        for a in nodes:
            if a.out_spec is not None and not isinstance(a, Collector):
                for d, n in a.out_spec.bytes_on().items():
                    used[d] = used.get(d, 0) + n * buffers[a]
            prog = getattr(a, "program", None)
            if prog is not None and prog.workspace_bytes:
                used[prog.device] = used.get(prog.device, 0) + prog.workspace_bytes

    fits, grow = _room(budget, used, bytes_of, buffers, lazy)
    floors = {a: buffers[a] for a in host}
    _hand_offs(host, default, hold, bytes_of, buffers, fits, grow)
    return [a for a in host if buffers[a] > floors[a]]


def _room(budget, used: dict, bytes_of: dict, buffers: dict, lazy: bool = False):
    """``(fits, grow)`` over the bytes ``used`` per device: whether one more register of an
    actor fits its devices' budgets (never, on a budgeted device, while ``lazy``: the
    others' sizes are not known yet), and taking it."""

    def fits(a):
        for d, n in bytes_of[a].items():
            cap = budget.budget(d)
            if cap is not None and (lazy or used.get(d, 0) + n > cap):
                return False
        return True

    def grow(a):
        buffers[a] += 1
        for d, n in bytes_of[a].items():
            used[d] = used.get(d, 0) + n

    return fits, grow


def _hand_offs(nodes, auto, hold, bytes_of, buffers, fits, grow) -> list:
    """Gives the actors in ``auto`` whose registers are small and sit next to a short act
    on a thread (``_short_thread_act``) one more register each in turn, cheapest first,
    up to HANDOFF and as far as ``fits`` allows; returns them."""

    def short(a):
        return a in hold and _short_thread_act(a, hold[a])

    handoff = [
        a
        for a in nodes
        if a in auto
        and a.out_spec is not None
        and all(b <= SMALL_BYTES for b in bytes_of[a].values())
        and (short(a) or any(short(c) for c in a.consumers))
    ]
    grew = True
    while grew:  # one more each in turn, as far as memory goes
        grew = False
        for a in sorted(handoff, key=lambda a: sum(bytes_of[a].values())):
            if buffers[a] < HANDOFF and fits(a):
                grow(a)
                grew = True
    return handoff


def _on_thread(a) -> bool:
    """A stage acting on a thread of its own (not inline, not async, not a source)."""
    return not (
        a.inline or getattr(a, "is_async", False) or isinstance(a, (SourceActor, Collector))
    )


def _short_thread_act(a, hold: float) -> bool:
    """A stage on its own thread whose acts are short: there, handing a piece from thread
    to thread costs more than the work (a GIL turn each), and more registers on its input
    and output let each thread take several pieces per turn (measured in
    ``benchmarks/bench_plan.py``: 16 registers run a chain of tiny stages 3-4x faster than
    2). The tuner gives them only to small registers, which cost next to nothing."""
    return _on_thread(a) and hold < SHORT_ACT_S


def _explain(tu, nodes, auto, hold, buffers, slowest, stop, used) -> list:
    lines = ['buffers chosen for throughput under the budget (buffers="auto"):']
    if tu.bound is not None:
        lines.append(
            f"  the slowest stage is {slowest.name!r}: {tu.times[slowest.name] * 1e3:.3g}"
            f" ms per act, at most {tu.bound:.4g} pieces/s"
        )
    for a in nodes:
        if a not in auto:
            continue
        r = f"{buffers[a] / hold[a]:.4g} pieces/s" if hold[a] > 0 else "no time"
        lines.append(
            f"  {a.name}: {buffers[a]} register(s), each held {hold[a] * 1e3:.3g} ms "
            f"(its act and its slowest reader's): the edge passes {r}; times: "
            f"{tu.sources[a.name]}"
        )
    if stop:
        lines.append(f"  stopped because {stop}")
    if tu.handoff:
        lines.append(
            f"  small registers into or out of short acts on threads "
            f"({', '.join(tu.handoff)}): up to {HANDOFF} each, so a thread takes "
            f"several pieces per turn instead of one hand-off per piece"
        )
    if used:
        lines.append(
            "  registers: "
            + ", ".join(f"{format_bytes(n)} on {d}" for d, n in sorted(used.items(), key=str))
        )
    return lines
