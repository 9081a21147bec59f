#!/usr/bin/env python
"""Training past one process on a 2-core machine: data parallelism over 2 ranks and a
2-stage pipeline against one process, with PyTorch's baselines (DDP on gloo, a hand-written
pipeline) and GPipe's bubble fraction as the theory column.

The model is an MLP 1536-1024-1024-10 (``Linear(1536, 1024), ReLU, Linear(1024, 1024), ReLU,
Linear(1024, 10)``) trained with ``CrossEntropyLoss`` and SGD (lr 0.01, momentum 0.9) on one
float32 batch of 512, all on the CPU: a compute-bound step of ~40 ms on one core. Each timed
run is K training steps (20 by default) started from the same weights and a fresh optimizer
state (reset before the clock starts); the time per step is the run's wall time over K, read
in this process from the command sent to the workers to the last worker's reply.

Every contender runs in worker processes (``torch.multiprocessing``, spawn) started once,
before the rounds, and kept; this process only sends commands and waits. Every rank of
every contender computes with ``--threads`` threads (1 by default; OMP/MKL/OpenBLAS
variables pinned before numpy and torch load, ``torch.set_num_threads`` in each worker),
so on 2 cores one process uses one core and 2 ranks use both:

Part 1, data parallelism (the step at S(0) over the batch, the weights replicated):

- ``pytorch, one process``: the whole batch in one process, ``--threads`` threads (the
  reference every speedup is taken against);
- ``pytorch, one process, 2x threads``: the same with twice the threads, both cores (for
  reference: what intra-op parallelism alone gets);
- ``pytorch DDP gloo, 2 ranks``: ``DistributedDataParallel`` over a gloo process group of 2
  processes (TCP on 127.0.0.1), each rank the half of the batch at its rank's offset; the
  gradients averaged by DDP's all-reduce (default buckets), so every rank takes the
  full-batch step. Each run starts with a barrier.
- ``pytorch, shared-memory all-reduce, 2 ranks``: the same split written by hand with the
  gradients averaged through shared memory instead: after backward each rank copies its
  gradients into its row of a shared buffer (``share_memory_()``; two of them, used in turn
  step by step), waits at a ``multiprocessing.Barrier``, then sets its gradients to
  ``(row 0 + row 1) / 2``: what the all-reduce costs without TCP, for the choice of the
  transport between local ranks.

Part 2, pipeline parallelism (k = 2 stages; stage 0 is ``Linear(1536, 1024), ReLU``, stage 1
``Linear(1024, 1024), ReLU, Linear(1024, 10)`` and the loss: about equal work, as stage 0's
first layer computes no input gradient and is 1.5x wider):

- ``pytorch pipeline, 2 stages, m=M``: a hand-written pipeline over two processes, the batch
  cut into M micro-batches. Stage 0's outputs and their gradients are handed over in two
  shared-memory buffers of the whole batch (``share_memory_()``, micro-batch i at its rows,
  one copy in), the micro-batch's index going through a ``multiprocessing`` queue each way
  (a put never blocks a stage). The 1F1B order: stage 0 runs one forward ahead, then a
  forward and a backward in turn; stage 1 runs forward, loss, backward per micro-batch;
  gradients accumulate over the micro-batches (each one's loss divided by M) and each
  stage's optimizer steps once per batch. Stage 0 reports how many micro-batches'
  activations it held at most (2 for M >= 2: the 1F1B bound); each stage reports the
  fraction of a run it spent waiting for the other and its CPU time (best run's, in the
  JSON and the output). (A first version pickled numpy arrays through the queues: about
  10 % slower at m=4.)
- ``pytorch, one process, m=M`` (diagnostic, ``--no-diagnostics`` drops them): one process
  running the same M micro-batches, gradients accumulated: what the micro-batches alone cost,
  so the pipeline rows' ``vs same m`` column separates the pipeline's gain from that cost.

actorflow's pipeline rows: ``actorflow pipeline, 2 stages, m=M`` is ``nn.Graph(stages=[...],
micro_batches=M)`` with its stages on threads of this process (one interpreter lock);
``actorflow pipeline on process ranks, 2 stages, m=M`` the same graph with
``stage_ranks="processes"``: each stage in a worker process of its own (a one-rank placement
under process ranks, one BLAS thread each on 2 cores) that runs the stage's module there,
each forward or backward act one command (eager autograd in the worker); the stage threads
here only put, ask and wait; every activation and gradient goes through this process (put
to the next stage's worker, read back from the previous one's through the channel kept
with each worker: a copy each way per micro-batch); ``actorflow pipeline, stages in
workers run the batch (loss=), 2 stages, m=M`` the same stages on process ranks with the
loss given as ``loss=`` (no ``build``), so each batch is one command per worker and the
workers pass activations and gradients to each other through shared memory
(``nn/pipeline_links.py``). The rows of every M share the two workers. Each actorflow
pipeline row also prints the micro-batches each stage held for
backward at most against its registers (the plan's bound, ``n - i``) and each stage's peak
of saved activation bytes (for stages on process ranks, measured in their workers); the
``loss=`` rows also the weights parts each stage held waiting at most (its weights actor's
registers: zero-bubble's B/W split, ``WEIGHT_SLOTS``) and their peak bytes.

The theory column is GPipe's bubble fraction ``(k-1)/(m+k-1)`` and the ideal speedup with
it, ``k m / (m+k-1)``; a measured row's idle fraction is ``1 - speedup / k`` (all it loses:
the bubble, the smaller micro-batches' lower efficiency and the hand-over), to be read
beside the stages' measured waits (the bubble and any imbalance).

Goals (stated for actorflow's rows, printed for every row as information): data-parallel
over 2 ranks >= 1.6x one process; 2 pipeline stages >= 1.6x one process.

Checks. Once, outside the clock: every contender's parameters after K steps from the
shared initial weights equal one process's on the full batch within rtol 1e-4, atol 1e-6
(the mean of the half-batch or micro-batch gradients is the full-batch gradient; only the
summation order differs), and a data-parallel row's two ranks hold the same parameters bit
for bit. Every run: the last step's loss (data-parallel: the mean of the ranks' half-batch
losses; pipeline and micro-batches: the sum of the micro-batches' losses over M) finite and
equal to one process's within 1e-4 relative, and the data-parallel ranks' parameters equal
bit for bit (a digest of their bytes).

Every contender is timed as best of N interleaved rounds (round-robin, the order rotated
every round, both parts in the same rounds) after one untimed warm-up, the median recorded
too (benchmarks/harness.py). The CPU other processes took meanwhile is reported (the
workers' CPU counted as this benchmark's): the 2-process rows need both cores, so a busy
neighbour costs them more than the one-process row. Worker processes are shut down when
the run ends, even when it fails (a worker that dies makes its rows fail, not the run hang);
every wait for a worker has a timeout.

Adding contenders (actorflow's data- and pipeline-parallel rows): write a function taking
the ``Context`` and returning a ``harness.Contender`` (see ``one_process`` and
``data_parallel``) and append a ``Row`` to ``ROWS`` (the comment there says where).

Usage::

    python benchmarks/bench_parallel.py              # full run (~2.5 min on 2 cores)
    python benchmarks/bench_parallel.py --quick      # smoke run (~30 s)
    python benchmarks/bench_parallel.py --steps 40 --micro 2,4 --out /tmp/parallel.json

Exit status: 0 when every run of every contender was correct, 1 when a check failed or a
contender raised (the JSON is written either way).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import math
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file

IN, HIDDEN, CLASSES = 1536, 1024, 10
BATCH = 512
LR, MOMENTUM = 0.01, 0.9
SEED = 0
RANKS = 2  # data-parallel ranks and pipeline stages (k)
STAGE_CUT = 2  # modules [0, STAGE_CUT) of the Sequential are stage 0, the rest stage 1
MICRO = (1, 2, 4, 8)  # micro-batches per batch of the pipeline rows (m)

# Goals stated by the project (for actorflow's rows; PyTorch's are measured against them too).
DATA_PARALLEL_GOAL = 1.6  # data-parallel over 2 ranks >= 1.6x one process
PIPELINE_GOAL = 1.6  # 2 pipeline stages >= 1.6x one process

LOSS_RTOL = 1e-4  # a run's last loss vs one process's
PARAM_RTOL, PARAM_ATOL = 1e-4, 1e-5  # parameters after K steps vs one process's (another
#   library's BLAS, numpy's OpenBLAS against torch's, rounds otherwise: 20 momentum steps
#   leave a few 1e-6 on weights of ~0.02)

START_TIMEOUT_S = 120.0  # a worker's start (spawn, import torch, gloo rendezvous)
JOIN_TIMEOUT_S = 10.0  # a worker's exit after "stop", before terminate/kill
GLOO_TIMEOUT_S = 60.0  # gloo's own timeout on a collective


def call_timeout(k: int) -> float:
    """Seconds to wait for a command of ``k`` steps (~40 ms each on one core): generous."""
    return 30.0 + 3.0 * k


# -- the model (in the workers) ------------------------------------------------------------


def build_mlp(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Linear(IN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def digest(params: dict) -> str:
    """A hash of the parameters' bytes (bit for bit comparisons across processes)."""
    h = hashlib.sha256()
    for k in sorted(params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(params[k]).tobytes())
    return h.hexdigest()[:16]


class Peer:
    """A stage's link to the other stage: two shared-memory buffers of the whole batch
    (``acts``: stage 0's outputs, ``grads``: their gradients, micro-batch i at its rows),
    a queue to send a micro-batch's index on (``put`` returns at once: a feeder thread
    writes the pipe) and one to receive from, every receive with a timeout. A buffer's rows
    are written again only in the next batch, after the reader is done with them (stage 0
    gets the last gradient of a batch after stage 1 read every activation of it)."""

    def __init__(self, out_q, in_q, acts, grads, what: str):
        self.out_q, self.in_q, self.what = out_q, in_q, what
        self.acts, self.grads = acts, grads
        self.waited_s = 0.0  # time spent blocked in recv

    def send(self, i: int) -> None:
        self.out_q.put(i)

    def recv(self, timeout: float) -> int:
        import queue

        t0 = time.perf_counter()
        try:
            return self.in_q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.what}: nothing came within {timeout:.0f} s") from None
        finally:
            self.waited_s += time.perf_counter() - t0

    def drain(self) -> None:
        """Drops what a failed run left in the queue."""
        import queue

        while True:
            try:
                self.in_q.get(timeout=0.05)
            except queue.Empty:
                return

    def close(self) -> None:
        self.out_q.cancel_join_thread()  # exit even when the other stage read nothing


class Trainer:
    """A worker's model (the whole MLP, or a stage of it), optimizer and data."""

    def __init__(self, torch, role: str, rank: int, cfg: dict, peer):
        self.torch, self.role, self.rank, self.cfg = torch, role, rank, cfg
        self.peer = (
            Peer(*peer, f"stage {rank} waiting on stage {1 - rank}") if role == "stage" else None
        )
        self.lossf = torch.nn.CrossEntropyLoss()
        full = build_mlp(torch)
        X, Y = torch.from_numpy(cfg["X"]), torch.from_numpy(cfg["Y"])
        if role == "stage":
            idx = range(STAGE_CUT) if rank == 0 else range(STAGE_CUT, len(full))
            self.keys = [f"{i}.{n}" for i in idx for n, _ in full[i].named_parameters()]
            self.model = torch.nn.Sequential(*(full[i] for i in idx))
            self.prefix = {f"{j}.": f"{i}." for j, i in enumerate(idx)}
        else:
            self.model, self.prefix = full, {}
        self.x, self.y = X, Y
        if role == "ddp":
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel

            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{cfg['port']}",
                rank=rank,
                world_size=RANKS,
                timeout=_dt.timedelta(seconds=GLOO_TIMEOUT_S),
            )
            self.dist = dist
            half = BATCH // RANKS
            self.x, self.y = X[rank * half : (rank + 1) * half], Y[rank * half : (rank + 1) * half]
            self.reset()  # the same weights on both ranks before DDP broadcasts rank 0's
            self.net = DistributedDataParallel(self.model)
        else:
            self.net = self.model
        if role == "shm":
            self.shm, self.barrier = peer  # [2 phases, RANKS, parameters] shared, a Barrier
            self.phase = 0
            half = BATCH // RANKS
            self.x, self.y = X[rank * half : (rank + 1) * half], Y[rank * half : (rank + 1) * half]
        self.reset()

    def full_key(self, key: str) -> str:
        for local, full in self.prefix.items():
            if key.startswith(local):
                return full + key[len(local) :]
        return key

    def local_key(self, key: str) -> str:
        for local, full in self.prefix.items():
            if key.startswith(full):
                return local + key[len(full) :]
        return key

    def params(self) -> dict:
        return {
            self.full_key(k): v.detach().numpy().copy() for k, v in self.model.state_dict().items()
        }

    def reset(self) -> None:
        torch = self.torch
        saved = self.cfg["saved"]
        own = {
            self.local_key(k): torch.from_numpy(v.copy())
            for k, v in saved.items()
            if self.role != "stage" or k in self.keys
        }
        self.model.load_state_dict(own)
        if self.role == "shm":
            self.phase = 0
        if self.peer is not None:
            self.peer.drain()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)

    def run(self, k: int, threads: int | None = None, micro: int = 1) -> dict:
        torch = self.torch
        if threads is not None:
            torch.set_num_threads(threads)
        out: dict[str, Any] = {"threads": torch.get_num_threads()}
        if self.role == "ddp":
            self.dist.barrier()
        if self.peer is not None:
            self.peer.waited_s = 0.0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        loss, kept = None, 0
        for _ in range(k):
            self.opt.zero_grad()
            if self.role == "stage" and self.rank == 0:
                kept = max(kept, self.stage0_step(micro))
            elif self.role == "stage":
                loss = self.stage1_step(micro)
            elif micro > 1:
                loss = self.accumulate(micro)
            else:
                loss_t = self.lossf(self.net(self.x), self.y)
                loss_t.backward()
                loss = loss_t.item()
                if self.role == "shm":
                    self.shm_all_reduce()
            self.opt.step()
        out["wall_s"] = time.perf_counter() - wall0
        out["cpu_s"] = time.process_time() - cpu0  # all its threads (gloo's, feeders) too
        out["waited_s"] = None if self.peer is None else self.peer.waited_s
        out["loss"] = loss
        if self.role == "stage" and self.rank == 0:
            out["kept_max"] = kept
        return out

    def shm_all_reduce(self) -> None:
        """The gradients averaged over the ranks through shared memory: each rank writes
        its gradients to its row of this step's phase, waits for the other at the barrier,
        then sets its gradients to (row 0 + row 1) / 2 (the same sum on every rank, so the
        ranks stay equal bit for bit). Two phases, alternating: a rank writes a phase again
        two steps later, after the barrier of the step between, when the other rank has
        read it."""
        buf = self.shm[self.phase]
        self.phase ^= 1
        grads = [p.grad for p in self.model.parameters()]
        off = 0
        for g in grads:
            buf[self.rank, off : off + g.numel()].copy_(g.view(-1))
            off += g.numel()
        self.barrier.wait(call_timeout(1))
        off = 0
        for g in grads:
            n = g.numel()
            flat = g.view(-1)
            self.torch.add(buf[0, off : off + n], buf[1, off : off + n], out=flat)
            flat.mul_(0.5)
            off += n

    def accumulate(self, m: int) -> float:
        """One process's batch in ``m`` micro-batches, the gradients accumulated."""
        if self.role != "solo":
            raise ValueError(
                f"micro-batches in one process are the solo worker's, not {self.role}'s"
            )
        total = 0.0
        for xi, yi in zip(self.x.chunk(m), self.y.chunk(m), strict=True):
            loss = self.lossf(self.net(xi), yi) / m
            loss.backward()
            total += loss.item()
        return total

    def param_digest(self) -> str:
        return digest(self.params())

    def stage0_step(self, m: int) -> int:
        """Stage 0 of one batch in the 1F1B order: one forward ahead, then forward i and
        backward i-1 in turn, then the last backward. Returns the most micro-batches whose
        activations it held at once."""
        peer, mb = self.peer, BATCH // m
        wait = call_timeout(1)
        held: dict[int, Any] = {}
        kept = 0
        for i, xi in enumerate(self.x.chunk(m)):
            h = self.model(xi)
            held[i] = h
            kept = max(kept, len(held))
            peer.acts[i * mb : (i + 1) * mb].copy_(h.detach())
            peer.send(i)
            if i >= 1:
                j = peer.recv(wait)
                held.pop(j).backward(peer.grads[j * mb : (j + 1) * mb])
        j = peer.recv(wait)
        held.pop(j).backward(peer.grads[j * mb : (j + 1) * mb])
        return kept

    def stage1_step(self, m: int) -> float:
        """Stage 1 of one batch: per micro-batch, forward, loss / m, backward, the input's
        gradient sent back. Returns the batch's loss (the sum of the micro-batches' / m)."""
        peer, mb = self.peer, BATCH // m
        wait = call_timeout(1)
        total = 0.0
        ys = self.y.chunk(m)
        for _ in range(m):
            i = peer.recv(wait)
            a = peer.acts[i * mb : (i + 1) * mb].detach().requires_grad_()
            loss = self.lossf(self.model(a), ys[i]) / m
            loss.backward()
            peer.grads[i * mb : (i + 1) * mb].copy_(a.grad)
            peer.send(i)
            total += loss.item()
        return total


def worker_main(role: str, rank: int, conn, peer, cfg: dict) -> None:
    """A worker process: builds its trainer, says ``ready``, then serves commands
    (``reset``, ``run``, ``params``, ``stop``) until ``stop`` or until this process's end of
    the pipe closes. Every reply is ``("ok", value)`` or ``("error", traceback)``."""
    trainer = None
    try:
        import torch

        torch.set_num_threads(cfg["threads"])
        trainer = Trainer(torch, role, rank, cfg, peer)
        conn.send(("ok", {"pid": os.getpid(), "threads": torch.get_num_threads()}))
    except BaseException:  # noqa: BLE001 - sent to the parent, which raises it
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            try:
                cmd, *a = conn.recv()
            except EOFError:  # the parent is gone
                return
            try:
                if cmd == "stop":
                    conn.send(("ok", None))
                    return
                value = getattr(trainer, cmd)(*a)
                conn.send(("ok", value))
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
    finally:
        if trainer is not None and trainer.peer is not None:
            trainer.peer.close()
        if role == "ddp" and trainer is not None:
            try:
                trainer.dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - exiting anyway
                pass


# -- the workers (in this process) ---------------------------------------------------------


class Worker:
    """A kept worker process and the pipe to it."""

    def __init__(self, ctx, name: str, role: str, rank: int, cfg: dict, peer=None):
        self.name, self.info = name, None
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(
            target=worker_main, args=(role, rank, child, peer, cfg), name=name, daemon=True
        )
        self.proc.start()
        child.close()

    def send(self, *msg) -> None:
        try:
            self.conn.send(msg)
        except OSError as e:  # a broken pipe: the worker is gone
            self.proc.join(1)
            raise RuntimeError(
                f"worker {self.name!r} is gone (exit code {self.proc.exitcode}): {e}"
            ) from None

    def reply(self, timeout: float):
        if not self.conn.poll(timeout):
            self.proc.join(1)  # its pipe closes a moment before it can be reaped
            if not self.proc.is_alive():
                raise RuntimeError(f"worker {self.name!r} exited (exit code {self.proc.exitcode})")
            raise TimeoutError(f"worker {self.name!r}: no reply within {timeout:.0f} s")
        try:
            tag, value = self.conn.recv()
        except EOFError:
            self.proc.join(1)
            raise RuntimeError(
                f"worker {self.name!r} exited (exit code {self.proc.exitcode})"
            ) from None
        if tag == "error":
            raise RuntimeError(f"worker {self.name!r} failed:\n{value}")
        return value

    def close(self) -> None:
        """Asks the worker to stop, then terminates and kills it if it has not exited."""
        try:
            if self.proc.is_alive():
                self.conn.send(("stop",))
        except (OSError, ValueError):
            pass
        self.proc.join(JOIN_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join(JOIN_TIMEOUT_S)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(JOIN_TIMEOUT_S)
        self.conn.close()


class Group:
    """Workers that take every command together (the ranks or stages of one contender)."""

    def __init__(self, workers: list[Worker]):
        self.workers = workers

    def call(self, *msg, timeout: float) -> list:
        """Sends ``msg`` to every worker and returns their replies, in order; raises as soon
        as one fails or exits, or when ``timeout`` seconds pass."""
        from multiprocessing.connection import wait

        for w in self.workers:
            w.send(*msg)
        out: list = [None] * len(self.workers)
        pending = dict(enumerate(self.workers))
        deadline = time.monotonic() + timeout
        while pending:
            left = deadline - time.monotonic()
            ready = wait(
                [w.conn for w in pending.values()] + [w.proc.sentinel for w in pending.values()],
                timeout=max(left, 0.0),
            )
            if not ready:
                names = ", ".join(repr(w.name) for w in pending.values())
                raise TimeoutError(f"worker(s) {names}: no reply within {timeout:.0f} s")
            for i, w in list(pending.items()):
                if w.conn in ready or w.proc.sentinel in ready:
                    out[i] = w.reply(0)  # raises when it failed or exited
                    del pending[i]
        return out

    def close(self) -> None:
        for w in self.workers:
            w.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- contenders ----------------------------------------------------------------------------


@dataclass
class Context:
    """What every contender's maker gets: the arguments, the data and initial weights, the
    one-process reference (loss and parameters after K steps), and the place to register
    what must be closed at the end (``closers``, called even when the run fails)."""

    args: Any
    torch: Any
    X: np.ndarray
    Y: np.ndarray
    saved: dict
    mp: Any = None
    ref_loss: float | None = None
    ref_params: dict | None = None
    closers: list = field(default_factory=list)
    groups: dict = field(default_factory=dict)
    pids: list = field(default_factory=list)  # the workers' (their CPU is this benchmark's)

    def cfg(self, **extra) -> dict:
        return dict(X=self.X, Y=self.Y, saved=self.saved, threads=self.args.threads, **extra)

    def group(self, key: str, make: Callable[[], Group]) -> Group:
        """The group ``key``, started (and registered for closing) on first use, then
        shared by the contenders asking for it."""
        if key not in self.groups:
            self.groups[key] = make()  # start() registers it in closers
        return self.groups[key]


def start(ctx: Context, name: str, roles: list[tuple[str, int, Any]], **cfg) -> Group:
    """Starts the workers ``(role, rank, peer)`` of a group and waits until each is ready."""
    workers = []
    g = Group(workers)
    ctx.closers.append(g.close)  # closed even if a later worker fails to start
    for role, rank, peer in roles:
        workers.append(Worker(ctx.mp, f"{name} {rank}", role, rank, ctx.cfg(**cfg), peer))
    for w in workers:
        w.info = w.reply(START_TIMEOUT_S)
        ctx.pids.append(w.info["pid"])
    return g


def contender(name: str, run: Callable[[], dict], reset: Callable[[], Any], **kw):
    """A ``harness.Contender`` whose ``setup`` is ``reset`` and whose ``fn`` is ``run``,
    where a failed reset (a worker gone) is raised by ``fn``, so the harness records it as
    the contender's error instead of stopping the benchmark."""
    failed: list[Exception] = []

    def setup() -> None:
        failed.clear()
        try:
            reset()
        except Exception as e:  # noqa: BLE001 - raised again by fn, inside the harness
            failed.append(e)

    def fn() -> dict:
        if failed:
            raise RuntimeError(f"reset before the run failed: {failed[0]}") from failed[0]
        return run()

    return harness.Contender(name, fn, None, setup=setup, **kw)


def loss_check(name: str, ctx: Context, ranks_equal: bool = False):
    """The check of every run: the last loss finite and one process's within LOSS_RTOL;
    with ``ranks_equal``, the ranks' parameter digests the same."""

    def check(out: dict, _ref) -> str | None:
        loss = out["loss"]
        if not isinstance(loss, float) or not math.isfinite(loss):
            return f"{name}: loss after {ctx.args.steps} steps is {loss!r}, not a finite float"
        if ctx.ref_loss is not None and abs(loss - ctx.ref_loss) > LOSS_RTOL * abs(ctx.ref_loss):
            return (
                f"{name}: loss after {ctx.args.steps} steps {loss!r} != one process's "
                f"{ctx.ref_loss!r} within {LOSS_RTOL} relative (not the same training)"
            )
        if ranks_equal and len(set(out["digests"])) != 1:
            return f"{name}: the ranks' parameters differ (digests {out['digests']})"
        return None

    return check


def solo_group(ctx: Context) -> Group:
    return ctx.group("solo", lambda: start(ctx, "solo", [("solo", 0, None)]))


def one_process(ctx: Context, threads: int, micro: int = 1) -> harness.Contender:
    """PyTorch in one worker process on the whole batch with ``threads`` threads; with
    ``micro`` > 1, the batch in that many micro-batches, their gradients accumulated (the
    pipeline's work without the pipeline: what the micro-batches alone cost)."""
    g, k = solo_group(ctx), ctx.args.steps

    def run() -> dict:
        (r,) = g.call("run", k, threads, micro, timeout=call_timeout(k))
        return r

    if micro > 1:
        name, fields = f"pytorch, one process, m={micro}", dict(micro_batches=micro)
        note = (
            f"diagnostic: one process, {micro} micro-batches of {BATCH // micro}, gradients "
            f"accumulated, {threads} thread(s)"
        )
    else:
        name = f"pytorch, one process{'' if threads == ctx.args.threads else ', 2x threads'}"
        fields, note = {}, f"torch.nn + torch.optim.SGD on the whole batch, {threads} thread(s)"
    c = contender(
        name,
        run,
        lambda: g.call("reset", timeout=call_timeout(0)),
        ranks=1,
        threads_per_rank=threads,
        **fields,
        note=note,
    )
    c.check = loss_check(c.name, ctx)
    c.params = lambda: [g.call("params", timeout=call_timeout(0))[0]]
    return c


def data_parallel(ctx: Context, kind: str) -> harness.Contender:
    """Data parallelism over 2 worker processes, each the half of the batch: ``kind``
    "ddp" is PyTorch DDP on gloo; "shm" the hand-written all-reduce through shared memory."""
    k = ctx.args.steps

    def make() -> Group:
        if kind == "ddp":
            return start(
                ctx, "ddp rank", [("ddp", r, None) for r in range(RANKS)], port=free_port()
            )
        n = sum(v.size for v in ctx.saved.values())
        shm = (ctx.torch.zeros(2, RANKS, n).share_memory_(), ctx.mp.Barrier(RANKS))
        return start(ctx, "shm rank", [("shm", r, shm) for r in range(RANKS)])

    g = ctx.group(kind, make)
    last: dict = {}

    def run() -> dict:
        rs = g.call("run", k, timeout=call_timeout(k))
        last.update(rank_cpu_s_per_step=[r["cpu_s"] / k for r in rs])
        return {"loss": sum(r["loss"] for r in rs) / len(rs)}

    def fetch(out: dict) -> dict:  # after the clock: each rank's parameter digest
        return {**out, "digests": g.call("param_digest", timeout=call_timeout(0))}

    if kind == "ddp":
        name = f"pytorch DDP gloo, {RANKS} ranks"
        note = (
            f"DistributedDataParallel, gloo over TCP 127.0.0.1, batch {BATCH // RANKS} per "
            f"rank, default buckets; a barrier starts each run"
        )
    else:
        name = f"pytorch, shared-memory all-reduce, {RANKS} ranks"
        note = (
            f"hand-written: after backward each rank writes its gradients to shared memory, "
            f"a Barrier, then each takes the mean; batch {BATCH // RANKS} per rank"
        )
    c = contender(
        name,
        run,
        lambda: g.call("reset", timeout=call_timeout(0)),
        fetch=fetch,
        after=lambda: dict(last),
        ranks=RANKS,
        threads_per_rank=ctx.args.threads,
        note=note,
    )
    c.check = loss_check(c.name, ctx, ranks_equal=True)
    c.params = lambda: g.call("params", timeout=call_timeout(0))
    return c


def pipeline_group(ctx: Context) -> Group:
    def make() -> Group:
        torch = ctx.torch
        fwd, bwd = ctx.mp.Queue(), ctx.mp.Queue()  # stage 0 -> 1, stage 1 -> 0
        acts = torch.zeros(BATCH, HIDDEN).share_memory_()
        grads = torch.zeros(BATCH, HIDDEN).share_memory_()
        return start(
            ctx,
            "stage",
            [("stage", 0, (fwd, bwd, acts, grads)), ("stage", 1, (bwd, fwd, acts, grads))],
        )

    return ctx.group("pipeline", make)


def pipeline(ctx: Context, m: int) -> harness.Contender:
    """The hand-written 2-stage pipeline with ``m`` micro-batches, 1F1B order."""
    g, k = pipeline_group(ctx), ctx.args.steps

    last: dict = {}

    def run() -> dict:
        s0, s1 = g.call("run", k, None, m, timeout=call_timeout(k))
        kept = max(c.extra.get("stage0_kept_max", 0), s0["kept_max"])
        c.extra["stage0_kept_max"] = kept
        last.update(
            stage_waited_fraction=[s["waited_s"] / s["wall_s"] for s in (s0, s1)],
            stage_cpu_s_per_step=[s["cpu_s"] / k for s in (s0, s1)],
        )
        return {"loss": s1["loss"]}

    c = contender(
        f"pytorch pipeline, {RANKS} stages, m={m}",
        run,
        lambda: g.call("reset", timeout=call_timeout(0)),
        ranks=RANKS,
        threads_per_rank=ctx.args.threads,
        micro_batches=m,
        after=lambda: dict(last),
        note=f"2 processes, shared-memory buffers and a queue each way, 1F1B, micro-batch "
        f"{BATCH // m}",
    )
    c.check = loss_check(c.name, ctx)

    def params() -> list:
        s0, s1 = g.call("params", timeout=call_timeout(0))
        return [{**s0, **s1}]

    c.params = params
    return c


# -- actorflow's rows ------------------------------------------------------------------------


def _af():
    import actorflow as af

    return af


def _af_model(ctx: Context, af):
    """The MLP in actorflow with the saved initial weights (the same names as torch's)."""
    nn = af.nn
    m = nn.Sequential(
        nn.Linear(IN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )
    m.load_state_dict({k: af.tensor(v) for k, v in ctx.saved.items()})
    return m


def _af_reset(ctx: Context, af, model, opt) -> None:
    """The saved weights copied into the parameters in place, the momentum buffers zeroed
    (SGD's first step from a zero buffer is its first step without one)."""
    model.load_state_dict({k: af.tensor(v) for k, v in ctx.saved.items()})
    with af.no_grad():
        for st in opt.state.values():
            buf = st.get("momentum_buffer")
            if buf is not None:
                buf.zero_()


def _af_params(model, ranks: int | None = None) -> list:
    """Each rank's parameters (name -> array): the model's own for a local one."""
    sd = model.state_dict()
    if ranks is None:
        return [{k: v.numpy() for k, v in sd.items()}]
    return [{k: v.to_local(rank=r).numpy() for k, v in sd.items()} for r in range(ranks)]


def _af_step_graph(af, model, opt):
    class Step(af.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model, self.loss = model, af.nn.CrossEntropyLoss()
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = self.loss(self.model(x), y)
            loss.backward()
            return loss

    return Step()


def actorflow_one_process(ctx: Context) -> harness.Contender:
    """actorflow's compiled step (``nn.Graph.step``) on the whole batch in this process."""
    af = _af()
    model = _af_model(ctx, af)
    opt = af.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    step = _af_step_graph(af, model, opt)
    k = ctx.args.steps

    def run() -> dict:
        out = None
        for _ in range(k):
            out = step.step(ctx.X, ctx.Y)
        return {"loss": float(out)}

    def reset() -> None:
        _af_reset(ctx, af, model, opt)

    reset()
    step.step(ctx.X, ctx.Y)  # (compiled outside the clock; reset again before each run)
    c = contender(
        "actorflow, one process (nn.Graph)",
        run,
        reset,
        ranks=1,
        threads_per_rank=ctx.args.threads,
        note="nn.Graph.step, the compiled step, on the whole batch in this process",
    )
    c.check = loss_check(c.name, ctx)
    c.params = lambda: _af_params(model)
    return c


def actorflow_data_parallel(ctx: Context, mode: str) -> harness.Contender:
    """actorflow's data parallelism: the model global (broadcast) on ``RANKS`` process
    ranks, each batch split at S(0); ``mode`` "graph" is ``nn.Graph.step`` over global
    parameters, "eager" the eager loop (forward, backward, ``opt.step()``)."""
    af = _af()
    af.parallel.use_ranks("processes")
    p = af.placement("cpu", RANKS)
    model = _af_model(ctx, af).to_global(p)
    opt = af.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    ranks = af.parallel.ranks_of(p)
    ctx.closers.append(ranks.close)
    s0 = af.sbp.split(0)
    x = af.tensor(ctx.X).to_global(p, s0)
    y = af.tensor(ctx.Y).to_global(p, s0)
    k = ctx.args.steps
    if mode == "graph":
        step = _af_step_graph(af, model, opt)

        def one():
            return step.step(x, y)
    else:
        loss_fn = af.nn.CrossEntropyLoss()

        def one():
            loss = loss_fn(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return loss

    def run() -> dict:
        out = None
        for _ in range(k):
            out = one()
        return {"loss": out.item()}

    def reset() -> None:
        _af_reset(ctx, af, model, opt)
        ranks.synchronize()

    reset()
    one()  # (the workers started, the decisions made, outside the clock)
    ctx.pids.extend(ranks.pids)
    how = "nn.Graph" if mode == "graph" else "eager"
    name = f"actorflow data parallel, {RANKS} process ranks ({how})"
    c = contender(
        name,
        run,
        reset,
        fetch=lambda out: {**out, "digests": [digest(q) for q in _af_params(model, RANKS)]},
        ranks=RANKS,
        threads_per_rank=ctx.args.threads,
        note=(
            f"model.to_global(placement('cpu', {RANKS})), batch at S(0) ({BATCH // RANKS} per "
            f"rank), use_ranks('processes'); the gradients' P -> B all-reduce through shared "
            f"memory; "
            + (
                "the step replayed by each worker from its step program once recorded"
                if mode == "graph"
                else "every op an eager global call"
            )
        ),
    )
    c.check = loss_check(c.name, ctx, ranks_equal=True)
    c.params = lambda: _af_params(model, RANKS)
    return c


def actorflow_pipeline(
    ctx: Context, m: int, ranks: str | None = None, in_workers: bool = False
) -> harness.Contender:
    """actorflow's pipeline graph, 2 stages, ``m`` micro-batches: on threads of this
    process, or with ``ranks="processes"`` each stage in a worker process of its own
    (``stage_ranks``: each stage global on a one-rank placement; the stage threads here
    only put, ask and wait); ``in_workers``: the loss given as ``loss=`` (no ``build``),
    so the workers run each batch among themselves."""
    af = _af()
    nn = af.nn
    full = _af_model(ctx, af)
    stages = [nn.Sequential(full[0], full[1]), nn.Sequential(full[2], full[3], full[4])]
    opt = af.optim.SGD(full.parameters(), lr=LR, momentum=MOMENTUM)

    class Pipe(nn.Graph):
        def __init__(self):
            super().__init__(stages=stages, micro_batches=m, stage_ranks=ranks)
            self.loss = nn.CrossEntropyLoss()
            self.add_optimizer(opt)

        def build(self, out, y):
            return self.loss(out, y)

    class InWorkers(nn.Graph):
        def __init__(self):
            super().__init__(
                stages=stages, micro_batches=m, stage_ranks=ranks, loss=nn.CrossEntropyLoss()
            )
            self.add_optimizer(opt)

    g = InWorkers() if in_workers else Pipe()
    held = [r for r in g.pipelined.ranks if r is not None]  # (every m's rows share them)
    ctx.closers.extend(r.close for r in held)
    k = ctx.args.steps

    def run() -> dict:
        out = None
        for _ in range(k):
            out = g.step(ctx.X, ctx.Y)
        c.extra["stage0_kept_max"] = max(
            c.extra.get("stage0_kept_max", 0), g.pipelined.peak_held[0]
        )
        return {"loss": float(out)}

    def reset() -> None:
        _af_reset(ctx, af, full, opt)
        for r in held:
            r.synchronize()

    def after() -> dict:
        p = g.pipelined
        return {
            "stage_peak_held": list(p.peak_held),
            "stage_registers": list(p.buffers),
            "stage_peak_saved_bytes": list(p.peak_saved_bytes),
            "stage_peak_weights_held": list(p.peak_weights_held),
            "stage_peak_weights_bytes": list(p.peak_weights_bytes),
        }

    reset()
    g.step(ctx.X, ctx.Y)  # (its graph made, the workers warm, outside the clock)
    for r in held:
        ctx.pids.extend(r.pids)
    where = " on process ranks" if ranks else ""
    if in_workers:
        where = ", stages in workers run the batch (loss=)"
    c = contender(
        f"actorflow pipeline{where}, 2 stages, m={m}",
        run,
        reset,
        ranks=2,
        threads_per_rank=ctx.args.threads,
        micro_batches=m,
        after=after,
        note=(
            f"nn.Graph(stages=[...], micro_batches={m}"
            + (
                f", stage_ranks={ranks!r}, loss=nn.CrossEntropyLoss()): each stage in a "
                f"worker process; each batch one command per worker, the activations and "
                f"gradients passed worker to worker through shared memory, 1F1B from the "
                f"registers' credits in each worker"
                if in_workers
                else f", stage_ranks={ranks!r}): each stage in a worker process (a one-rank "
                f"placement of its own), each act one command there; the activations and "
                f"gradients through this process (a copy each way per micro-batch)"
                if ranks
                else "): a forward and a backward actor per stage (threads of this "
                "process), 1F1B from the registers' credits"
            )
        ),
    )
    c.check = loss_check(c.name, ctx)
    c.params = lambda: _af_params(full)
    return c


@dataclass
class Row:
    """A contender of the benchmark: ``part`` is "data" (part 1) or "pipeline" (part 2);
    ``make(ctx)`` returns its ``harness.Contender`` (None: not available here, skipped with
    ``why``), whose ``fn()`` runs K steps from the state its ``setup()`` resets to and
    returns a dict with the last step's ``loss``; a ``params()`` attribute, when it has one,
    returns each rank's parameters (name -> numpy array, the full model's names) for the
    check against one process."""

    part: str
    make: Callable[[Context], harness.Contender | None]
    why: str = ""


ROWS: list[Row] = [
    # the first row is the reference: every speedup is against it, every parameter check too
    Row("data", lambda ctx: one_process(ctx, ctx.args.threads)),
    Row("data", lambda ctx: one_process(ctx, RANKS * ctx.args.threads)),
    Row("data", lambda ctx: data_parallel(ctx, "ddp")),
    Row("data", lambda ctx: data_parallel(ctx, "shm")),
    *(
        Row("pipeline", lambda ctx, m=m: pipeline(ctx, m) if m in ctx.args.micro else None)
        for m in MICRO
    ),
    *(
        Row(
            "pipeline",
            lambda ctx, m=m: (
                None
                if ctx.args.no_diagnostics or m not in ctx.args.micro
                else one_process(ctx, ctx.args.threads, m)
            ),
        )
        for m in MICRO
        if m > 1
    ),
    # actorflow's rows: this process is the controller (its ranks are worker processes, or
    # threads of this process for the pipeline's stages)
    Row("data", lambda ctx: actorflow_one_process(ctx)),
    Row("data", lambda ctx: actorflow_data_parallel(ctx, "graph")),
    Row("data", lambda ctx: actorflow_data_parallel(ctx, "eager")),
    *(
        Row(
            "pipeline", lambda ctx, m=m: actorflow_pipeline(ctx, m) if m in ctx.args.micro else None
        )
        for m in MICRO
    ),
    *(
        Row(
            "pipeline",
            lambda ctx, m=m: (
                actorflow_pipeline(ctx, m, "processes") if m in ctx.args.micro else None
            ),
        )
        for m in MICRO
    ),
    *(
        Row(
            "pipeline",
            lambda ctx, m=m: (
                actorflow_pipeline(ctx, m, "processes", in_workers=True)
                if m in ctx.args.micro
                else None
            ),
        )
        for m in MICRO
    ),
    # more rows go here, appended to this list, e.g.
    #   Row("data", actorflow_data_parallel),      # nn.Graph.run, batch at S(0) over 2 ranks
    #   *(Row("pipeline", lambda ctx, m=m: actorflow_pipeline(ctx, m)) for m in MICRO),
    # each maker returning a harness.Contender built as one_process/data_parallel/pipeline
    # build theirs
    # (setup resets to ctx.saved, fn runs ctx.args.steps steps and returns {"loss": ...},
    # c.check = loss_check(c.name, ctx), c.params for the parameter check), with the fields
    # ranks=, threads_per_rank= and (pipeline) micro_batches=; its processes' shutdown
    # registered in ctx.closers and their pids in ctx.pids. The tables, speedups, goals and
    # checks then cover them as they cover PyTorch's.
]


# -- checks and report ---------------------------------------------------------------------


def compare_params(ps: dict, ref: dict) -> tuple[float, bool]:
    """The largest absolute difference and whether every tensor is allclose to ``ref``."""
    if set(ps) != set(ref):
        raise ValueError(f"parameter names {sorted(ps)} != one process's {sorted(ref)}")
    worst, close = 0.0, True
    for k, r in ref.items():
        a = ps[k]
        if a.shape != r.shape:
            raise ValueError(f"parameter {k}: shape {a.shape} != one process's {r.shape}")
        worst = max(worst, float(np.max(np.abs(a - r))))
        close = close and bool(np.allclose(a, r, rtol=PARAM_RTOL, atol=PARAM_ATOL))
    return worst, close


def check_params(ctx: Context, c: harness.Contender) -> None:
    """Once, outside the clock: K steps from the initial weights, then every rank's
    parameters against one process's (and bit for bit across ranks)."""
    params = getattr(c, "params", None)
    if params is None:
        c.extra["params_check"] = "none (the contender has no params())"
        return
    try:
        if c.setup:
            c.setup()
        c.fn()
        ps = params()
        diffs = [compare_params(p, ctx.ref_params) for p in ps]
    except Exception as e:  # noqa: BLE001 - recorded as the contender's error
        c.errors.append(f"parameter check: {type(e).__name__}: {e}")
        traceback.print_exc()
        return
    worst = max(d for d, _ in diffs)
    close = all(ok for _, ok in diffs)
    c.extra["params_max_abs_diff_vs_one_process"] = worst
    c.extra["params_allclose_vs_one_process"] = close
    if len(ps) > 1:
        same = len({digest(p) for p in ps}) == 1
        c.extra["ranks_params_bit_equal"] = same
        if not same:
            c.check_failures.append(
                f"after {ctx.args.steps} steps the ranks' parameters differ (not bit for bit)"
            )
    if not close:
        c.check_failures.append(
            f"after {ctx.args.steps} steps the parameters differ from one process's on the "
            f"full batch by up to {worst:.3g} (rtol {PARAM_RTOL}, atol {PARAM_ATOL})"
        )


class WorkerContention(harness.CpuContention):
    """``harness.CpuContention`` that counts the worker processes' CPU time as this
    benchmark's own (read from /proc/<pid>/stat), not as other processes'."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        super().__init__()

    def _sample(self):  # type: ignore[override]
        t = harness.CpuContention._sample()
        if t is None:
            return None
        total, busy, own, wall = t
        hz = os.sysconf("SC_CLK_TCK")
        for pid in self.pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                own += (int(fields[11]) + int(fields[12])) / hz  # utime, stime
            except (OSError, IndexError, ValueError):
                return None
        return total, busy, own, wall


def bubble(m: int, k: int = RANKS) -> float:
    """GPipe's bubble fraction for ``k`` stages and ``m`` micro-batches."""
    return (k - 1) / (m + k - 1)


def pipeline_weight_slots(n: int) -> str:
    """The registers of each stage's weights actor where the workers run the batch: none
    for stage 0 (its input gets no gradient: its backward is its weights' part)."""
    from actorflow.nn.pipeline_links import WEIGHT_SLOTS

    return " / ".join(["0"] + [str(WEIGHT_SLOTS)] * (n - 1))


def verdict(met) -> str:
    return {True: "MET", False: "NOT MET"}.get(met, "not measured")


def environment(torch, pinned: dict) -> dict:
    return harness.environment(
        libraries={
            "torch": getattr(torch, "__version__", None),
            "torch_gloo_available": torch.distributed.is_available()
            and torch.distributed.is_gloo_available(),
            **pinned,
        },
        runtime={"graph_event_loop": harness.graph_event_loop()},
    )


def parse_micro(text: str) -> tuple[int, ...]:
    try:
        ms = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise SystemExit(f"--micro {text!r}: expected numbers separated by commas") from None
    bad = [m for m in ms if m not in MICRO]
    if bad:
        raise SystemExit(f"--micro {text!r}: {bad} not among the pipeline rows' m {MICRO}")
    return ms


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "3 steps per run, best of 3 (~30 s)")
    p.add_sized("--steps", 20, 3, "training steps per timed run (default {full}, quick {quick})")
    p.add_repeat(5, 3)
    p.add_argument(
        "--micro",
        type=parse_micro,
        default=MICRO,
        help=f"micro-batch counts of the pipeline rows, among {MICRO} (default: all)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="threads per rank for every contender (the reference row: 2x): "
        "OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS set before numpy loads (the "
        "benchmark restarts itself with them) and torch.set_num_threads in every worker; "
        "default 1 (one core per rank on a 2-core machine)",
    )
    p.add_argument(
        "--no-diagnostics",
        action="store_true",
        help="skip the diagnostic rows (one process with the pipeline's micro-batches)",
    )
    p.add_out("bench_parallel")
    args = p.parse_args(argv)
    if args.steps < 1 or args.repeat < 1 or args.threads < 1:
        p.error("--steps, --repeat and --threads must be >= 1")
    pinned = harness.pin_threads(args.threads, argv)

    t_start = time.perf_counter()
    torch = harness.try_import("torch")
    if torch is None:
        print("[parallel] torch is not installed: no PyTorch rows; nothing to run", flush=True)
        return 1
    import torch.multiprocessing as tmp

    print(f"[parallel] threads: {pinned['threads_note']} (per rank)", flush=True)
    torch.manual_seed(SEED)
    saved = {k: v.numpy().copy() for k, v in build_mlp(torch).state_dict().items()}
    rng = np.random.default_rng(SEED)
    X = rng.standard_normal((BATCH, IN), dtype=np.float32)
    Y = rng.integers(0, CLASSES, BATCH).astype(np.int64)
    ctx = Context(args, torch, X, Y, saved, mp=tmp.get_context("spawn"))
    k = args.steps

    contenders: list[harness.Contender] = []
    skipped: dict[str, str] = {}
    try:
        print("[parallel] starting the worker processes ...", flush=True)
        for row in ROWS:
            c = row.make(ctx)
            if c is None:
                if row.why:
                    skipped[row.part] = row.why
                continue
            c.fields = {"part": row.part, **c.fields}
            contenders.append(c)
        base = contenders[0]

        # The reference, once, outside the clock: one process, K steps from the weights.
        base.setup()
        r = base.fn()
        ctx.ref_loss = r["loss"]
        ctx.ref_params = base.params()[0]
        print(
            f"[parallel] one process after {k} steps: loss {ctx.ref_loss:.6f}; checking every "
            f"contender's parameters against it ...",
            flush=True,
        )
        for c in contenders:
            check_params(ctx, c)

        cc = WorkerContention(ctx.pids)
        harness.run_rounds(contenders, args.repeat, f"steps x{k}")
        contention = cc.result()
    finally:
        for close in reversed(ctx.closers):
            try:
                close()
            except Exception:  # noqa: BLE001 - closing the rest anyway
                traceback.print_exc()

    rows = {}
    for c in contenders:
        s = rows[c.name] = c.summary(per=k, unit="step")
        if isinstance(c.best_after(), dict):
            s.update(c.best_after())  # e.g. the stages' waits in the best run
    b = rows[base.name]
    same_m = {
        s["micro_batches"]: s
        for s in rows.values()
        if s["part"] == "pipeline" and s["ranks"] == 1 and s.get("best_s")
    }
    for s in rows.values():
        if b.get("best_s") and s.get("best_s"):
            s["speedup_vs_one_process"] = b["best_s"] / s["best_s"]
            s["median_speedup_vs_one_process"] = b["median_s"] / s["median_s"]
        sp = s.get("speedup_vs_one_process")
        if s["part"] == "pipeline" and s["ranks"] > 1:
            m = s["micro_batches"]
            s["bubble_gpipe"] = bubble(m)
            s["ideal_speedup_gpipe"] = RANKS * (1 - bubble(m))
            s["idle_fraction_measured"] = None if sp is None else 1 - sp / RANKS
            one_m = same_m.get(m)
            if one_m and s.get("best_s"):
                s["speedup_vs_one_process_same_m"] = one_m["best_s"] / s["best_s"]
        if s["ranks"] > 1 and sp is not None:
            goal = DATA_PARALLEL_GOAL if s["part"] == "data" else PIPELINE_GOAL
            s["goal_speedup_at_least"] = goal
            s["goal_met"] = sp >= goal
    data = {n: s for n, s in rows.items() if s["part"] == "data"}
    pipe = {n: s for n, s in rows.items() if s["part"] == "pipeline"}
    theory = [
        {"m": m, "bubble": bubble(m), "ideal_speedup": RANKS * (1 - bubble(m))} for m in MICRO
    ]

    # -- report ----------------------------------------------------------------------------
    env = environment(torch, pinned)
    Col = harness.Column
    width = max(map(len, rows), default=10) + 1
    print()
    print(
        f"MLP {IN}-{HIDDEN}-{HIDDEN}-{CLASSES}, batch {BATCH}, SGD momentum {MOMENTUM}, "
        f"{args.threads} thread(s) per rank ({k} steps per run, best of {args.repeat})"
    )
    print("Part 1: data parallelism over 2 ranks")
    cols = [
        Col("best ms/step", 14, "best_us_per_step", ".2f", 1e-3),
        Col("median ms/step", 16, "median_us_per_step", ".2f", 1e-3),
        Col("speedup", 9, "speedup_vs_one_process", ".2f", suffix="x"),
        Col("goal", 7, "goal_speedup_at_least", ".1f", suffix="x"),
        Col("max |dp|", 10, "params_max_abs_diff_vs_one_process", ".1e"),
    ]
    harness.print_table(data, cols, width, notes=True)
    for n, s in data.items():
        if "goal_met" in s:
            print(
                f"  {n}: {s['speedup_vs_one_process']:.2f}x one process (goal >= "
                f"{DATA_PARALLEL_GOAL}x for actorflow's data-parallel rows: "
                f"{verdict(s['goal_met'])})"
                + (
                    f"; ranks' parameters bit-equal: {s['ranks_params_bit_equal']}"
                    if "ranks_params_bit_equal" in s
                    else ""
                )
                + (
                    "; CPU per step by rank (best run): "
                    + " / ".join(f"{v * 1e3:.1f} ms" for v in s["rank_cpu_s_per_step"])
                    if s.get("rank_cpu_s_per_step")
                    else ""
                )
            )
    print()
    print(f"Part 2: pipeline parallelism, k={RANKS} stages")
    print("  GPipe's bubble fraction (k-1)/(m+k-1) and the ideal speedup k m/(m+k-1):")
    print("    " + "".join(f"{'m=' + str(t['m']):>9}" for t in theory))
    print("    " + "".join(f"{t['bubble']:>9.3f}" for t in theory) + "  bubble")
    print("    " + "".join(f"{t['ideal_speedup']:>8.2f}x" for t in theory) + "  ideal speedup")
    if pipe:
        harness.print_table(
            pipe,
            [
                Col("best ms/step", 14, "best_us_per_step", ".2f", 1e-3),
                Col("speedup", 9, "speedup_vs_one_process", ".2f", suffix="x"),
                Col("vs same m", 11, "speedup_vs_one_process_same_m", ".2f", suffix="x"),
                Col("ideal", 8, "ideal_speedup_gpipe", ".2f", suffix="x"),
                Col("bubble", 8, "bubble_gpipe", ".3f"),
                Col("idle", 8, "idle_fraction_measured", ".3f"),
                Col("kept", 6, "stage0_kept_max"),
                Col("max |dp|", 10, "params_max_abs_diff_vs_one_process", ".1e"),
            ],
            width,
        )
        print(
            "  (speedup: vs one process's best; vs same m: vs one process running the same "
            "micro-batches;\n   ideal and bubble: GPipe's; idle = 1 - speedup/k; kept: stage 0's "
            "most micro-batches held for backward)"
        )
        for n, s in pipe.items():
            if s.get("stage_peak_held"):
                held, regs = s["stage_peak_held"], s["stage_registers"]
                saved = s["stage_peak_saved_bytes"]
                print(
                    f"  {n} (best run): micro-batches held for backward "
                    f"{' / '.join(map(str, held))} (registers {' / '.join(map(str, regs))}), "
                    f"peak saved {' / '.join(f'{b / 2**20:.1f}' for b in saved)} MiB"
                )
            if any(s.get("stage_peak_weights_held") or ()):  # (the workers' weights actors)
                wh, wb = s["stage_peak_weights_held"], s["stage_peak_weights_bytes"]
                print(
                    f"  {n} (best run): weights parts waiting at most {' / '.join(map(str, wh))} "
                    f"(registers {pipeline_weight_slots(len(wh))}), holding "
                    f"{' / '.join(f'{b / 2**20:.2f}' for b in wb)} MiB"
                )
            if s.get("stage_waited_fraction"):
                w0, w1 = s["stage_waited_fraction"]
                c0, c1 = s["stage_cpu_s_per_step"]
                print(
                    f"  {n} (best run): stages waiting {w0:.0%} / {w1:.0%} of the run, CPU "
                    f"{c0 * 1e3:.1f} / {c1 * 1e3:.1f} ms per step"
                )
        staged = [s for s in pipe.values() if s["ranks"] > 1]
        if staged:
            best = max(staged, key=lambda s: s.get("speedup_vs_one_process") or 0)
            print(
                f"  best pipeline row: "
                f"{harness.fmt(best.get('speedup_vs_one_process'), '.2f')}x (goal >= "
                f"{PIPELINE_GOAL}x for actorflow's pipeline rows: "
                f"{verdict(best.get('goal_met'))})"
            )
    for part, why in skipped.items():
        print(f"  ({part}: {why})")
    harness.print_contention(contention)
    print(
        f"env: {env['cpu_count']} CPUs, python {env['python']}, numpy {env['numpy']}, torch "
        f"{env['torch']}, {pinned['threads_note']}"
    )

    result = harness.document(
        "bench_parallel",
        argv,
        args.quick,
        "once, outside the clock: each contender's parameters after K steps from the shared "
        f"weights equal one process's on the full batch (rtol {PARAM_RTOL}, atol "
        f"{PARAM_ATOL}), data-parallel ranks' bit for bit; every run: the last loss finite "
        f"and one process's within {LOSS_RTOL} relative, data-parallel ranks' parameter "
        "digests equal",
        steps=k,
        repeat=args.repeat,
        micro=list(args.micro),
        threads_per_rank=args.threads,
        model=f"Linear({IN},{HIDDEN}) ReLU Linear({HIDDEN},{HIDDEN}) ReLU "
        f"Linear({HIDDEN},{CLASSES}), CrossEntropyLoss, SGD(lr={LR}, momentum={MOMENTUM}), "
        f"batch {BATCH}, float32; pipeline stages: modules [0, {STAGE_CUT}) and "
        f"[{STAGE_CUT}, 5)",
    )
    result.update(
        {
            "reference_loss_after_k_steps": ctx.ref_loss,
            "part1_data_parallel": {"contenders": data},
            "part2_pipeline": {"contenders": pipe, "gpipe_bubble": theory, "stages": RANKS},
            "goals": {
                "data_parallel_speedup_at_least": DATA_PARALLEL_GOAL,
                "pipeline_speedup_at_least": PIPELINE_GOAL,
                "note": "the goals are actorflow's; PyTorch's rows are measured against them "
                "as information",
            },
            "cpu_contention": contention,
        }
    )
    return harness.finish(
        args.out, result, contenders, t_start, env, "computed wrong losses or parameters"
    )


if __name__ == "__main__":
    sys.exit(main())
