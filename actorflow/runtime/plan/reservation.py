"""The static memory plan of an actor graph.

``build_plan`` orders the actors, sizes every output register (from ``out=``, from an op's
shape inference, or from piece 0 read and computed once while planning), counts the bytes
of ``buffers`` registers per output (plus op workspaces) on each device, and refuses a graph
that does not fit its budgets with a ``PlanError`` naming each actor's bytes, the total, the
budget and the ``buffers`` that would fit. ``Plan.allocate`` then takes all of that memory
at once, before the first act; nothing is allocated while running. A run without ``plan()``
first sizes what needs piece 0 as it flows: each actor's registers the moment its piece 0
exists (``Plan.size``), or, under a budget, all of them at once when the last is sized,
shared by lifetime where the budget needs it, as here (``Plan.defer``).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Collection, Iterable
from typing import Literal

from ...errors import ActorError, PlanError, format_bytes
from ..graph.actors import Actor, Collector, OpActor, read_piece
from ..graph.device_acts import pinned_for, register_arrays, release_registers
from ..graph.source import SourceActor
from .autotune import FLOOR, HANDOFF, SMALL_BYTES, Tuning, default_counts
from .registers import InPort, MemoryBudget, OutPort, Register
from .sharing import SHARED_KEY, Sharing


class Plan:
    """What a run will hold. ``rows``: per sized actor ``{name, kind, output, buffers, auto,
    register_bytes, workspace_bytes, bytes, device, shared}`` (built when read);
    ``totals``: ``{device: bytes}``, kept as each actor is sized (sizing is linear in the
    graph's size); ``budgets``: ``{device: bytes or None}``; ``sharing``: the registers
    that share memory by lifetime (a ``Sharing``), when the budget needed it
    (``share="auto"``) or the graph asked for it (``share=True``), else None. ``chosen``:
    the actors whose count the plan chose (``buffers="auto"``, or no ``buffers`` given)."""

    def __init__(
        self,
        actors: list,
        buffers: dict,
        budget: MemoryBudget,
        resources: dict,
        share: bool | Literal["auto"] = "auto",
        chosen: Iterable[Actor] = (),
    ) -> None:
        self.actors = actors
        self.chosen = set(chosen)  # actors whose count the plan chose (buffers="auto")
        self.default: set = set()  # ...of them, those on the default (autotune.py's
        self.measured: dict = {}  # default_counts, from these times): sized later,
        #                           they get their count when sized
        self.share = share
        self.sharing: Sharing | None = None
        self.tuning: Tuning | None = None  # what buffers="auto" chose, and why (autotune.py)
        self.buffers = buffers
        self.budget = budget
        self.resources = dict(resources)
        self.ports: dict = {}
        self.in_ports: dict = {}
        self.totals: dict = {}
        self._rows: dict = {}  # actor -> its row, built when first read
        self._row_list: list | None = None  # ``rows`` in graph order, until a size changes it
        self.row_builds = 0  # rows built (each at most once per size: counted)
        self.reused = 0  # actors sized by the run as the last run sized them
        self.allocated = False
        self.filled = False  # some register is allocated (none may share now)
        self.whole = False  # registers wait for every size (see defer())
        self.empty_sources: list = []
        self.pending: set = {
            a for a in actors if a.out_spec is None and not isinstance(a, Collector)
        }
        self._tally()

    def defer(self) -> None:
        """Plans the registers at once when every size is known, as for a plan sized
        before the run: in the run, every actor (one with ``out=`` too) computes piece 0
        into arrays of its own, no register is allocated before the last of them (or its
        end) is in, and then the budgets are checked and registers shared by lifetime where
        they need it (``size``). What needs piece 0 is sized as it flows, and the run
        fits wherever ``plan()`` would."""
        self.whole = True
        self.pending = {a for a in self.actors if not isinstance(a, Collector)}
        self._tally()

    def _tally(self) -> None:
        """The totals of the actors sized so far, from scratch (a new plan, a plan made
        whole, registers now shared); their rows are built again when read."""
        self.totals = {}
        self._rows.clear()
        self._row_list = None
        for a in self.actors:
            if not isinstance(a, Collector) and a not in self.pending:
                self._count(a)
        if self.sharing is not None:
            for d, b in self.sharing.arenas.items():
                self.totals[d] = self.totals.get(d, 0) + b

    def _count(self, a) -> None:
        """Adds sized actor ``a``'s registers and workspace to the totals (once per size:
        sizing a graph is linear in its actors)."""
        totals, n = self.totals, self.buffers[a]
        if self.sharing is None or a not in self.sharing.members:
            for d, b in _bytes_on(a).items():
                totals[d] = totals.get(d, 0) + b * n
        prog = getattr(a, "program", None)
        ws = prog.workspace_bytes if prog is not None else 0
        if ws and prog is not None:  # (ws is 0 without a program)
            dev = a.out_spec.specs[0].device if a.out_spec.specs else prog.device
            totals[dev] = totals.get(dev, 0) + ws
        self._row_list = None

    @property
    def rows(self) -> list:
        """Per sized actor, in graph order: ``{name, kind, output, buffers, auto,
        register_bytes, workspace_bytes, bytes, device, shared}`` (``auto``: the count was
        chosen by the plan, not given). Each row is built the first time it is read after
        its actor is sized, and kept: sizing builds none."""
        if self._row_list is None:
            rows = self._rows
            self._row_list = [
                rows.get(a) or self._row(a)
                for a in self.actors
                if not isinstance(a, Collector) and a not in self.pending
            ]
        return self._row_list

    def _row(self, a) -> dict:
        self.row_builds += 1
        prog = getattr(a, "program", None)
        ws = prog.workspace_bytes if prog is not None else 0
        n, reg = self.buffers[a], a.out_spec.nbytes
        dev = (
            a.out_spec.specs[0].device
            if a.out_spec.specs  # (no output: where
            else getattr(prog, "device", None)
        )  # its state is)
        shared = self.sharing is not None and a in self.sharing.members
        row = {
            "name": a.name,
            "kind": a.describe(),
            "output": a.out_spec.describe(sizes=False),
            "buffers": n,
            "auto": a in self.chosen,
            "register_bytes": reg,
            "workspace_bytes": ws,
            "bytes": reg * n + ws,
            "device": str(dev) if dev else "-",
            "shared": shared,
        }
        self._rows[a] = row
        return row

    def check(self) -> None:
        """Raises PlanError when a device's registers do not fit its budget, even shared
        by lifetime (``share="auto"``: tried only when side by side they do not fit)."""
        over = any(
            self.budget.budget(d) is not None and t > self.budget.budget(d)
            for d, t in self.totals.items()
        )
        if (
            self.sharing is None
            and not self.pending
            and not self.filled
            and self.share is not False
            and (over or self.share is True)
        ):
            self.sharing = Sharing.make(self.actors, self.buffers, self.budget)
            if self.sharing is not None:
                self._tally()
        for dev, total in self.totals.items():
            budget = self.budget.budget(dev)
            if budget is None:
                self._check_machine(dev, total)
                continue
            if total <= budget:
                continue
            mine = [(r, None) for r in self.rows if r["device"] == str(dev)]
            fixed = sum(r["workspace_bytes"] for r, _ in mine)
            per_buffer = sum(
                r["register_bytes"]
                for r, _ in mine
                if not (r["shared"] and self.sharing is not None and self.sharing.region.get(dev))
            )
            if self.sharing is not None:
                per_buffer += self.sharing.region.get(dev, 0)  # a wave of shared registers

            def need(n, fixed=fixed, per_buffer=per_buffer):
                return fixed + per_buffer * n

            fits = None
            n = max(r["buffers"] for r, _ in mine) if mine else 1
            while n >= 1:
                if need(n) <= budget:
                    fits = n
                    break
                n -= 1
            lines = [
                f"  {r['name']}: {r['buffers']} x {format_bytes(r['register_bytes'])}"
                + (
                    f" + {format_bytes(r['workspace_bytes'])} workspace"
                    if r["workspace_bytes"]
                    else ""
                )
                + f" = {format_bytes(r['bytes'])}"
                for r, _ in mine
            ]
            if fits is not None:
                hint = (
                    f"buffers={fits} for every actor would fit ({format_bytes(need(fits))});"
                    f" or raise the budget to {format_bytes(total)}"
                )
            else:
                hint = (
                    f"even buffers=1 needs {format_bytes(need(1))}; raise the budget to at "
                    f"least that, or make the pieces smaller"
                )
            if self.sharing is not None and self.sharing.arenas.get(dev):
                s = self.sharing  # (registers there share: device memory does not)
                got = s.arenas.get(dev, 0)
                found = (
                    "the smallest any order and placement allow"
                    if s.share.exact and len(s.arenas) == 1
                    else "the smallest the planner found"
                )
                on = sum(1 for i in s.members.values() if dev in s.sizes[i])
                hint = (
                    f"sharing registers by lifetime, the {on} actors' registers there "
                    f"need {format_bytes(got)} ({got} B) instead of "
                    f"{format_bytes(s.unshared.get(dev, 0))} side by side: {found} "
                    f"(order {' -> '.join(s.nodes[i].name for i in s.share.order)}); " + hint
                )
            if self.pending:
                hint += (
                    f" (sized while running piece 0; {len(self.pending)} more actor(s) "
                    f"not sized yet)"
                )
            raise PlanError(
                f"the plan does not fit the {dev} budget: its registers need "
                f"{format_bytes(total)} ({total} B) but the budget is {format_bytes(budget)} "
                f"({budget} B):\n" + "\n".join(lines) + f"\n{hint}",
                device=str(dev),
                needed=total,
                budget=budget,
                actors={r["name"]: r["bytes"] for r, _ in mine},
                fitting_buffers=fits,
            )

    def _check_machine(self, dev, total: int) -> None:
        """With no budget, a plan still cannot hold more than the machine's memory."""
        have = system_memory() if dev.type == "cpu" else None
        if have is None or total <= have:
            return
        rows = sorted((r for r in self.rows if r["device"] == str(dev)), key=lambda r: -r["bytes"])
        biggest = ", ".join(
            f"{r['name']}: {r['buffers']} x {format_bytes(r['register_bytes'])}" for r in rows[:3]
        )
        raise PlanError(
            f"the plan cannot be allocated: its registers on {dev} need {format_bytes(total)} "
            f"({total} B) but this machine has {format_bytes(have)} of memory (largest: "
            f"{biggest}); make the pieces smaller or use fewer buffers",
            device=str(dev),
            needed=total,
            budget=have,
            actors={r["name"]: r["bytes"] for r in rows},
            fitting_buffers=None,
        )

    # -- memory ----------------------------------------------------------------------------
    def allocate(self) -> None:
        """Allocates every register (and op workspace) and wires the ports."""
        if self.allocated:
            raise PlanError("this plan is already in use by a run")
        self.ports.clear()
        self.in_ports.clear()
        try:
            if self.sharing is not None:
                self.sharing.allocate(self.budget)
            for a in self.actors:
                if isinstance(a, Collector):
                    continue
                port = OutPort(a, None if a in self.pending else a.out_spec, self.buffers[a])
                self.ports[a] = port
                if isinstance(a, SourceActor):
                    try:
                        a.start()
                    except Exception as e:  # noqa: BLE001 - named with the source
                        raise ActorError(a.name, 0, e, traceback.format_exc()) from e
                if a not in self.pending:
                    self._fill(a, port)
            for a in self.actors:
                ports = []
                for producer in a.inputs:
                    p = InPort(a, self.ports[producer])
                    self.ports[producer].consumers.append(p)
                    ports.append(p)
                self.in_ports[a] = ports
        except BaseException:
            self.release()
            raise
        self.allocated = True

    def _fill(self, a, port) -> None:
        self.filled = True
        shared = self.sharing is not None and a in self.sharing.members
        pinned = pinned_for(a)  # (host registers a device's copies read or write)
        procs = getattr(a, "procs", None)
        blocks = (
            procs.registers(a, port.buffers) if procs is not None and not shared else None
        )  # (written by worker processes: shared memory)
        for i in range(port.buffers):
            if blocks is not None:
                arrays, nbytes = blocks[i], a.out_spec.nbytes
            elif shared and self.sharing is not None:  # (shared: it is)
                arrays, nbytes = self.sharing.arrays(a, i), a.out_spec.nbytes
            else:
                arrays, nbytes = self.budget.allocate(
                    a.out_spec, f"register of {a.name!r}", key=(a.name, i), pinned=pinned
                )
                arrays = register_arrays(arrays, a.out_spec)  # (device memory: tensors)
            reg = Register(
                port,
                i,
                arrays,
                nbytes,
                read_piece(arrays, a.out_spec),
                key=SHARED_KEY if shared else None,
            )
            port.registers.append(reg)
            port.free.append(reg)
        if isinstance(a, OpActor) and a.program is not None:
            a.program.bind(self.budget, a.name)

    def size(self, actor: Actor) -> list:
        """While running piece 0: ``actor``'s output is now known. Checks the budgets with
        it, allocates its registers (and those of op actors it lets infer), and returns the
        actors sized. Raises PlanError if the registers sized so far do not fit. (A plan
        made whole (``defer``): the registers wait for the last size, see ``unpend``.)"""
        if self.whole:
            self._remember(actor)
            self.ports[actor].spec = actor.out_spec  # (its next act waits for registers)
            return self.unpend(actor)
        sized, todo = [], [actor]
        while todo:
            a = todo.pop()
            self.pending.discard(a)
            port = self.ports[a]
            self._remember(a)
            port.spec = a.out_spec
            if a in self.default:
                default_counts(
                    [a], self.default, self.buffers, self.budget, self.measured, lazy=True
                )
                port.buffers = self.buffers[a]
            self._count(a)
            self.check()
            self._fill(a, port)
            sized.append(a)
            for c in a.consumers:  # (one entry per edge: add(s, s) has two)
                if isinstance(c, OpActor) and c in self.pending and c not in todo:
                    c.infer()
                    if c.out_spec is not None:
                        todo.append(c)
        return sized

    def _remember(self, a) -> None:
        """The run sized ``a`` from piece 0: with the layout the last run sized it by, that
        size is reused (counted in ``reused``); else the new one is kept for the next."""
        last = a.sized_as
        if last is not None and last[0] == a.out_spec:
            a.out_spec = last[0]
            self.reused += 1
        elif a.out_spec is not None and not a.declared:
            a.sized_as = (a.out_spec, a.out_spec.bytes_on())

    def unpend(self, actor: Actor) -> list:
        """A plan made whole (``defer``): ``actor`` is sized, or ended before its piece 0.
        Once no actor is left to size, checks the budgets with every register (shared by
        lifetime where they need it, as ``check`` does before a run), allocates them all
        and returns the actors, whose acts may go on; until then returns []. Raises
        PlanError when they do not fit even shared (nothing is allocated then)."""
        self.pending.discard(actor)
        if self.pending or not self.whole:
            return []
        self.whole = False
        if self.default:
            default_counts(
                [a for a in self.actors if not isinstance(a, Collector)],
                self.default,
                self.buffers,
                self.budget,
                self.measured,
            )
            for a, port in self.ports.items():
                port.buffers = self.buffers[a]
        self._tally()
        self.check()
        if self.sharing is not None:
            self.sharing.allocate(self.budget)
        sized = []
        for a in self.actors:
            if not isinstance(a, Collector):
                port = self.ports[a]
                port.spec = a.out_spec
                self._fill(a, port)
                sized.append(a)
        return sized

    def release(self, keep: Collection[object] = (), busy: Collection[Actor] = ()) -> None:
        """Frees every register but the memory keys in ``keep``, and closes the sources and
        op programs but the ``busy`` actors' (acts abandoned while running: see
        ``stragglers.py``, which releases those as they return)."""
        for a in self.actors:
            if a not in busy:
                self.release_actor(a)
            procs = getattr(a, "procs", None)
            if procs is not None and a in self.ports:  # (its shared block: no new
                procs.release(r.arrays for r in self.ports[a].registers)  # worker maps it)
        release_registers(r for p in self.ports.values() for r in p.registers)
        self.budget.release_all(keep)
        self.ports.clear()
        self.in_ports.clear()
        self.allocated = self.filled = False

    @staticmethod
    def release_actor(a: Actor) -> None:
        """Closes ``a``'s source or unbinds its op program, and drops what it cached."""
        if isinstance(a, SourceActor):
            a.close()
        if isinstance(a, OpActor) and a.program is not None:
            a.program.unbind()
        a.cached.clear()

    # -- display ---------------------------------------------------------------------------
    def table(self) -> str:
        w = max([16] + [len(r["name"]) for r in self.rows])
        k = max([20] + [len(r["kind"]) for r in self.rows])
        head = (
            f"{'actor':<{w}} {'kind':<{k}} {'output':<30} {'register':>10} {'buffers':>7} "
            f"{'bytes':>10}"
        )
        lines = ["Plan", head, "-" * len(head)]
        for r in self.rows:
            out = r["output"] if len(r["output"]) <= 30 else r["output"][:29] + "~"
            n = f"{r['buffers']} auto" if r["auto"] else r["buffers"]
            lines.append(
                f"{r['name']:<{w}} {r['kind']:<{k}} {out:<30} "
                f"{format_bytes(r['register_bytes']):>10} {n:>7} "
                f"{format_bytes(r['bytes']):>10}" + (" shared" if r["shared"] else "")
            )
        for dev, total in sorted(self.totals.items(), key=lambda kv: str(kv[0])):
            b = self.budget.budget(dev)
            against = f" of {format_bytes(b)} budget" if b is not None else " (no budget)"
            lines.append(f"total on {dev}: {format_bytes(total)}{against}")
        if self.default:
            lines.append(
                'buffers: the default, "auto" with double buffering as its floor: '
                f"{FLOOR} per output (or a stage's replicas), up to {HANDOFF} for "
                f"registers of at most {format_bytes(SMALL_BYTES)} on the host next "
                f"to short acts on threads, where the budget allows; buffers=2 "
                f"gives exactly 2"
            )
        if self.tuning is not None:
            lines += self.tuning.lines
        if self.sharing is not None:
            lines += self.sharing.lines()
        if self.resources:
            lines.append("resources: " + ", ".join(f"{k}={v}" for k, v in self.resources.items()))
        for name in self.empty_sources:
            lines.append(f"note: source {name!r} yields nothing; the run will be empty")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.table()

    __str__ = __repr__


def _bytes_on(a) -> dict:
    """``{Device: bytes}`` of one register of sized actor ``a``: kept with the layout the
    run sized it by (``Plan.size``), so a rerun whose piece 0 has that layout again reuses
    it; any other layout is sized afresh."""
    last = a.sized_as
    return last[1] if last is not None and last[0] is a.out_spec else a.out_spec.bytes_on()


def system_memory():
    """Bytes of physical memory on this machine, or None where the OS does not say (asked
    once: every actor sized in a run checks against it)."""
    if not _MACHINE:
        try:
            _MACHINE.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (AttributeError, ValueError, OSError):
            _MACHINE.append(None)
    return _MACHINE[0]


_MACHINE: list = []
