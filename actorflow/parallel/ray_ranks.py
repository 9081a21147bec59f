"""Ray ranks: each rank of a placement a Ray actor (``af.parallel.use_ranks("ray")``), on this
machine's local Ray cluster or spread over the nodes of a cluster the program joined.

The controller's side is the one process ranks have (``ranks.HeldRanks``): ``Part``
handles here with ids and local metas worked out here, commands kept per rank and sent
in batches without waiting, parts collected here dropped there, errors kept on the parts
a rank could not make and raised (the same type, the same words) when they are read. Only
the transport differs:

- a batch is one call of the rank's actor (``RankActor.run``), which runs its commands
  with the actor's own eager runtime through ``workers.Executor`` (what a worker process
  runs too). Ray runs the calls of one caller on one actor in the order they were made;
- a call returns one Ray object per command answered: the part a ``SEND`` hands another
  rank, and the answers of ``GET``, ``META`` and ``PING``. A move is the source's
  ``SEND`` in one call and the destination's ``RECV`` in a later call given that object's
  ref, which the destination reads (``ray.get``, with a timeout) from Ray's object store:
  shared memory between the actors of one node, Ray's transfer between nodes. A batch is
  sent up to its first ``RECV`` whose part is not sent yet (so every wait points to a call
  made before it: nothing waits in a circle), and a part sent to several ranks at once is
  sent once;
- a put of a large tensor is ``ray.put`` once for every rank it goes to; a small one goes
  inside the call;
- a Ray actor that died (``ray.kill``, its process killed, its node lost), or that could
  not load a batch (an op pickled by reference to a module it cannot import), is an
  ``ActorError`` naming the placement and the rank at the next answer awaited (every
  ``ray.get`` has a timeout), and the placement's other actors are killed; the next use of
  the placement starts new ones. ``close()`` kills the actors.

Ray is imported only when a placement first runs on Ray ranks. Where no Ray is running,
a local cluster is started (``ray.init``) whose workers import what this process can.
"""

from __future__ import annotations

import os
import pickle
import sys
import weakref
from typing import Any

import numpy as np

from ..device import device
from ..eager.interpreter import read, transfer
from ..errors import DeviceError
from ..runtime.sched.processes import WorkerDied
from ..sbp import Placement
from ..tensor.meta import contiguous_meta
from . import workers as W
from .ranks import _COPY, BATCH, NO_ATTRS, HeldRanks, _nbytes, _pickled

START_S = 60.0  # how long the actors of a placement may take to start
FLUSH_BYTES = 8 << 20  # bytes of work (outputs, moves, puts) kept before they are sent
# Ray options of the ranks' actors: spread over the cluster's nodes (on one node: processes
# there); RayRanks(options=...) adds to them (num_cpus, resources, a node's affinity)
ACTOR_OPTIONS: dict = {"scheduling_strategy": "SPREAD"}
ANSWERED = (W.SEND, W.GET, W.META, W.PING)  # the commands whose call returns an object


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            "af.parallel.use_ranks('ray'): Ray ranks need Ray: pip install 'actorflow[ray]' "
            "(or run the ranks as processes on this machine: use_ranks('processes'))"
        ) from None
    return ray


class RankActor:
    """What runs in each rank's Ray actor: its parts and the commands of each call, run in
    order by a ``workers.Executor`` (errors kept on the parts they could not make)."""

    def __init__(self, rank: int, threads: int | None) -> None:
        W.limit_threads(threads)
        self.rank = rank
        self.ex = W.Executor(threads)
        self.broken: str | None = None  # why, once a batch could not be loaded

    def ready(self) -> tuple:
        import ray

        if self.broken is not None:
            raise RuntimeError(self.broken)
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(self, data: bytes, refs: list) -> Any:
        """Runs a batch of commands (pickled; ``refs``: the Ray objects its ``PUT``s and
        ``RECV``s read, by index); returns ``[None, answer, ...]``, an answer per
        ``SEND``, ``GET``, ``META`` and ``PING`` in order (None when there is none)."""
        if self.broken is not None:
            raise RuntimeError(self.broken)
        try:
            batch = pickle.loads(data)
        except BaseException as e:  # (nothing after it can run in step: its parts are lost)
            self.broken = (
                f"rank {self.rank}'s Ray actor could not load its commands "
                f"({type(e).__name__}: {e}; an op or attribute pickled by reference to a "
                f"module it cannot import?)"
            )
            raise RuntimeError(self.broken) from None
        ex = self.ex
        outs: list = [None]
        for cmd in batch:
            kind = cmd[0]
            try:
                if kind in ANSWERED:
                    outs.append(self._answer(cmd))
                elif not ex.run(cmd):
                    self._take(cmd, refs)
            except BaseException as e:  # noqa: BLE001 - an internal error: kept, not fatal
                err = W.error_bytes(e)
                if kind in ANSWERED:
                    outs.append(("error", err))
                else:
                    ex.fail(W.made_by(cmd), err)
        return outs if len(outs) > 1 else None

    def _answer(self, cmd: tuple) -> Any:
        ex, kind = self.ex, cmd[0]
        if kind == W.META:
            return ex.meta(cmd[1])
        if kind == W.PING:  # (kernel errors stay on the parts they poisoned)
            ex.vm.synchronize_quietly()
            return ("ok", len(ex.parts) + len(ex.poisoned))
        ins = ex.inputs([cmd[1]])
        if isinstance(ins, bytes):
            return ("error", ins)
        try:
            a = ex.host_array(ins[0])  # (a copy: later commands may write the part)
        except BaseException as e:  # noqa: BLE001 - answered
            return ("error", W.error_bytes(e))
        return a if kind == W.SEND else ("data", a)

    def _take(self, cmd: tuple, refs: list) -> None:
        """A part from the controller (``PUT``) or from another rank (``RECV``)."""
        import ray

        ex, kind = self.ex, cmd[0]
        if kind == W.PUT:
            _, out_id, dtype, shape, _, in_ref, at = cmd
            if in_ref:
                a = np.array(ray.get(refs[at], timeout=W.WAIT_S), copy=True)
            else:
                a = np.frombuffer(bytearray(at), dtype.np).reshape(shape)
            ex.parts[out_id] = W.adopt(a, dtype)
        elif kind == W.RECV:
            _, src, out_id, dtype, at = cmd
            try:
                got = ray.get(refs[at], timeout=W.WAIT_S)
            except ray.exceptions.GetTimeoutError:
                err: BaseException = TimeoutError(
                    f"rank {src} did not send its part within {W.WAIT_S:.0f} s"
                )
                return ex.fail([out_id], W.error_bytes(err))
            except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                err = W.PeerGone(f"the Ray actor of rank {src} failed before it sent its part")
                return ex.fail([out_id], W.error_bytes(err))
            if isinstance(got, tuple):  # ("error", ...): the source's part held it
                return ex.fail([out_id], got[1])
            ex.parts[out_id] = W.adopt(got if got.flags.writeable else got.copy(), dtype)
        else:
            raise ValueError(f"Ray ranks: unknown command {kind!r}")
        return None


class _Slot:
    """Where the Ray object of a command's answer will be, once its call is made."""

    __slots__ = ("ref",)

    def __init__(self) -> None:
        self.ref: Any = None


_ACTOR: list = []  # RankActor as a Ray actor class (made at the first use)


def _kill_all(ray: Any, actors: list) -> None:
    for a in actors:
        try:
            ray.kill(a)
        except Exception:  # noqa: BLE001, S110 - already gone, or Ray shut down
            pass
    actors.clear()


class RayRanks(HeldRanks):
    """Each rank of a placement a Ray actor (see the module doc), started at the first use
    and killed by ``close()``, garbage collection or a rank's death. ``threads``: the CPU
    threads of each actor's eager runtime (and BLAS's where threadpoolctl is installed;
    default: this machine's cores shared among the ranks); ``options``: Ray actor options
    added to ``ACTOR_OPTIONS`` (``num_cpus``, ``resources``, ``scheduling_strategy``);
    ``start_timeout``: seconds to wait for the actors to start (Ray waits forever for
    resources that other actors hold). ``pids`` and ``nodes``: where the actors run."""

    kind = "ray"
    words = "Ray ranks"
    members = "actors"

    def __init__(
        self,
        placement: Placement,
        threads: int | None = None,
        options: dict | None = None,
        start_timeout: float = START_S,
    ) -> None:
        if placement.type != "cpu":
            raise DeviceError(
                f"{placement!r}: Ray ranks run placements of type 'cpu' (each rank a Ray "
                f"actor); use af.parallel.use_ranks('inline') for placements of type "
                f"{placement.type!r}"
            )
        self._ray = ray_module()
        super().__init__(placement, threads)
        self.options = {**ACTOR_OPTIONS, **(options or {})}
        self.start_timeout = float(start_timeout)
        self._actors: list = []
        self._where: list = []  # (pid, node id) per rank
        self._put: tuple = (None, None, -2)  # the tensor put last, its payload, the rank
        self._sends: dict = {}  # (rank, part id) -> the _Slot of its SEND kept this flush
        self.calls = 0  # Ray calls made
        self.sent = 0  # bytes of commands sent
        self._finalizer = weakref.finalize(self, _kill_all, self._ray, self._actors)

    # -- the actors ------------------------------------------------------------------------

    @property
    def pids(self) -> list:
        return [w[0] for w in self._where]

    @property
    def nodes(self) -> list:
        """The Ray node ID of each rank's actor."""
        return [w[1] for w in self._where]

    @property
    def actors(self) -> list:
        """The Ray actor handles, one per rank."""
        return list(self._actors)

    def _started(self) -> bool:
        return bool(self._actors)

    def _live(self) -> None:
        if self._actors and self._failed is None and not self._ray.is_initialized():
            self._failed = (
                f"the Ray ranks of {self.placement!r}",
                None,
                RuntimeError(
                    "Ray was shut down (ray.shutdown()) since their actors started: the "
                    "global tensors on the placement are lost; the next use of the "
                    "placement starts new actors"
                ),
            )
            self._shutdown()
        super()._live()

    def _start(self) -> None:
        ray = self._ray
        if not ray.is_initialized():
            path = os.pathsep.join(p for p in sys.path if p)  # (what this process imports)
            ray.init(
                include_dashboard=False,
                log_to_driver=False,
                runtime_env={"env_vars": {"PYTHONPATH": path}},
            )
        if not _ACTOR:
            _ACTOR.append(ray.remote(RankActor))
        try:
            for r in range(self.size):
                self._actors.append(_ACTOR[0].options(**self.options).remote(r, self.threads))
            ready = [a.ready.remote() for a in self._actors]
            self._where = [tuple(w) for w in ray.get(ready, timeout=self.start_timeout)]
        except ray.exceptions.GetTimeoutError:
            self._finalizer()
            self._finalizer = weakref.finalize(self, _kill_all, ray, self._actors)
            raise DeviceError(
                f"{self.placement!r}: Ray did not start the {self.size} actors of its ranks "
                f"within {self.start_timeout:.0f} s (options {self.options}; Ray's free "
                f"resources: {ray.available_resources()}): free what other Ray actors hold, "
                f"or ask less (af.parallel.ray_ranks.ACTOR_OPTIONS, or RayRanks(placement, "
                f"options=...))"
            ) from None
        except BaseException:
            self._finalizer()
            self._finalizer = weakref.finalize(self, _kill_all, ray, self._actors)
            raise

    def _died(self, rank: int, err: BaseException) -> None:
        """Rank ``rank``'s actor died: the placement's actors are killed and the error
        raised (and again at every later use)."""
        pid, node = self._where[rank] if rank < len(self._where) else (None, "")
        cause = getattr(err, "cause", None)  # (an error its call raised: RayTaskError)
        if isinstance(err, self._ray.exceptions.RayTaskError) and cause is not None:
            how = f"failed ({type(cause).__name__}: {cause}), and its actor was killed"
        else:
            lines = [s.strip() for s in str(err).splitlines() if s.strip()]
            why = next(
                (s for s in lines if s.startswith("The actor is dead")), lines[0] if lines else ""
            )
            why = why.split(" Some common causes")[0][:300]  # (Ray's guesses at why: left out)
            how = f"died ({type(err).__name__}: {why})"
        original = WorkerDied(
            f"its Ray actor (pid {pid}, node {str(node)[:8]}) {how}; the global tensors on "
            f"the placement are lost (its other actors were killed); the next use of the "
            f"placement starts new actors"
        )
        self._fail(rank, original)

    def _find_dead(self) -> None:
        """A rank's part could not come from another: that one's error, once Ray says it
        died (a live one answers, or is busy)."""
        ray = self._ray
        refs = [a.ready.remote() for a in self._actors]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=2.0)
        for r, ref in enumerate(refs):
            if ref in done:
                try:
                    ray.get(ref, timeout=1.0)
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as e:
                    self._died(r, e)
                except Exception:  # noqa: BLE001, S110 - alive (busy, or slow to answer)
                    pass

    def _stop(self) -> None:
        self._put = (None, None, -2)
        self._sends.clear()
        self._finalizer()

    # -- commands --------------------------------------------------------------------------

    def _after(self, rank: int, work: int) -> None:
        """Sends what is kept once ``FLUSH_BYTES`` of work or a batch of ``BATCH``
        commands is (a call costs more than a pipe's write: larger batches)."""
        self._work += work
        if self._work >= FLUSH_BYTES or len(self._pending[rank]) >= BATCH:
            self._flush()

    def _flush(self) -> None:
        """One call per rank with commands kept, up to the first ``RECV`` whose part's
        call is not made yet; again until every command went."""
        self._work = 0
        pending, drops = self._pending, self._drops
        while drops:
            r, i = drops.popleft()
            self._gone += 1
            pending[r].append((W.DROP, [i]))
        left = True
        while left:
            left = made = False
            for r in range(self.size):
                cmds = pending[r]
                if not cmds:
                    continue
                cut = len(cmds)
                for n, c in enumerate(cmds):
                    if c[0] == W.RECV and c[4].ref is None:
                        cut = n
                        break
                if cut:
                    pending[r] = cmds[cut:]
                    self._call(r, cmds[:cut])
                    made = True
                left = left or bool(pending[r])
            if left and not made:  # (cannot be: each RECV's SEND was kept before it)
                raise AssertionError("Ray ranks: a move's part is never sent")
        self._sends.clear()

    def _call(self, rank: int, cmds: list) -> None:
        refs: list = []
        out: list = []
        slots: list = []
        for c in cmds:
            kind = c[0]
            if kind == W.RECV:
                refs.append(c[4].ref)
                out.append((*c[:4], len(refs) - 1))
            elif kind == W.PUT and c[5]:
                refs.append(c[6])
                out.append((*c[:6], len(refs) - 1))
            elif kind in ANSWERED:
                slots.append(c[-1])
                out.append(c[:-1])
            else:
                out.append(c)
        data = _pickled(out)
        method = self._actors[rank].run
        if slots:
            got = method.options(num_returns=len(slots) + 1).remote(data, refs)
            for s, ref in zip(slots, got[1:], strict=True):
                s.ref = ref
        else:
            method.remote(data, refs)
        self.calls += 1
        self.sent += len(data)

    def _request(self, rank: int, cmd: tuple) -> tuple:
        slot = _Slot()
        self._issue(rank, (*cmd, slot))
        self._put = (None, None, -2)  # (a scatter is over by now)
        self._flush()
        ray = self._ray
        try:
            reply = ray.get(slot.ref, timeout=W.WAIT_S)
        except ray.exceptions.GetTimeoutError:
            self._fail(rank, TimeoutError(f"no answer from its Ray actor within {W.WAIT_S:.0f} s"))
        except ray.exceptions.RayError as e:  # (its actor died)
            self._died(rank, e)
        if reply[0] == "error":
            self._raise(reply[1])
        return reply

    # -- the interface ---------------------------------------------------------------------

    def call(self, rank: int, op: Any, ins: list, attrs: dict, outs: list | None = None) -> list:
        if outs is not None and self._sends:  # (a part written: sent afresh from now)
            with self._lock:
                self._sends = {k: v for k, v in self._sends.items() if k[0] != rank}
        return super().call(rank, op, ins, attrs, outs)

    def move(self, part: Any, src: int, dst: int) -> Any:
        with self._lock:
            self._live()
            m = self.meta(part)
            if src == dst:
                return self.call(dst, _COPY, [part], NO_ATTRS)[0]
            out = self._part(dst, contiguous_meta(m.shape, m.dtype, self._dev), m.dtype)
            slot = self._sends.get((src, part.id))
            if slot is None:
                slot = self._sends[(src, part.id)] = _Slot()
                self._issue(src, (W.SEND, part.id, slot))
            self._issue(dst, (W.RECV, src, out.id, m.dtype, slot))
            self._after(dst, _nbytes(m))
            return out

    def put(self, rank: int, impl: Any) -> Any:
        """Small tensors go inside the call; larger ones into Ray's object store once for
        every rank they are put on."""
        with self._lock:
            self._live()
            m = impl.meta
            nbytes = _nbytes(m)
            held, payload, last = self._put
            if held is not impl or rank != last + 1:  # (read once for the ranks in turn)
                src = impl if impl.blob.backend.host_memory else transfer(impl, device("cpu"))
                if nbytes > W.INLINE:
                    ray = self._ray
                    payload = read(src, lambda x: ray.put(np.ascontiguousarray(x)), "to_global")
                else:
                    a = read(src, lambda x: np.array(x, copy=True, order="C"), "to_global")
                    payload = a.reshape(-1).view(np.uint8).tobytes()
            self._put = (impl, payload, rank) if rank < self.size - 1 else (None, None, -2)
            out = self._part(rank, contiguous_meta(m.shape, m.dtype, self._dev), m.dtype)
            in_ref = nbytes > W.INLINE
            self._issue(rank, (W.PUT, out.id, m.dtype, tuple(m.shape), nbytes, in_ref, payload))
            self._after(rank, nbytes)
            return out

    def read(self, rank: int, part: Any) -> np.ndarray:
        with self._lock:
            self._live()
            a = self._request(rank, (W.GET, part.id))[1]
            return a if a.flags.writeable else a.copy()
