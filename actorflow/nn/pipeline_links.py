"""A pipeline batch run by the stages' workers among themselves: ``nn.Graph(stages=...,
loss=..., stage_ranks="processes")`` (every stage in a worker process of its own, the loss
a module or function the last stage's worker computes) hands each batch to the workers in
one command each, and the stages pass their activations forward and their gradients back
worker to worker, without this process in the loop.

The two sides of one protocol, in one file:

- This process (``Links``, kept by ``PipelineStep``): once, the link between the workers of
  stages i and i+1 (a Unix socket the worker of i+1 listens on and that of i connects to,
  each end kept by its worker under the id of a part it made: dropping that part closes
  it). Each batch: the input rows put on stage 0's worker and the targets on the last
  stage's, one ``RUN`` of ``_run`` on every stage's worker, sent together, then each
  stage's report read back: its acts (kind, micro-batch, start and end times), the most
  micro-batches it held, its peak of saved bytes, the most weights parts it held waiting
  and their peak bytes, the last stage's losses. Then, where
  the workers step the optimizers (``stage_steps``), one ``RUN`` of ``_step`` on each
  (stage 0's sent at once, the others' with the next batch's commands), its answer asked
  for without waiting and checked at the next batch (``stepped``).
- The workers (``_run``): the stage's actors, forward, backward and weights, taking turns
  on the worker's one thread. A forward may act once its input is there (stage 0: the
  micro-batch's rows; stage i: stage i-1's activation, arrived on the link) and the stage
  holds fewer than its ``k_i`` registers' worth of micro-batches for backward (the credit);
  a backward once the gradient of the oldest micro-batch it holds arrived. A backward
  ready goes first, so ``k_i = n - i`` gives 1F1B's order, as the actor graph's credits
  do; the last stage's one act runs its forward, the loss and the backward
  (``stage{n-1}.forward_backward``), the backward scaled by 1/M as everywhere. Each act
  is one of the stage's compiled programs (``stage_programs.py``), as the acts of a stage
  driven from this process are. A backward (the last stage's act too) of a stage whose
  input gets a gradient sends that gradient and leaves the parameters' gradients to the
  stage's weights actor (zero-bubble pipelines' B/W split: ``StagePrograms.weights``),
  whose ``WEIGHT_SLOTS`` registers hold what each such part reads (its plan's
  ``weights_bytes``): a part runs where neither a forward nor a backward is ready, where
  the act ready needs a register and both are held, and at the batch's end, but for the
  batch's last where the workers step the optimizers (``keep``): the stage keeps that one
  (``_Kept.left``) and its step (``_step``) runs it first, so its error is the step's. All
  in piece order, so the gradients accumulate as when each backward computes them at once,
  bit for bit. So the last stage computes its weights' gradients while its next input is
  on the way rather than before it takes it; its report comes as its acts end, so the
  batch ends with stage 0's last backward; and its last weights part runs with its step,
  which comes with the next batch's commands while its worker waits for stage 0's first
  forward anyway (or with whatever waits for the step first: ``close()``, the optimizer's
  next use; until then the part holds what it reads). Stage 0's backward (its input gets
  no gradient) is its weights' part, run in the act. Forward, backward and weights acts,
  and the waits, are in the report (the part a step runs is not).

Each direction of a link is a ring of ``k_i`` slots in shared memory (a ``memfd`` the
writer makes, its descriptor sent over the socket once, mapped by the reader), micro-batch
``j`` in slot ``j % k_i``, and a header on the socket per micro-batch (the batch's number,
the slot, the dtype and shape). The registers make the slots safe without an
acknowledgement: stage i writes activation ``j`` only once it ran backward ``j - k_i``,
which needed gradient ``j - k_i``, which stage i+1 sent after it read activation ``j - k_i``
(the reader copies a slot out when the header arrives); the same reasoning holds for the
gradients. A message of an earlier batch (one that stopped) is dropped by its number.

A stage that fails in any way (its act, loading its module or the loss, a neighbour's end
closed) tells its neighbours to stop (they stop, telling theirs); an act's error is the
``ActorError`` naming its actor and the micro-batch. A worker that ends closes its links,
so its neighbours stop, and reading its report raises the ranks' error naming the placement
and the rank (``stage_error`` names the stage). Every wait on a link has the ranks' timeout
(``AF_RANKS_WAIT_S``); this process marks each stage's worker busy for up to (2M + 1)
times that for a batch of M micro-batches (``ProcessRanks.busy``), so its reports, and any
other request reaching those workers meanwhile (another thread's, another graph's on the
same workers), wait for the batch as a whole: a long batch of short acts is not given up.
A batch's commands go to all its workers while holding ``_ISSUING`` and every one of their
ranks' locks (each taken by a ``with``), so two graphs sharing the workers, stepped from
two threads, reach every worker in one order and no other thread's request reaches a
worker running a batch not wholly sent; the links' sockets are made in that section too,
and waited for after it (a Ctrl-C meanwhile is raised once all are sent: the workers get
a batch's commands all or none: they are kept, ``HeldRanks.held``, until all are issued,
so a full queue sends none of them alone, and where issuing fails they are taken back; the
workers' busy marks are let go once their reports are read). Ctrl-C while this process
waits for the reports raises at once: the links are dropped, the workers (which ignore
Ctrl-C) run that batch to its end, and the next batch first waits for its reports
(``Links.settle``). A worker that sees a message of a later batch than the one it runs
stops that one and keeps the message for the next (a safeguard: links outlive only batches
whose every report was read)."""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from ..creation import from_numpy
from ..errors import ActorError
from ..parallel import workers as W
from ..runtime.plan.spec import unflatten
from ..tensor.tensor import Tensor
from .pipeline_ranks import _kept, _raise, _start, handed_over, part_view

FORWARD, BACKWARD, WAIT, WEIGHTS = 0, 1, 2, 3  # an act's kind in a report (a wait: its
#                                                cause's; WEIGHTS: a weights part's act)
WEIGHT_SLOTS = 2  # a stage's weights parts held at most (its weights actor's registers)
STEP_IN_WORKERS = True  # False: this process steps the optimizers (``stage_steps``)
INPUT, CREDIT = 0, 1  # what a stage waited for: an input (an activation or a gradient), or
#                      a credit (its forward's input is there, its registers are not free)

# -- the worker's side -------------------------------------------------------------------


class Stopped(RuntimeError):
    """A stage stopped because a neighbour did (its own error is the neighbour's)."""


class _End:
    """A worker's end of the link to a neighbour stage's worker: the socket (headers, and
    the descriptor of each new ring), the ring this end writes and the one it reads, and
    what arrived but was not taken yet."""

    def __init__(self, sock: socket.socket, label: str) -> None:
        self.sock = sock  # (the descriptors of new rings go through it, with no answer)
        self.conn = Connection(os.dup(sock.fileno()))  # (the headers: framed messages)
        self.label = label  # "stage 1 of 2", the neighbour, for errors
        self.mine: Any = None  # (map, slot bytes, slots, gen): the ring written here
        self.theirs: Any = None  # the neighbour's ring, mapped here
        self.gen = 0
        self.arrived: list = []  # (micro-batch, array) of this batch, in order
        self.early: list = []  # messages of a later batch than the one run (see pump)

    def send(self, batch: int, mb: int, a: np.ndarray, slots: int) -> None:
        """Micro-batch ``mb``'s array written into its slot and announced."""
        size = max(64, -(-a.nbytes // 64) * 64)
        fd = None
        if self.mine is None or self.mine[1] < size or self.mine[2] != slots:
            if self.mine is not None:
                self.mine[0].close()  # (the reader keeps its own map of it)
            self.gen += 1
            fd, mm = W.memfd_of(size * slots, "actorflow-stage-link")
            self.mine = (mm, size, slots, self.gen)
        mm, size, slots, gen = self.mine
        off = (mb % slots) * size
        np.copyto(np.ndarray(a.shape, a.dtype, buffer=mm, offset=off), a)
        new = None if fd is None else size * slots
        try:
            self.conn.send(("data", batch, mb, gen, off, a.dtype.str, a.shape, new))
            if fd is not None:
                socket.send_fds(self.sock, [b"F"], [fd])
        except OSError as e:  # (the neighbour ended: its error is the run's)
            raise Stopped(f"the worker of {self.label} ended ({type(e).__name__})") from e
        finally:
            if fd is not None:
                os.close(fd)

    def stop(self, batch: int, why: str) -> None:
        try:
            self.conn.send(("stop", batch, why))
        except OSError:  # (it ended: it stops anyway)
            pass

    def pump(self, batch: int) -> bool:
        """Takes what arrived (without waiting); whether a micro-batch of this batch
        waits to be taken. Raises Stopped where the neighbour stopped or ended, or is on a
        later batch (this one was given up: what came of the later one is kept for it);
        what came of an earlier batch is dropped."""
        early, self.early = self.early, []
        for item in early:
            self._take(batch, item)
        try:
            while self.conn.poll():
                msg = self.conn.recv()
                if msg[0] == "stop":
                    self._take(batch, msg)
                    continue
                _, b, mb, gen, off, dt, shape, new = msg
                if new is not None:  # (a new ring: mapped in place of the old one)
                    _, fds, _, _ = socket.recv_fds(self.sock, 1, 1)
                    if len(fds) != 1:
                        raise EOFError("a ring's descriptor did not come")
                    fd = fds[0]
                    try:
                        mm = mmap.mmap(fd, new, flags=mmap.MAP_SHARED)
                    finally:
                        os.close(fd)
                    if self.theirs is not None:
                        self.theirs.close()
                    self.theirs = mm
                if b >= batch:  # (else a stopped batch's)
                    a = np.ndarray(shape, np.dtype(dt), buffer=self.theirs, offset=off).copy()
                    self._take(batch, ("data", b, mb, a))
        except (EOFError, OSError) as e:
            raise Stopped(f"the worker of {self.label} ended ({type(e).__name__})") from e
        return bool(self.arrived)

    def _take(self, batch: int, item: tuple) -> None:
        """A message (``("data", batch, mb, array)`` or ``("stop", batch, why)``) of this
        batch taken, of a later one kept (and this batch stopped), of an earlier dropped."""
        if item[1] > batch:
            self.early.append(item)
            raise Stopped(f"{self.label} is on a later batch: this one was given up")
        if item[1] < batch:
            return
        if item[0] == "stop":
            raise Stopped(item[2])
        self.arrived.append(item[2:])

    def take(self, batch: int) -> tuple:
        """The next micro-batch arrived (waiting for it)."""
        while not self.pump(batch):
            if not W.wait_up_to([self.conn], W.WAIT_S):
                raise TimeoutError(
                    f"nothing came from {self.label} within {W.WAIT_S:.0f} s "
                    f"(AF_RANKS_WAIT_S sets the wait)"
                )
        return self.arrived.pop(0)

    def close(self) -> None:
        self.conn.close()
        self.sock.close()
        for mm in (self.mine[0] if self.mine else None, self.theirs):
            if mm is not None:
                mm.close()


def _marked(ex: Any, end: _End, outs: list) -> None:
    """Keeps ``end`` under the id of the part ``outs[0]`` (an empty marker)."""
    from ..creation import from_numpy

    ex.parts[outs[0]] = from_numpy(np.zeros(0, np.float32))._impl
    ex.kept[outs[0]] = end


def _listen(ex: Any, path: str, label: str, outs: list) -> None:
    """The link to the previous stage's worker: listens at ``path`` and takes its
    connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(path)
        s.listen(1)
        s.settimeout(W.WAIT_S)
        conn, _ = s.accept()
    conn.settimeout(None)
    _marked(ex, _End(conn, label), outs)


def _connect(ex: Any, path: str, label: str, outs: list) -> None:
    """The link to the next stage's worker, which listens at ``path`` (or soon will)."""
    deadline = time.monotonic() + W.WAIT_S
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{label}'s worker did not listen within {W.WAIT_S:.0f} s"
                ) from None
            time.sleep(0.002)
    _marked(ex, _End(s, label), outs)


def _run(
    ex: Any,
    key: int,
    batch: int,
    bounds: tuple,
    k: int,
    links: tuple,
    slots: tuple,
    in_ids: tuple,
    structure: Any,
    keep: bool,
    seed: int,
    outs: list,
) -> None:
    """Stage ``key``'s part of batch number ``batch`` (micro-batch j: rows ``bounds[j]``
    to ``bounds[j+1]``), holding at most ``k`` micro-batches for backward; ``links``: the
    keys of its ends to the previous and the next stage (0: none), ``slots`` their rings'
    slots; ``in_ids``: the batch's input rows (stage 0) and targets (the last stage).
    ``keep``: the gradients kept for the optimizers' step this worker is sent next
    (``_step``), else handed over (``outs[1:]``). ``seed``: what the batch's random ops
    draw from (the stage begun first: ``pipeline_ranks._start``).
    ``outs[0]``: the report (``report``)."""
    ends = [ex.kept.get(i) if i else None for i in links]
    try:  # (a start that fails tells the neighbours too)
        _start(ex, key, seed, [])
        if any(i and e is None for i, e in zip(links, ends, strict=True)):
            raise RuntimeError("a link of this stage's worker is gone")
        _loop(ex, key, batch, bounds, k, ends, slots, in_ids, structure, keep, outs)
    except BaseException as e:
        label = getattr(ex.kept.get(key), "label", "a stage")
        why = str(e) if isinstance(e, Stopped) else f"{label} failed"
        for end in ends:  # (every way out: no neighbour waits for this one)
            if end is not None:
                end.stop(batch, why)
        raise


def _loop(
    ex: Any,
    key: int,
    batch: int,
    bounds: tuple,
    k: int,
    ends: list,
    slots: tuple,
    in_ids: tuple,
    structure: Any,
    keep: bool,
    outs: list,
) -> None:
    """``_run``'s work, its neighbours' ends given (``ends``): each act a compiled
    program of the stage (``stage_programs``)."""
    st = _kept(ex, key)
    prev, nxt = ends
    first, last = prev is None, nxt is None
    m = len(bounds) - 1
    arrays = []
    for i in in_ids:
        got = ex.inputs([i])
        if isinstance(got, bytes):  # (a put that failed: its error)
            _raise(got)
        arrays.append(ex.read(got[0], lambda a: a, "pipeline stage"))
    x_all: Any = arrays[0] if first else None
    rest = arrays[1:] if first else arrays
    sp = st.programs()
    name = f"stage{st.index}"
    acts: list = []
    waiting: deque = deque()  # (micro-batch, weights part, its bytes): in piece order
    losses: list = []
    nf = nb = 0
    doing: tuple = ("", None)

    def rows(j: int) -> slice:
        return slice(int(bounds[j]), int(bounds[j + 1]))

    def take_input() -> tuple:
        if first:
            return nf, np.ascontiguousarray(x_all[rows(nf)])
        t = time.perf_counter()
        waited = not prev.pump(batch)
        j, a = prev.take(batch)
        if waited:
            acts.append((WAIT, INPUT, t, time.perf_counter()))
        return j, a

    def left_over(j: int, left: Any) -> None:
        """A backward's weights part kept for later: a register of the stage's weights
        actor."""
        if left is None:
            return
        nbytes = left[0].weights_bytes
        waiting.append((j, left, nbytes))
        st.weights_held += nbytes
        st.weights_peak = max(st.weights_peak, st.weights_held)
        st.weights_most = max(st.weights_most, len(waiting))

    try:
        while nb < m or waiting:
            t0 = time.perf_counter()
            b_ready = not last and nb < nf and nxt.pump(batch)
            f_ready = (  # (a backward ready goes first: the forward's input not polled)
                not b_ready
                and nf < m
                and (last or len(st.fifo) < k)
                and (first or prev.pump(batch))
            )
            needs_slot = b_ready or (last and f_ready)  # (an act that leaves a weights part)
            if nb >= m and keep and len(waiting) == 1:
                break  # (the last part: the stage's optimizer step runs it first, _step)
            if waiting and (
                nb >= m or (needs_slot and len(waiting) >= WEIGHT_SLOTS) or not (b_ready or f_ready)
            ):  # (the stage's weights actor: a part runs where nothing else is ready, where
                # an act needs its register, and at the batch's end; in piece order, as the
                # gradients accumulate)
                j, part, nbytes = waiting.popleft()
                doing = (f"{name}.weights", j)
                t0 = time.perf_counter()  # (after the links' reads above)
                sp.weights(part)
                st.weights_held -= nbytes
                acts.append((WEIGHTS, j, t0, time.perf_counter()))
                continue
            if last:  # (its forward, the loss and the input's gradient: one act)
                doing = (f"{name}.forward_backward", nf)
                j, x = take_input()
                t0 = time.perf_counter()
                targets = [np.ascontiguousarray(r[rows(j)]) for r in rest]
                prog = sp.of(x, targets, not first, _LossOf(st.loss, structure), 1.0 / m)
                back = None if first else _sender(prev, batch, j, slots[0])
                loss, _, left = sp.last(prog, x, targets, st.draws(j), back)
                st.peak = max(st.peak, prog.saved_bytes)
                losses.append(loss)
                st.held_most = max(st.held_most, 1)
                acts.append((FORWARD, j, t0, time.perf_counter()))
                left_over(j, left)
                nf += 1
                nb += 1
                continue
            if b_ready:  # (a backward ready goes first)
                j, g = nxt.arrived.pop(0)
                doing = (f"{name}.backward", j)
                mb, prog, saved, _ = st.fifo.popleft()
                if mb != j:  # (the registers keep piece order: by construction)
                    raise RuntimeError(
                        f"{st.label}: the gradient of micro-batch {j} came, but the oldest "
                        f"micro-batch it holds is {mb}"
                    )
                st.held -= prog.saved_bytes
                _, left = sp.backward(
                    prog, g, saved, None if first else _sender(prev, batch, j, slots[0])
                )
                acts.append((BACKWARD, j, t0, time.perf_counter()))
                left_over(j, left)
                nb += 1
                continue
            if f_ready:
                doing = (f"{name}.forward", nf)
                j, x = take_input()
                prog = sp.of(x, [], not first, None, 1.0)
                out, saved = sp.forward(prog, x, st.draws(j))
                st.fifo.append((j, prog, saved, None))  # (rows from the ring: copies)
                st.held += prog.saved_bytes
                st.peak = max(st.peak, st.held)
                st.held_most = max(st.held_most, len(st.fifo))
                nxt.send(batch, j, out, slots[1])
                acts.append((FORWARD, j, t0, time.perf_counter()))
                nf += 1
                continue
            doing = ("", None)
            credit = nf < m and len(st.fifo) >= k  # (its forward waits for a backward)
            waits = [e.conn for e in (None if credit or nf >= m else prev, nxt) if e]
            if not W.wait_up_to(waits, W.WAIT_S):
                raise TimeoutError(
                    f"{st.label} waited {W.WAIT_S:.0f} s for its neighbours "
                    f"(AF_RANKS_WAIT_S sets the wait)"
                )
            acts.append((WAIT, CREDIT if credit else INPUT, t0, time.perf_counter()))
    except (Stopped, KeyboardInterrupt):
        raise
    except BaseException as e:
        actor, piece = doing
        if not actor:
            raise
        raise ActorError(actor, piece, e, traceback.format_exc()) from e
    if keep:  # (kept for the step: whether each parameter has one)
        has = [int(i in sp.issued) for i in range(len(sp.grads))]  # (one may be left)
        st.left = waiting.popleft()[:2] if waiting else None
    else:
        has = handed_over(ex, st, outs[1:])  # (the gradients: this command's other parts)
    ex.parts[outs[0]] = from_numpy(report(st, has, losses, acts))._impl
    return None


def _step(ex: Any, key: int, steps: list, outs: list) -> None:
    """The optimizers' step of stage ``key``'s parameters in its worker, after a batch
    every stage ended well (this process read every report), with the gradients the
    batch kept (``keep``): each optimizer over a stand-in holding this stage's groups
    and state (``stage_steps``: each state tensor the id of its part, each count a
    value), its update compiled (``stage_programs.StageStep``: the same bits as the eager
    ``step()`` this process would run on the parts); the gradients let go after.
    ``outs[0]``: the counts after the step, in ``steps``' order (checked against what this
    process counted: ``counted``). The batch's last weights part, which ``_run`` left
    (``_Kept.left``), runs first: its error is the step's, as the ``ActorError`` of
    ``stage{i}.weights`` on its micro-batch. A step that raises leaves the parameters and
    their state as they were."""
    from .stage_programs import StageStep

    st = _kept(ex, key)
    sp = st.programs()
    left, st.left = st.left, None
    try:  # (the batch's last weights part first: its gradients are the step's)
        if left is not None:
            try:
                sp.weights(left[1])
            except BaseException as e:
                raise ActorError(
                    f"stage{st.index}.weights", left[0], e, traceback.format_exc()
                ) from e
        rows: list = []
        fixed: dict = {}  # (row, name) -> value: a scheduled option that has not changed yet
        for o, (cls, attrs, groups) in enumerate(steps):
            shell = object.__new__(cls)  # (its options and state given: not made anew)
            shell.__dict__.update(attrs)
            shell.param_groups, shell.state, shell._rates = [], {}, {}
            for g, (options, params) in enumerate(groups):
                group = {**options, "params": [st.params[k] for k, _ in params]}
                shell.param_groups.append(group)
                for k, entries in params:  # (what the step holds: graph_key reads it)
                    shell.state[st.params[k]] = {n: v for n, (_, v) in entries.items()}
                mine = [(k, entries) for k, entries in params if sp.grads[k] is not None]
                for name, value in shell.flat_rates(group):
                    seen = sp.rates.setdefault((o, g, name), value)  # (once it changed: read
                    if seen != value:  # from a tensor from then on, so a schedule does not
                        sp.rates[o, g, name] = None  # compile the step anew at each value)
                    elif mine:
                        fixed[len(rows), name] = value
                if mine:
                    rows.append((shell, group, mine))
        counts: list = []
        if rows:
            kind = tuple(
                (
                    type(shell),
                    repr(sorted(attrs_of(shell).items())),
                    shell.graph_key(group),
                    tuple((k, tuple((n, how) for n, (how, _) in e.items())) for k, e in mine),
                )
                for shell, group, mine in rows
            ) + (tuple(sorted(fixed.items())),)
            grads = [sp.grads[k] for _, _, mine in rows for k, _ in mine]
            at = [(sh, g, [(st.params[k], e) for k, e in mine]) for sh, g, mine in rows]
            view = lambda i: part_view(ex, i)  # noqa: E731 - a part's tensor, by its id
            step = sp.steps.get(kind)
            if step is None:
                if len(sp.steps) >= 8:  # (a few kept: options that change the ops)
                    sp.steps.clear()
                step = sp.steps[kind] = StageStep(at, grads, view, fixed)
            counts = step.run(at, grads, view)
    finally:
        sp.before = {}  # (the batch ended well: its buffers' copies let go)
        sp.clear()
    ex.parts[outs[0]] = from_numpy(np.asarray(counts, np.int64))._impl


def attrs_of(opt: Any) -> dict:
    """An optimizer's attributes besides its groups and state (what a stand-in of it in
    a worker is given: ``stage_steps``), less its ``caches`` (made again there: Adam's
    bias corrections)."""
    caches = set(getattr(opt, "caches", ()))
    return {
        k: v
        for k, v in vars(opt).items()
        if k not in ("param_groups", "state", "_rates", "_waits") and k not in caches
    }


def _sender(end: _End, batch: int, mb: int, slots: int) -> Any:
    """What sends micro-batch ``mb``'s input gradient back on ``end`` (a backward act
    sends it as soon as it is made, before the parameters' gradients are computed)."""
    return lambda a: end.send(batch, mb, a, slots)


class _LossOf:
    """The loss given (``loss=``) on a micro-batch's output and its targets as ``build``
    would get them (``structure``: how the rest of the batch was given)."""

    def __init__(self, loss: Any, structure: Any) -> None:
        self.loss, self.structure = loss, structure

    def __call__(self, out: Tensor, *targets: Tensor) -> Any:
        return self.loss(out, *unflatten(self.structure, list(targets)))


def report(st: Any, has: list, losses: list, acts: list) -> np.ndarray:
    """A stage's report as float64: the most micro-batches it held, its peak of saved
    bytes, the most weights parts it held waiting and their peak bytes, per parameter
    whether it got a gradient (the count first), its losses (the count first), then per
    act (kind, micro-batch, start, end), or per wait (WAIT, its cause, start, end)."""
    head = [float(st.held_most), float(st.peak), float(st.weights_most), float(st.weights_peak)]
    head += [float(len(has)), *has, float(len(losses))]
    body = np.asarray(acts, np.float64).reshape(-1)
    return np.concatenate([np.asarray(head + losses, np.float64), body])


def read_report(a: np.ndarray) -> tuple:
    """``report``'s parts: (most held, peak saved bytes, losses, acts, whether each
    parameter got a gradient, (most weights parts waiting, their peak bytes))."""
    k = int(a[4])
    has = [bool(v) for v in a[5 : 5 + k]]
    n = int(a[5 + k])
    at = 6 + k + n
    losses = [float(v) for v in a[6 + k : at]]
    acts = [(int(r[0]), int(r[1]), float(r[2]), float(r[3])) for r in a[at:].reshape(-1, 4)]
    return int(a[0]), int(a[1]), losses, acts, has, (int(a[2]), int(a[3]))


# -- this process's side -----------------------------------------------------------------


class Links:
    """The links between consecutive stages' workers (``stages``: their ``RankStage``s),
    made once and again where a stage's worker changed; dropped after a failed batch."""

    def __init__(self) -> None:
        self._ends: list = []  # per link: (marker on stage i, marker on stage i+1)
        self._for: Any = None  # the workers they were made for
        self.in_flight: list = []  # (ranks, report part, busy mark) of a batch given up
        self._folder: str | None = None  # where the sockets of links being made are

    def ends(self, stages: list) -> tuple:
        """Per stage, the keys of its ends (previous, next; 0: none), and the markers of
        links made now (to ``confirm`` once their commands are sent)."""
        now = [(id(w.ranks), tuple(w.ranks.pids)) for w in stages]
        made: list = []
        if now != self._for:
            self.drop()
            made = self._ends = self._make(stages)
            self._for = now
        out = []
        for i in range(len(stages)):
            before = self._ends[i - 1][1].id if i > 0 else 0
            after = self._ends[i][0].id if i < len(stages) - 1 else 0
            out.append((before, after))
        return out, [(stages[i], stages[i + 1], e) for i, e in enumerate(made)]

    def _make(self, stages: list) -> list:
        """The links' commands: stage i+1's worker listens, stage i's connects (sent
        together, before any other command to them: the listening one waits)."""
        from ..dtype import float32

        n = len(stages)
        self.forget_folder()  # (one a batch given up left: its commands are over)
        if n < 2:
            return []
        self._folder = tempfile.mkdtemp(prefix="actorflow-links-")  # (this user's only)
        made = []
        for i in range(n - 1):
            a, b = stages[i], stages[i + 1]
            path = os.path.join(self._folder, str(i))
            (theirs,) = b.ranks.call_fn(0, _listen, (path, f"stage {i} of {n}"), (float32,))
            (mine,) = a.ranks.call_fn(0, _connect, (path, f"stage {i + 1} of {n}"), (float32,))
            made.append((mine, theirs))
        return made

    def confirm(self, made: list) -> None:
        """Waits for the links just made (their errors raised here: one that is not a
        timeout first, the cause where the other end gave up waiting) and removes the
        folder of their sockets."""
        errors = []
        try:
            for a, b, (mine, theirs) in made:
                for w, part in ((b, theirs), (a, mine)):
                    try:
                        w._read(part)
                    except Exception as e:  # noqa: BLE001 - the telling one raised below
                        errors.append(e)
        finally:
            self.forget_folder()
        if errors:
            timeouts = (TimeoutError, socket.timeout)
            raise next((e for e in errors if not isinstance(e, timeouts)), errors[0])

    def forget_folder(self) -> None:
        """Removes the folder of the links' sockets made last, if any."""
        folder, self._folder = self._folder, None
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)

    def settle(self) -> None:
        """Waits for the end of a batch given up (its reports read, their errors not
        raised: the workers ran it to its end or stop by themselves)."""
        while self.in_flight:  # (a Ctrl-C here leaves this one and the rest for later)
            ranks, part, mark = self.in_flight[0]
            try:
                ranks.read(0, part)
            except Exception:  # noqa: BLE001 - that batch was given up
                pass
            ranks.idle(0, mark)
            self.in_flight.pop(0)

    def drop(self) -> None:
        """Lets go of the ends (the workers close them)."""
        self._ends = []
        self._for = None


def stage_steps(stages: list, optimizers: list) -> tuple | None:
    """What the stages' workers step after a batch in place of this process (``_step``):
    per stage (``stages``: their ``RankStage``s), per optimizer with parameters there,
    its class, its attributes besides its groups and state, and per group its options
    and per parameter that requires grad its index in the stage and its state
    (``Optimizer._state``: what ``step()`` reads, made now where missing, as ``step()``
    would; each tensor as the id of its part, each count as its value). Also the counts
    (``Optimizer.counts``: a step adds one to each of a parameter with a gradient) as
    ``(stage, parameter index, state, name)``, and the parameters whose state was made
    now. None where this process steps them: an optimizer with a ``step()`` of its own,
    of a class defined in ``__main__`` or inside a function (a worker loads a class by its
    module's name and its name there) or with attributes that are not plain data
    (numbers, strings, and tuples, lists and dicts of them; its ``caches`` left out), one
    holding a parameter that is in no stage, or a state value that is neither a
    tensor nor a count."""
    from ..autograd import no_grad
    from ..parallel.interpreter import parts_of

    if not STEP_IN_WORKERS:
        return None
    where = {
        id(p): (i, k) for i, w in enumerate(stages) for k, p in enumerate(w.module.parameters())
    }
    for o in optimizers:
        if not o.steps_by_update():
            return None  # (a step() of its own)
        kind = type(o)
        if kind.__module__ == "__main__" or "<locals>" in kind.__qualname__:
            return None  # (a worker loads its class by its module's name)
        if not _plain(attrs_of(o)):
            return None  # (and is given plain data only)
        if any(id(p) not in where for g in o.param_groups for p in g["params"]):
            return None
    steps: list = [[] for _ in stages]
    counts: list = []
    fresh: list = []
    with no_grad():
        for o in optimizers:
            attrs = attrs_of(o)
            groups: list = [[] for _ in stages]
            for g in o.param_groups:
                options = {k: v for k, v in g.items() if k != "params"}
                rows: list = [[] for _ in stages]
                for p in g["params"]:
                    if not p.requires_grad:
                        continue
                    i, k = where[id(p)]
                    if p not in o.state:
                        fresh.append((o, p, i, k))
                    st = o._state(p, g)
                    entries = {}
                    for name, v in st.items():
                        if name in o.counts:
                            v = st[name] = int(v.item() if isinstance(v, Tensor) else v)
                            entries[name] = ("value", v)
                            counts.append((i, k, st, name))
                        elif isinstance(v, Tensor):  # (where p is: _state puts it there)
                            entries[name] = ("part", parts_of(v._impl)[0].id)
                        else:
                            forget_fresh(fresh)
                            return None
                    rows[i].append((k, entries))
                for i, r in enumerate(rows):
                    if r:
                        groups[i].append((options, r))
            for i, gs in enumerate(groups):
                if gs:
                    steps[i].append((type(o), attrs, gs))
    return steps, counts, fresh


def _plain(v: Any) -> bool:
    """Whether ``v`` is plain data: None, a bool, number or string, or a tuple, list or
    dict of plain data."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return True
    if isinstance(v, (tuple, list)):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(_plain(k) and _plain(x) for k, x in v.items())
    return False


def counted(reports: list, counts: list, fresh: list) -> tuple:
    """After a batch every stage ended well, before its step: each count of a parameter
    with a gradient one more (what the step makes it, ``counts``' order: what the workers
    give back), the state made for the step let go where the parameter got no gradient
    (``step()`` makes none then). Returns what ``stepped`` checks and, for a stage whose
    step failed, sets back: per count its value and whether it was added to, and the
    state made for parameters that step."""
    out = []
    for i, k, st, name in counts:
        moved = bool(reports[i][4][k])
        st[name] += moved
        out.append((st[name], moved))
    for o, p, i, k in fresh:
        if not reports[i][4][k]:
            o.state.pop(p, None)
    return out, [f for f in fresh if reports[f[2]][4][f[3]]]


def send_steps(stages: list, steps: list) -> list:
    """Each stage's worker sent its optimizers' step (``_step``) and asked for what it
    gives back, without waiting (stage 0's sent now, the others' with the next commands
    to their workers): returns per stage (its ranks, the ask's token). All or none: they
    are kept (``HeldRanks.held``) until all are issued, and where issuing one fails, those
    issued are taken back (a Ctrl-C meanwhile is raised once all are issued: the caller
    keeps them)."""
    from ..dtype import int64

    issued: list = []
    try:
        with _sigint_deferred() as interrupted, contextlib.ExitStack() as held:
            for w in stages:  # (kept until all are issued: a full batch of commands
                held.enter_context(w.ranks.held())  # would send one that is)
            for w, mine in zip(stages, steps, strict=True):
                (part,) = w.ranks.call_fn(0, _step, (w.key, mine), (int64,))
                issued.append((w.ranks, part))
    except BaseException:
        for ranks, part in issued:
            ranks.unissue(0, part)
        raise
    asked = [(ranks, ranks.ask(0, part)) for ranks, part in issued]
    stages[0].ranks.flush()
    if interrupted:
        raise StepsSent(asked)
    return asked


class StepsSent(KeyboardInterrupt):
    """A Ctrl-C while the optimizers' steps were issued: they were (``asked``), and the
    caller keeps them before it raises."""

    def __init__(self, asked: list) -> None:
        super().__init__()
        self.asked = asked


def stepped(stages: list, asked: list, want: tuple, counts: list) -> None:
    """Waits for the steps ``send_steps`` sent, and checks the counts each gives back
    against ``want`` (``counted``'s). A stage's step that failed (leaving its parameters
    and state as they were) has its counts and the state made for it set back here, and
    its error raised, the first stage's, as the ``ActorError`` of actor ``stage{i}.step``
    (a worker that ended: its stage's error), with ``stepped_any``: whether another
    stage's step went through (the stages are then out of step with each other)."""
    values, fresh = want
    errors = []
    went = 0
    for i, (w, (ranks, token)) in enumerate(zip(stages, asked, strict=True)):
        mine = [(c, v) for c, v in zip(counts, values, strict=True) if c[0] == i]
        try:
            got = [int(v) for v in ranks.answer(0, token)]
        except Exception as e:  # noqa: BLE001 - raised below, the first stage's
            for (_, _, st, name), (_, moved) in mine:  # (nothing stepped there)
                st[name] -= moved
            for o, p, j, _ in fresh:
                if j == i:
                    o.state.pop(p, None)
            err = stage_error(stages, e)
            if err is e:
                err = ActorError(f"stage{w.index}.step", None, e)
            errors.append(err)
            continue
        went += 1
        expected = [v for _, (v, moved) in mine if moved]  # (those stepped)
        if got != expected:
            errors.append(
                RuntimeError(
                    f"stage {w.index}'s optimizers counted steps {got} in its worker where "
                    f"{expected} were expected (an optimizer whose update adds other than "
                    f"one to its counts: give it a step() of its own, which this process "
                    f"runs)"
                )
            )
    if errors:
        errors[0].stepped_any = went > 0  # type: ignore[attr-defined]  # (read by the caller)
        raise errors[0]


def forget_fresh(fresh: list) -> None:
    """The state ``stage_steps`` made let go (a batch that failed: nothing steps)."""
    for o, p, _, _ in fresh:
        o.state.pop(p, None)


def run_batch(
    stages: list,
    links: Links,
    batch: int,
    x: np.ndarray,
    rest: list,
    bounds: tuple,
    buffers: list,
    structure: Any,
    seeds: list,
    keep: bool = False,
) -> list:
    """One batch in the workers of ``stages`` (their ``RankStage``s, each begun with
    ``start=False``: ``seeds``, what each one's ``_run`` starts the batch with): returns
    each stage's ``read_report`` and the parts its parameters' gradients are in (made where
    the report says so; none with ``keep``: the workers keep them for their optimizers'
    step, ``_step``). Raises the first stage's error that is not a ``Stopped``
    (a worker that ended: the ranks' ActorError), after every report was read."""
    links.settle()  # (a batch given up before: its end waited for, here)
    n = len(stages)
    held = [stages[0]._put(x)] + [stages[-1]._put(r) for r in rest]  # (alive until read)
    puts: list = [[] for _ in range(n)]
    puts[0].append(held[0].id)
    puts[-1] += [p.id for p in held[1:]]
    # each worker bounds its own waits for its neighbours (AF_RANKS_WAIT_S); this process
    # waits for the batch as a whole, and so does any request reaching its workers
    # meanwhile (another thread's, another graph's on shared workers)
    budget = (2 * (len(bounds) - 1) + 1) * W.WAIT_S
    ranks = sorted({id(w.ranks): w.ranks for w in stages}.values(), key=id)
    issued: list = []  # (ranks, part) of each RUN issued, as they are
    interrupted: list = []
    try:
        with _sigint_deferred() as interrupted, _ISSUING:  # (then each ranks' lock)
            parts, made, marks = _holding(
                [r.lock for r in ranks],
                lambda: _issue(
                    stages,
                    links,
                    batch,
                    bounds,
                    buffers,
                    puts,
                    structure,
                    seeds,
                    keep,
                    budget,
                    issued,
                ),
            )
    except BaseException:
        for r, part in issued:  # (not sent: taken back; one sent runs, and gives up on
            if not r.unissue(0, part):  # its neighbours after AF_RANKS_WAIT_S: waited
                links.in_flight.append((r, part, r.busy(0, budget)))  # for next time)
        links.drop()
        if interrupted:
            raise KeyboardInterrupt from None
        raise
    flying = [(w.ranks, p[0], k) for w, p, k in zip(stages, parts, marks, strict=True)]
    reports: list = [None] * n
    errors: list = []
    try:
        if interrupted:  # (Ctrl-C while its commands were sent: raised now)
            raise KeyboardInterrupt
        links.confirm(made)
        # the last stage's report first: its worker ends its part first (stage 0's last
        # backward is the batch's last act), so the reads overlap the batch's tail
        for i in reversed(range(n)):
            (part, grads), w = parts[i], stages[i]
            try:
                reports[i] = (*read_report(w._read(part)), grads)
            except Exception as e:  # noqa: BLE001 - the first real one raised below
                errors.append((i, e))
            w.ranks.idle(0, marks[i])
            flying.pop()
    except BaseException:  # (Ctrl-C, or the links' error: the workers end the batch)
        links.drop()
        links.in_flight = flying
        raise
    del held
    errors = [e for _, e in sorted(errors, key=lambda ie: ie[0])]  # (in stage order)
    if errors:
        links.drop()  # (made again at the next batch)
        ended = [e for e in errors if isinstance(e, ActorError) and e.actor.startswith("rank ")]
        real = [e for e in errors if not isinstance(e, Stopped)]
        first = (ended or real or errors)[0]  # (a worker that ended, else the act's error)
        raise first from first.__cause__
    return reports


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[list]:
    """On the main thread, a Ctrl-C in the block is kept (the list it yields becomes
    true) rather than raised inside it: a batch's commands go to all its workers or none
    (one without its neighbours' would wait for them). Elsewhere, nothing (Ctrl-C is
    raised on the main thread only)."""
    got: list = []
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    if before is not signal.default_int_handler:  # (another thread, or another handler:
        yield got  # left as it is)
        return
    try:
        signal.signal(signal.SIGINT, lambda *_: got.append(1))
    except ValueError:  # (not the main interpreter)
        yield got
        return
    try:
        yield got
    finally:
        signal.signal(signal.SIGINT, before)


def _holding(locks: list, fn: Any) -> Any:
    """``fn()`` holding ``locks`` (each taken by a ``with``: released on any way out)."""
    if not locks:
        return fn()
    with locks[0]:
        return _holding(locks[1:], fn)


def _issue(
    stages: list,
    links: Links,
    batch: int,
    bounds: tuple,
    buffers: list,
    puts: list,
    structure: Any,
    seeds: list,
    keep: bool,
    budget: float,
    issued: list,
) -> tuple:
    """(Holding every stage's ranks' lock) the links made where missing, every stage's
    ``_run`` issued (each noted in ``issued`` as it is) and sent; returns the report
    parts, the links' parts made and the workers' busy marks."""
    from ..dtype import float64

    n = len(stages)
    ends, made = links.ends(stages)
    for a, b, pair in made:
        issued += [(a.ranks, pair[0]), (b.ranks, pair[1])]
    parts = []
    with contextlib.ExitStack() as held:  # (kept until all are issued: see send_steps)
        for w in stages:
            held.enter_context(w.ranks.held())
        for i, w in enumerate(stages):
            slots = (buffers[i - 1] if i > 0 else 0, buffers[i] if i < n - 1 else 0)
            handed = () if keep else tuple(p.dtype for p in w.module.parameters())
            part, *grads = w.ranks.call_fn(
                0,
                _run,
                (
                    w.key,
                    batch,
                    bounds,
                    buffers[i],
                    ends[i],
                    slots,
                    tuple(puts[i]),
                    structure,
                    keep,
                    seeds[i],
                ),
                (float64, *handed),
            )
            issued.append((w.ranks, part))
            parts.append((part, grads))
    for w in stages:  # (every stage's command sent before any is waited for)
        w.ranks.flush()
    # (marked busy once all are sent: no other thread's request came in between, as this
    # holds every stage's ranks' lock)
    return parts, made, [w.ranks.busy(0, budget) for w in stages]


_ISSUING = threading.Lock()  # held while a batch's commands go to its stages' workers


def stage_error(stages: list, e: BaseException) -> BaseException:
    """``e`` as the stage's error where it is the ranks' error of a stage whose worker
    ended (an ``ActorError`` naming the placement and the rank): the ``ActorError`` of
    actor ``stage{i}`` holding it; else ``e``."""
    if not isinstance(e, ActorError) or not e.actor.startswith("rank "):
        return e
    for w in stages:
        if w.ranks.closed and e.actor.endswith(repr(w.ranks.placement)):
            err = ActorError(f"stage{w.index}", None, e)
            Exception.__init__(
                err, f"actor 'stage{w.index}' stopped: its worker ended or stopped answering: {e}"
            )
            return err
    return e
