"""The actorflow pytest plugin (entry point ``pytest11: actorflow``).

Fixtures: ``af_seed`` (a seeded, serial schedule for the test: the same seed, the same
order of acts), ``af_null`` (the null device with a simulated latency), and
``af_memory_budget`` (a budget per device the test's runs and eager tensors must stay
within). Marker ``af_gpu``: the test needs a CUDA GPU and is skipped, with the reason,
where there is none. Options: ``--af-seed=N`` (every ``af_seed`` gets N: replays a
failure), ``--af-last-acts=N`` (acts of each run kept to print; 0: none).

When a test fails, its report gains a section "actorflow": per run the test started, how
it ended, who waited for whom (for a run stopped, failed or still going), its last acts,
and the seed to replay it with.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from ..backends import get_backend
from ..device import device as _device
from ..errors import parse_bytes
from ..runtime.observe import hooks as observe
from ..runtime.observe.watchdog import describe_waits, failure_of
from . import Latency, assert_peak_within, gpu_missing, null_latency, seeded

if TYPE_CHECKING:
    from ..device import Device

RUNS_SHOWN = 3  # the last runs of a failing test that its report shows


class _Runs:
    """The runs started during the current test (a watcher of ``observe``)."""

    def __init__(self):
        self.runs: list = []  # [{"n", "graph", "sched", "said", "stats"}]: the last 50
        self.seed = None
        self.count = 0  # runs started in the test
        self.ended_stats: list = []  # [(n, RunStats)] of every run that ended in it
        self.numbers: dict = {}  # sched -> n, while it runs

    def clear(self) -> None:
        self.runs, self.seed, self.count, self.ended_stats, self.numbers = [], None, 0, [], {}

    def started(self, g, sched) -> None:
        self.count += 1
        self.numbers[sched] = self.count
        self.runs.append(
            {
                "n": self.count,
                "graph": g,
                "sched": sched,
                "said": None,
                "stats": None,
                "failure": None,
            }
        )
        del self.runs[:-50]

    def ended(self, g, sched) -> None:
        n = self.numbers.pop(sched, None)
        if n is None:
            return  # (started before this test)
        self.ended_stats.append((n, g._last))
        for r in reversed(self.runs):
            if r["sched"] is sched:
                r["stats"] = g._last
                r["said"] = _report(sched, g._last, ended=True)
                r["failure"] = _failure(sched)
                r["sched"] = None  # (the run's state is not kept past its end)
                return

    def report(self) -> str:
        parts = []
        shown = self.runs[-RUNS_SHOWN:]
        for r in shown:  # what stopped a run first: the test's likely cause
            failure = r["failure"] if r["sched"] is None else _failure(r["sched"])
            if failure is not None:
                parts.append(f"run {r['n']} was stopped by an error: {failure}")
        if self.seed is not None:
            parts.append(f"schedule seed {self.seed} (replay: --af-seed={self.seed})")
        if self.count > len(shown):
            parts.append(f"({self.count - len(shown)} earlier runs not shown)")
        for r in shown:
            text = r["said"] if r["sched"] is None else _report(r["sched"], None, False)
            parts.append(f"run {r['n']}: {text}")
        return "\n".join(parts)


RUNS = _Runs()


def _failure(sched):
    """The error that stopped a run, in a line (an actor's: its name, piece and
    exception), or None."""
    e = sched.error
    if e is None:
        return None
    failed = failure_of(sched)
    if failed is not None:
        return failed[1]
    first = str(e).strip().splitlines()
    return type(e).__name__ + (f": {first[0]}" if first else "")


def _report(sched, stats, ended: bool) -> str:
    if not ended:
        head = "still running when the test failed"
    else:
        state = getattr(stats, "state", "ended")
        head = {
            "finished": "finished",
            "stopped": "stopped before its end",
            "failed": "stopped by an error",
        }.get(state, state)
        if stats is not None:
            head += f" after {stats.pieces} pieces"
    lines = [head]
    if not ended or head.split()[0] != "finished":
        lines.append("who waits for whom:")
        lines += ["  " + w for w in describe_waits(sched).splitlines()]
    tl, keep = sched.timeline, observe.SCHEDULE.keep_acts
    acts = [r for r in list(tl.records) if r[0] != 1] if tl is not None and keep else []
    if acts:
        acts.sort(key=lambda r: r[3])
        acts = acts[-keep:]
        lines.append(f"last {len(acts)} acts (ms from the start: actor, piece, ms):")
        lines += [
            f"  {(r[3] - tl.t0) * 1e3:10.3f}  {r[1]}  piece {r[2]}  "
            f"{(r[4] - r[3]) * 1e3:.3f}" + (f"  raised {r[6]}" if r[0] == 2 else "")
            for r in acts
        ]
    return "\n".join(lines)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("actorflow")
    group.addoption(
        "--af-seed",
        type=int,
        default=None,
        help="the seed of every af_seed schedule (replays a failing test)",
    )
    group.addoption(
        "--af-last-acts",
        type=int,
        default=None,
        help="acts of each actor-graph run kept to print when a test fails "
        "(default 50; 0 keeps none)",
    )
    parser.addini("af_last_acts", "acts of each run kept to print when a test fails", default="50")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "af_gpu: the test needs a CUDA GPU (skipped with the reason where there is none)"
    )
    config.addinivalue_line("markers", "af_seed(n): the seed of the test's af_seed fixture")
    n = config.getoption("--af-last-acts")
    sch = observe.SCHEDULE  # (a session inside a session, pytester's: its tests
    _CONFIGS.append((sch.keep_acts, sch.seed, sch.serial, RUNS.__dict__.copy()))  # start
    sch.seed, sch.serial = None, False  # clean, and the outer test gets its own back)
    RUNS.clear()
    sch.keep_acts = int(config.getini("af_last_acts")) if n is None else n
    observe.watch(RUNS)


def pytest_unconfigure(config: pytest.Config) -> None:
    sch = observe.SCHEDULE
    if _CONFIGS:
        sch.keep_acts, sch.seed, sch.serial, runs = _CONFIGS.pop()
        RUNS.__dict__.update(runs)
    else:
        sch.keep_acts = 0
    if not _CONFIGS:
        observe.unwatch(RUNS)


_CONFIGS: list = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    need = [item for item in items if item.get_closest_marker("af_gpu") is not None]
    why = gpu_missing() if need else None
    if why is not None:
        for item in need:
            item.add_marker(pytest.mark.skip(reason=why))


def pytest_runtest_setup(item: pytest.Item) -> None:
    RUNS.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and (RUNS.runs or RUNS.seed is not None):
        rep.sections.append((f"actorflow ({rep.when})", RUNS.report()))


@pytest.fixture
def af_seed(request: pytest.FixtureRequest) -> Iterator[int]:
    """A seeded, serial schedule for the test's runs; its value is the seed. The seed is
    ``--af-seed``, else the ``af_seed(n)`` marker's, else one fixed per test (from its
    id), so a failure replays; a failing test's report says it."""
    seed = request.config.getoption("--af-seed")
    mark = request.node.get_closest_marker("af_seed")
    if seed is None and mark is not None and mark.args:
        seed = int(mark.args[0])
    if seed is None:
        seed = zlib.crc32(request.node.nodeid.encode())
    RUNS.seed = seed
    with seeded(seed):
        yield seed


@pytest.fixture
def af_null() -> Iterator[Callable[..., Device]]:
    """``af_null(latency)``: the null device's kernels take ``latency`` seconds of
    simulated time (or ``latency(op, bytes)``); returns the null device. Restored after."""
    saved: list[Latency] = []

    def set_latency(latency: Latency = 0.0) -> Device:
        old = null_latency(latency)
        if not saved:
            saved.append(old)
        return _device("null")

    yield set_latency
    if saved:
        null_latency(saved[0])


@pytest.fixture
def af_memory_budget() -> Iterator[Callable[..., Device]]:
    """``af_memory_budget(budget, device="cpu")``: from now on the device's allocator
    refuses to hand out more (eager tensors and registers: the test fails there with
    OutOfMemoryError), and when the test ends every actor-graph run it made must have
    peaked within it (registers that do not come from the allocator count too), else the
    test fails naming the run."""
    budgets: dict = {}
    saved: dict = {}
    first = RUNS.count

    def set_budget(budget: int | str, device: str | Device = "cpu") -> Device:
        dev = _device(device)
        alloc = get_backend(dev).allocator
        if dev not in saved:
            saved[dev] = alloc.budget
        alloc.set_budget(parse_bytes(budget))
        alloc.reset_peak()
        budgets[str(dev)] = budget
        return dev

    yield set_budget
    for dev, old in saved.items():
        get_backend(dev).allocator.set_budget(old)
    for i, stats in RUNS.ended_stats:
        if i <= first or stats is None:
            continue
        try:
            assert_peak_within(stats, budgets)
        except AssertionError as e:
            pytest.fail(f"af_memory_budget: run {i} of this test went over: {e}", pytrace=False)
