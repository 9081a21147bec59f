"""Testing actor graphs: a seeded schedule that replays, waiting until every actor is
blocked, and assertions on deadlocks and memory. The pytest plugin (``plugin.py``,
registered through the ``pytest11`` entry point) gives them as fixtures and prints, for a
failing test, each run's wait-for graph and last acts.

Usable without pytest::

    with af.testing.seeded(7):               # the same seed, the same order of acts
        outs = af.testing.assert_no_deadlock(g, timeout=10)
    af.testing.assert_peak_within(g, "4MiB")

    async def test_fills_its_buffers():      # pytest-asyncio
        run = asyncio.create_task(consume_slowly(g.run_async()))
        await af.testing.wait_all_actors_blocked(g)
        assert g.stats().actors["load"]["acts"] == ...
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..backends import get_backend
from ..device import Device
from ..device import device as _device
from ..errors import ActorError, DeadlockError, format_bytes, parse_bytes
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.graph.checks import positive_seconds
from ..runtime.observe import hooks as observe
from ..runtime.observe.stats import RunStats
from ..runtime.observe.watchdog import describe_waits

if TYPE_CHECKING:
    from ..runtime.sched.credit import CreditScheduler

# the null device's simulated seconds per kernel: a constant, or ``f(op, output_bytes)``
Latency = float | Callable[[str, int], float]

__all__ = [
    "acts",
    "assert_no_deadlock",
    "assert_peak_within",
    "describe_runs",
    "gpu_missing",
    "null_latency",
    "seeded",
    "wait_all_actors_blocked",
]


@contextlib.contextmanager
def seeded(seed: int, serial: bool = True) -> Iterator[int]:
    """Every run started inside tries its ready actors in an order drawn from ``seed``
    (a graph's own ``seed=`` wins). With ``serial`` (the default), plain stages act on the
    loop one act at a time (a stage with ``timeout=`` on its thread, the loop waiting for
    each act) and simulated time (``time=``) runs on a virtual clock, so the order of acts
    depends on the seed alone and a failure replays. The caller of ``run()`` takes no
    virtual time: the clock, and the credits it hands back, wait until it has taken every
    output it was given (a caller that stops reading stops the clock). Acts hold the loop
    while they run: one that never returns (and has no ``timeout=``) hangs the run."""
    sch = observe.SCHEDULE
    old = sch.seed, sch.serial
    sch.seed, sch.serial = seed, serial
    try:
        yield seed
    finally:
        sch.seed, sch.serial = old


def acts(g: ActorGraph) -> list[tuple[str, int]]:
    """``[(actor, piece)]`` of the last run of ``g`` (or the one in progress) in the order
    they started, as far as its record reaches (an act that raised included):
    ``run(trace=...)`` records every act; a test under the plugin keeps the last
    ``--af-last-acts`` of them."""
    tl = _timeline_of(g)
    if tl is None:
        raise RuntimeError(
            "acts(): the run kept no record of its acts; run it with "
            "trace=..., or in a test under the actorflow plugin"
        )
    recs = [r for r in list(tl.records) if r[0] != 1]
    recs.sort(key=lambda r: r[3])
    return [(r[1], r[2]) for r in recs]


def _timeline_of(g):
    cur = g._current
    if cur is not None:
        return cur[0].timeline
    return g._last_timeline


def _quiet(sched) -> bool:
    """Nothing in the run can act now: no message waits for the loop, no act runs on a
    thread, every actor has ended or waits (input, credit, resource)."""
    if sched.start_time is None or sched.ready or sched.inbox:
        return sched.finished
    for st in sched.actor_runs:
        if st.ended:
            continue
        if st.piped:  # (its thread sets the cause before it looks)
            if (
                st.cause is None
                or st.cause == "credit"
                and st.out.pipe.qsize()
                or st.cause == "input"
                and st.ins[0].pipe.qsize()
            ):
                return False
        elif st.in_flight:
            if st.mode != "async" and not (sched.clock is not None and sched.clock.held):
                return False  # acting (on its thread, or simulated time; a serial
                # run's virtual clock waits for the caller: blocked)
        elif st.cause is None:
            return False
    return True


def _snapshot(runs) -> tuple:
    return tuple(
        (id(s), tuple((st.acts, st.in_flight, st.cause) for st in s.actor_runs)) for _, s in runs
    )


async def wait_all_actors_blocked(
    graph: ActorGraph | None = None, timeout: float = 10.0, settle: int = 3
) -> None:
    """Returns once every actor of the runs in progress (of ``graph`` only, when given:
    then, if it never ran, it first waits for its run to start) is blocked: waiting for
    input, a credit or a resource, with no act running and nothing queued, unchanged over
    ``settle`` turns of the loop (an async actor counts as blocked when it stays so, and
    so does an act in simulated time on a serial run's virtual clock held for the
    caller). A run that ended counts as blocked. Raises TimeoutError after ``timeout``
    seconds, saying who acts."""
    timeout = positive_seconds(
        timeout, "wait_all_actors_blocked: timeout=", "the seconds to wait", "give e.g. timeout=10"
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    for _ in range(3):
        await asyncio.sleep(0)  # tasks just created start their runs
    same, last, spins = 0, None, 0
    while True:
        runs = [(g, s) for g, s in observe.running() if graph is None or g is graph]
        waiting_start = graph is not None and not runs and graph._last is None
        if not waiting_start and all(_quiet(s) for _, s in runs):
            snap = _snapshot(runs)
            same = same + 1 if snap == last else 0
            last = snap
            if same >= settle:
                return
        else:
            same, last = 0, None
        if loop.time() > deadline:
            raise TimeoutError(
                f"wait_all_actors_blocked: after {timeout:g} s the actors "
                f"still act:\n{describe_runs(runs)}"
            )
        spins += 1
        await asyncio.sleep(0 if spins % 20 else 0.001)  # let threads come back too


def describe_runs(runs: Sequence[tuple[ActorGraph, CreditScheduler]] | None = None) -> str:
    """Each run in progress (or those given as ``[(graph, sched)]``): who acts and who
    waits for whom."""
    runs = observe.running() if runs is None else runs
    if not runs:
        return "(no run in progress)"
    return "\n".join(
        f"run of {len(s.actor_runs)} actors:\n  " + describe_waits(s).replace("\n", "\n  ")
        for _, s in runs
    )


def assert_no_deadlock(
    target: ActorGraph | Callable[[], Any] | Awaitable[Any] | AsyncIterator[Any],
    timeout: float = 30.0,
    feed: Iterable[Any] | None = None,
) -> Any:
    """Runs ``target`` and fails (AssertionError) if it deadlocks or does not end within
    ``timeout`` seconds, with the wait-for graph: an ActorGraph (run to its end: returns
    its outputs), a callable (called: returns its result; a plain function is called on
    this thread and not timed, an ``async def`` one is awaited as below), or an awaitable
    or async iterator (then await what this returns). A stalled run's DeadlockError (also
    one that stopped a run an ``async def`` stage iterated, reaching here inside that
    actor's ActorError), or a NaiveResult whose status is "deadlock", fails the same way.
    ``timeout``: seconds > 0."""
    try:
        timeout = positive_seconds(
            timeout,
            "assert_no_deadlock: timeout=",
            "the seconds the run may take",
            "give e.g. timeout=30",
        )
    except (TypeError, ValueError):
        if inspect.iscoroutine(target):
            target.close()  # (never awaited: closed, so it warns of nothing)
        raise
    if inspect.isawaitable(target) or hasattr(target, "__aiter__"):
        return _no_deadlock_async(target, timeout)
    if isinstance(target, ActorGraph):
        return _run_graph(target, timeout, feed)
    if not callable(target):
        raise TypeError(
            f"assert_no_deadlock: expected an ActorGraph, a callable, an "
            f"awaitable or an async iterator, got {type(target).__name__}"
        )
    with _deadlock_fails():
        result = target()
    if inspect.isawaitable(result) or hasattr(result, "__aiter__"):
        return _no_deadlock_async(result, timeout)  # (an async def function)
    return _check_result(result)


def _deadlock_inside(e: BaseException | None):
    """The DeadlockError an actor's error carries (an ``async def`` stage iterating
    another graph's run that stalled), or None."""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, DeadlockError):
            return e
        e = getattr(e, "original", None) or e.__cause__
        seen += 1
    return None


def _nested_deadlock(e: ActorError) -> AssertionError | None:
    inner = _deadlock_inside(e.original)
    if inner is None:
        return None
    return AssertionError(
        f"deadlock in a run that actor {e.actor!r} iterated on piece {e.piece}: {inner}"
    )


@contextlib.contextmanager
def _deadlock_fails():
    """A DeadlockError raised inside, or one an actor's error carries from a run it
    iterated, becomes the AssertionError that names it; other errors pass."""
    try:
        yield
    except DeadlockError as e:
        raise AssertionError(f"deadlock: {e}") from None
    except ActorError as e:
        nested = _nested_deadlock(e)
        if nested is None:
            raise
        raise nested from e


def _check_result(result):
    if getattr(result, "status", None) == "deadlock":
        raise AssertionError(f"deadlock: {result.error}")
    return result


def _run_graph(g: ActorGraph, timeout: float, feed):
    said: list = []

    def expire():
        cur = g._current
        if cur is None:
            return
        try:
            said.append(describe_waits(cur[0]))
        except Exception as e:  # noqa: BLE001 - (read from another thread) stop it anyway
            said.append(f"(who waits for whom could not be read: {e!r})")
        cur[0].loop.call_soon_threadsafe(cur[0].stop, TimeoutError("assert_no_deadlock"))

    timer = threading.Timer(timeout, expire)
    timer.daemon = True
    timer.start()
    try:
        with _deadlock_fails():
            outs = list(g.run(feed))
        if said:  # it ended, but only after the timeout (its stop came late)
            raise TimeoutError
        return outs
    except TimeoutError:
        if not said:
            raise
        raise AssertionError(
            f"the run did not end within {timeout:g} s; then:\n" + said[0]
        ) from None
    finally:
        timer.cancel()


async def _no_deadlock_async(target, timeout: float):
    async def whole():
        if hasattr(target, "__aiter__"):
            return [x async for x in target]
        return await target

    task = asyncio.ensure_future(whole())
    done, _ = await asyncio.wait([task], timeout=timeout)
    if not done:
        said = describe_runs()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise AssertionError(f"did not end within {timeout:g} s; then:\n{said}")
    with _deadlock_fails():
        return _check_result(task.result())


def assert_peak_within(
    source: ActorGraph | RunStats | str | Device,
    budget: int | str | dict[str, int | str],
    device: str | None = None,
) -> None:
    """Fails (AssertionError) when the measured memory peak exceeds ``budget`` (bytes, or
    a string such as ``"4MiB"``, or a dict per device): ``source`` is an ActorGraph (its
    last run), its RunStats, or a device name (the eager allocator's peak there)."""
    if isinstance(source, (str, Device)):
        dev = _device(source)
        peak = get_backend(dev).allocator.stats().peak
        _check(str(dev), peak, budget, f"eager tensors on {dev}")
        return
    stats = source.stats() if isinstance(source, ActorGraph) else source
    if not isinstance(stats, RunStats):
        raise TypeError(
            f"assert_peak_within: expected an ActorGraph, RunStats or a device "
            f"name, got {type(source).__name__}"
        )
    for dev, m in stats.memory.items():
        if device is not None and dev != str(_device(device)):
            continue
        peak = m["live"] if m["live"] is not None else m["peak"]
        _check(dev, peak, budget, f"the run (planned {format_bytes(m['planned'])})")


def _check(dev: str, peak: int, budget, what: str) -> None:
    if isinstance(budget, dict):
        if dev not in {str(_device(k)) for k in budget}:
            return
        budget = next(v for k, v in budget.items() if str(_device(k)) == dev)
    limit = parse_bytes(budget)
    if peak > limit:
        raise AssertionError(
            f"memory on {dev}: {what} peaked at {format_bytes(peak)} "
            f"({peak} bytes), over the {format_bytes(limit)} allowed"
        )


def null_latency(latency: Latency) -> Latency:
    """Sets the null device's simulated time per kernel (seconds, or ``f(op, bytes)``)
    and returns what it was (the plugin's ``af_null`` fixture restores it)."""
    backend = get_backend(_device("null"))
    old = backend.latency
    backend.latency = latency
    return old


def gpu_missing() -> str | None:
    """Why a test that needs a CUDA GPU cannot run here, or None when it can."""
    try:
        import cupy
    except ImportError:
        return "needs a CUDA GPU and CuPy: pip install 'actorflow[cuda]'"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver, no device: the reason is the text
        return f"needs a CUDA GPU: CuPy sees none ({type(e).__name__}: {e})"
    return None if n > 0 else "needs a CUDA GPU: CuPy sees 0 devices"
