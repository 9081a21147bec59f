"""The timing harness the benchmark scripts share (a plain module, not part of actorflow).

Each script puts this folder on ``sys.path`` and imports it::

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import harness

What it holds:

- ``Contender`` and ``run_rounds``: one untimed warm-up run per contender, then best-of-N
  interleaved rounds (round-robin, the order rotated every round), every run checked;
- ``threads_queue``: the hand-written "one thread per stage, ``queue.Queue`` between
  them" baseline;
- ``CpuContention``: how much CPU other processes took while the rounds ran;
- ``environment``: the facts about the machine and the code measured, for the JSON;
- the command line (``ArgumentParser``: ``--quick``, sizes that depend on it, ``--out``),
  the tables (``Column``, ``print_table``, ``fmt``, ``print_contention``) and the JSON
  file (``document``, ``finish``).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import importlib
import json
import os
import platform
import queue
import statistics
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"


# -- contenders and rounds -----------------------------------------------------------------


class Contender:
    """One row of a benchmark: ``fn(*inputs)`` is the timed work, ``check(result, ref)`` says
    what is wrong with its result (a string) or returns None when it is right.

    Outside the clock: ``setup()`` before and ``teardown()`` after the call (even when it
    raises); ``after()`` right after the clock stops (e.g. reads ``stats()``; its value is
    kept per timed run, see ``best_after``); ``fetch(out)`` turns the output into what
    ``check`` compares (default: as is); ``pause`` seconds of sleep after the run (lets
    spinning worker threads go idle). ``ref`` is the expected result unless ``run_once`` is
    given one. ``fields`` (note, baseline, ...) head the row's ``summary()``, in the order
    given; ``extra`` is appended to it."""

    def __init__(
        self,
        name,
        fn,
        check,
        *,
        ref=None,
        fetch=None,
        setup=None,
        teardown=None,
        after=None,
        pause=0.0,
        **fields,
    ):
        self.name, self.fn, self.check, self.ref = name, fn, check, ref
        self.fetch, self.setup, self.teardown = fetch, setup, teardown
        self.after, self.pause = after, pause
        self.fields = fields
        self.times: list[float] = []
        self.after_values: list = []
        self.errors: list[str] = []
        self.check_failures: list[str] = []
        self.checks_passed = 0
        self.extra: dict = {}

    def run_once(self, timed: bool, inputs=(), ref=None) -> None:
        gc.collect()
        if self.setup:
            self.setup()
        try:
            t0 = time.perf_counter()
            out = self.fn(*inputs)
            t1 = time.perf_counter()
        except Exception as e:  # noqa: BLE001 - recorded, reported, and makes the exit status 1
            self.errors.append(f"{type(e).__name__}: {e}")
            traceback.print_exc()
            return
        finally:
            if self.teardown:
                self.teardown()
        try:
            value = self.after() if self.after else None
            failure = self.check(
                self.fetch(out) if self.fetch else out, self.ref if ref is None else ref
            )
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"fetching the result: {type(e).__name__}: {e}")
            traceback.print_exc()
            return
        finally:
            del out
            gc.collect()
        if failure is None:
            self.checks_passed += 1
        else:
            self.check_failures.append(failure)
        if self.pause:
            time.sleep(self.pause)
        if timed:
            self.times.append(t1 - t0)
            self.after_values.append(value)

    @property
    def ok(self) -> bool:
        return not self.errors and not self.check_failures and bool(self.times)

    def best_index(self) -> int | None:
        return min(range(len(self.times)), key=self.times.__getitem__) if self.times else None

    def best_after(self):
        """``after()``'s value on the best timed run (None without one)."""
        i = self.best_index()
        return None if i is None or self.after is None else self.after_values[i]

    def summary(self, per: int | None = None, unit: str = "op") -> dict:
        """The row for the JSON; with ``per``, also ``best_us_per_<unit>`` and
        ``median_us_per_<unit>`` (the time divided by ``per``)."""
        d = {
            **self.fields,
            "ok": self.ok,
            "checks_passed": self.checks_passed,
            "check_failures": self.check_failures,
            "errors": self.errors,
            "times_s": self.times,
        }
        if self.times:
            best, med = min(self.times), statistics.median(self.times)
            d.update(best_s=best, median_s=med)
            if per:
                d[f"best_us_per_{unit}"] = best / per * 1e6
                d[f"median_us_per_{unit}"] = med / per * 1e6
        d.update(self.extra)
        return d


def run_rounds(
    contenders: list,
    repeat: int,
    label: str,
    *,
    inputs=(),
    ref=None,
    warmup=None,
    warmup_note: str = "",
    ms_digits: int = 1,
) -> None:
    """One untimed warm-up run each, then ``repeat`` interleaved timed rounds, the order
    rotated every round so no one always goes first. ``inputs`` and ``ref`` go to every
    ``run_once``; ``warmup`` is the warm-up's ``(inputs, ref)`` where it differs."""
    w_inputs, w_ref = warmup if warmup is not None else (inputs, ref)
    print(f"[{label}] warm-up{warmup_note} ...", flush=True)
    for c in contenders:
        c.run_once(False, w_inputs, w_ref)
    for r in range(repeat):
        k = r % len(contenders)
        for c in contenders[k:] + contenders[:k]:
            if not c.errors:
                c.run_once(True, inputs, ref)
        print(
            f"[{label}] round {r + 1}/{repeat}: "
            + ", ".join(
                f"{c.name}={c.times[-1] * 1e3:.{ms_digits}f}ms" for c in contenders if c.times
            ),
            flush=True,
        )


def threads_queue(source, fns, maxsize: int) -> list:
    """The hand-written baseline: a thread iterating ``source()``, one thread per function
    of ``fns``, ``queue.Queue(maxsize)`` between them and to the consumer (this thread), a
    sentinel for the end. Returns what came out, in order; re-raises a stage's error."""
    end = object()
    qs = [queue.Queue(maxsize=maxsize) for _ in range(len(fns) + 1)]
    errors = []

    def produce():
        try:
            put = qs[0].put
            for x in source():
                put(x)
        except BaseException as e:  # noqa: BLE001 - re-raised by the consumer
            errors.append(e)
        finally:
            qs[0].put(end)

    def work(f, qin, qout):
        get, put = qin.get, qout.put
        try:
            while True:
                x = get()
                if x is end:
                    break
                put(f(x))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            while qin.get() is not end:  # drain so the producer never blocks forever
                pass
        finally:
            qout.put(end)

    threads = [threading.Thread(target=produce, daemon=True)]
    threads += [
        threading.Thread(target=work, args=(f, qs[i], qs[i + 1]), daemon=True)
        for i, f in enumerate(fns)
    ]
    for t in threads:
        t.start()
    out, get = [], qs[-1].get
    while True:
        x = get()
        if x is end:
            break
        out.append(x)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


# -- the machine ---------------------------------------------------------------------------


def loadavg() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


class CpuContention:
    """How much CPU other processes used between construction and ``result()`` (from
    /proc/stat minus this process's own CPU time): on a 2-core machine shared with test
    runs, a busy neighbour explains outliers. Linux only; other platforms report None."""

    def __init__(self):
        self.t0 = self._sample()

    @staticmethod
    def _sample():
        try:
            import resource

            with open("/proc/stat") as f:
                vals = [int(v) for v in f.readline().split()[1:]]
            hz = os.sysconf("SC_CLK_TCK")
            idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
            ru = resource.getrusage(resource.RUSAGE_SELF)
            return (
                sum(vals) / hz,
                (sum(vals) - idle) / hz,
                ru.ru_utime + ru.ru_stime,
                time.perf_counter(),
            )
        except Exception:  # noqa: BLE001
            return None

    def result(self) -> dict | None:
        t1 = self._sample()
        if self.t0 is None or t1 is None:
            return None
        total, busy, own, wall = (b - a for a, b in zip(self.t0, t1, strict=True))
        other = max(busy - own, 0.0)
        return {
            "wall_s": round(wall, 3),
            "cpu_s_available": round(total, 2),
            "cpu_s_busy_all": round(busy, 2),
            "cpu_s_this_process": round(own, 2),
            "cpu_s_other_processes": round(other, 2),
            "loadavg_1min_after": loadavg(),
            "other_processes_fraction": round(other / max(total, 1e-9), 3),
        }


def print_contention(c: dict | None, label: str = "") -> None:
    """The report's line on a ``CpuContention.result()`` (nothing when there is none)."""
    if c:
        frac = c["other_processes_fraction"]
        print(
            f"  {label}other processes used {c['cpu_s_other_processes']:.1f} of "
            f"{c['cpu_s_available']:.1f} CPU-s available ({frac:.0%})"
            + ("  <- machine was shared; timings are noisy" if frac > 0.1 else "")
        )


def try_import(name):
    """The module ``name`` (a dotted name gives the submodule), or None when it does not
    import."""
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None


def git(*cmd) -> str | None:
    """``git *cmd`` in the repository: its output, None when git could not run."""
    try:
        return subprocess.run(
            ["git", *cmd], cwd=REPO, text=True, capture_output=True, timeout=5
        ).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def loop_type(loop) -> str | None:
    return None if loop is None else f"{type(loop).__module__}.{type(loop).__name__}"


def graph_event_loop() -> str:
    """The type of the event loop an ActorGraph/Pipeline run uses (read only)."""
    from actorflow.eventloop import new_event_loop

    loop = new_event_loop()
    try:
        return loop_type(loop)
    finally:
        loop.close()


def environment(libraries: dict | None = None, runtime: dict | None = None) -> dict:
    """Machine, Python, numpy, actorflow (version, git HEAD, files of the runtime with
    uncommitted edits: it is edited concurrently) and uvloop. ``libraries`` (other
    contenders' versions) go after actorflow's entries, ``runtime`` (event loop, settings)
    after uvloop's."""
    import actorflow as af

    uvloop = try_import("uvloop")
    dirty = git("diff", "--name-only", "HEAD", "--", "actorflow")
    return {
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "numpy": np.__version__,
        "actorflow": getattr(af, "__version__", None),
        "actorflow_git_head": git("rev-parse", "HEAD") or None,
        "actorflow_uncommitted_files": None if dirty is None else dirty.split(),
        **(libraries or {}),
        "uvloop_installed": uvloop is not None,
        "uvloop_version": getattr(uvloop, "__version__", None) if uvloop else None,
        **(runtime or {}),
        "loadavg_1min": loadavg(),
    }


# -- command line --------------------------------------------------------------------------


class ArgumentParser(argparse.ArgumentParser):
    """A benchmark's command line: described by the first paragraph of ``doc``, with
    ``--quick``; ``parse_args`` fills the options added by ``add_sized`` that were not given
    with their full or quick default."""

    def __init__(self, doc: str, quick_help: str):
        super().__init__(
            description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
        )
        self.add_argument("--quick", action="store_true", help=quick_help)
        self.sized: dict[str, tuple] = {}

    def add_sized(self, flag: str, full, quick, help: str, type=int) -> None:
        """An option defaulting to ``full``, or ``quick`` with --quick; ``help`` may name
        them as ``{full}`` and ``{quick}``."""
        action = self.add_argument(
            flag, type=type, default=None, help=help.format(full=full, quick=quick)
        )
        self.sized[action.dest] = (full, quick)

    def add_repeat(self, full: int, quick: int) -> None:
        self.add_sized(
            "--repeat",
            full,
            quick,
            "timed rounds per contender (best-of-N); default {full}, quick {quick}",
        )

    def add_threads(self) -> None:
        """``--threads N``: BLAS (and every contender's own kernels) pinned to N threads,
        for every contender alike (see ``pin_threads``)."""
        self.add_argument(
            "--threads",
            type=int,
            default=None,
            help="pin BLAS to N threads for every contender: OMP_NUM_THREADS, "
            "OPENBLAS_NUM_THREADS, MKL_NUM_THREADS set before numpy loads "
            "(the benchmark restarts itself with them) and "
            "torch.set_num_threads(N); default: each library's own",
        )

    def add_out(self, benchmark: str) -> None:
        default = RESULTS / f"{benchmark}.json"
        self.add_argument(
            "--out",
            type=Path,
            default=default,
            help=f"JSON results path (default {default.relative_to(REPO)})",
        )

    def parse_args(self, args=None, namespace=None):
        ns = super().parse_args(args, namespace)
        for dest, (full, quick) in self.sized.items():
            if getattr(ns, dest) is None:
                setattr(ns, dest, quick if ns.quick else full)
        return ns


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pin_threads(threads, argv) -> dict:
    """Pins BLAS to ``threads`` threads (None: leaves each library's default) for every
    contender: the thread variables must be set before numpy loads its BLAS, so a process
    started without them restarts itself with them (only when run as a script: ``argv``
    None; a caller passing ``argv`` sets them itself). ``torch.set_num_threads`` is
    ``pin_torch``'s. Returns what the JSON and the output say about it."""
    if threads is None:
        return {"threads": None, "threads_note": "each library's default thread count"}
    want = str(threads)
    if any(os.environ.get(v) != want for v in THREAD_VARS):
        if argv is not None:
            raise SystemExit(
                f"--threads {threads}: set {', '.join(THREAD_VARS)}={want} in the "
                f"environment before numpy loads (or run the benchmark as a "
                f"script)"
            )
        for v in THREAD_VARS:
            os.environ[v] = want
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable] + sys.argv)
    return {
        "threads": threads,
        "threads_note": f"BLAS pinned to {threads} thread(s) for every contender: "
        f"{', '.join(THREAD_VARS)}={want} set before numpy loaded, "
        f"torch.set_num_threads({threads})",
    }


def pin_torch(torch, threads) -> None:
    """``torch.set_num_threads(threads)`` when the benchmark pins threads."""
    if torch is not None and threads is not None:
        torch.set_num_threads(threads)


# -- report --------------------------------------------------------------------------------


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


class Column:
    """A table column: the row's ``key`` times ``scale``, formatted ``spec`` and followed by
    ``suffix`` in ``width`` characters, or ``-`` where the row has no value."""

    def __init__(self, header, width, key, spec="", scale=None, suffix=""):
        self.header, self.width, self.key = header, width, key
        self.spec, self.scale, self.suffix = spec, scale, suffix

    def cell(self, row: dict) -> str:
        v = row.get(self.key)
        if v is None:
            return f"{'-':>{self.width}}"
        if self.scale is not None:
            v = v * self.scale
        return format(v, f">{self.width - len(self.suffix)}{self.spec}") + self.suffix


def status(row: dict) -> str:
    return "ok" if row["ok"] else "FAIL " + "; ".join(row["errors"] + row["check_failures"])[:80]


def print_table(
    rows: dict, columns: list, name_width: int, *, notes: bool = False, lead=()
) -> None:
    """Header, rule, then a line per row of ``rows`` (name -> ``summary()``): the name, the
    columns, the check; with ``notes``, the row's note on a line of its own. ``lead``:
    lines printed between the rule and the rows."""
    hdr = (
        f"  {'contender':<{name_width}}"
        + "".join(f"{c.header:>{c.width}}" for c in columns)
        + "  check"
    )
    print(hdr)
    print("  " + "-" * (len(hdr) - 2))
    for line in lead:
        print(line)
    for name, s in rows.items():
        print(f"  {name:<{name_width}}" + "".join(c.cell(s) for c in columns) + f"  {status(s)}")
        if notes and s.get("note"):
            print(f"  {'':<{name_width}}  ({s['note']})")


def document(benchmark: str, argv, quick: bool, check: str, warmup: str = "", **params) -> dict:
    """The head of a results document: the benchmark, its arguments (``argv``, None for the
    command line's), ``quick``, the ``params`` (sizes, rounds), how it is timed (``warmup``
    qualifies the warm-up, e.g. " on a shorter stream") and how every run is checked."""
    return {
        "benchmark": benchmark,
        "argv": sys.argv[1:] if argv is None else list(argv),
        "quick": quick,
        **params,
        "timing": "best of N interleaved rounds (order rotated each round) after one "
        f"untimed warm-up{warmup}; median recorded too",
        "check": check,
    }


def write(out: Path, result: dict, wall: float) -> None:
    """Writes a results document to ``out`` as JSON (its folder made if need be)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {out}  (wall time {wall:.1f} s)")


def finish(
    out: Path,
    result: dict,
    contenders: list,
    t_start: float,
    env: dict,
    wrong: str,
    rest: dict | None = None,
) -> int:
    """Completes ``result`` with ``all_checks_ok``, ``wall_time_s`` (since ``t_start``),
    ``environment`` and then ``rest``, writes it to ``out`` as JSON and returns the exit
    status: 0 when every contender is ok, else 1 with the failures on stderr (``wrong``:
    what a bad result is called)."""
    bad = [c for c in contenders if not c.ok]
    wall = time.perf_counter() - t_start
    result.update(all_checks_ok=not bad, wall_time_s=wall, environment=env, **(rest or {}))
    write(out, result, wall)
    if bad:
        print(f"ERROR: some contender failed or {wrong}:", file=sys.stderr)
        for c in bad:
            print(f"  {c.name}: {c.errors + c.check_failures}", file=sys.stderr)
        return 1
    return 0
