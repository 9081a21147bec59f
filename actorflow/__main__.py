"""Command line: ``python -m actorflow demo`` and ``python -m actorflow experiments NAME``."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time


def demo() -> None:
    """The whole product in a few seconds: eager tensors on the VM, a pipeline of actors
    with its memory plan and stats, and the figure-1 deadlock of a data-driven scheduler
    named next to actors running the same graph."""
    _eager_demo()
    _pipeline_demo()
    _deadlock_demo()


def _pipeline_demo() -> None:
    import numpy as np

    import actorflow as af

    print("\n-- a pipeline of actors: every stage owns its output registers (credits) --")

    def load():
        for i in range(40):
            yield np.full((256, 256), i, np.float32)

    def normalize(x):
        return (x - x.mean()) / (x.std() + 1.0)

    pipe = af.Pipeline(
        [load, normalize, np.tanh],
        buffers=2,
        memory={"cpu": "4MiB"},
        names=["load", "normalize", "tanh"],
    )
    print(pipe.plan())
    n = sum(1 for _ in pipe.run())
    print(pipe.stats())
    assert n == 40


def _deadlock_demo() -> None:
    from .experiments import figure1

    print("\n-- figure 1: a scheduler that sees only data deadlocks; actors plan memory --")
    table = figure1.run(seed=0)["table"]
    for line in table.splitlines():  # the reasons are long: the gist of the others
        whole = " deadlock " in line
        print(line if whole or len(line) <= 150 else line[:150] + "...")


def _eager_demo() -> None:
    """The quickstart, end to end: eager ops, a sync point, async use, and VM statistics."""
    import numpy as np

    import actorflow as af

    x = af.tensor([[1.0, -1.0], [1.0, -1.0]])  # float32 on cpu by default
    y = af.relu(x)  # returns at once: the work is queued
    print("relu(x) =", y)
    z = (x @ x.T).sum(dim=1, keepdim=True) + 1
    print("(x @ x.T).sum(dim=1, keepdim=True) + 1 =", z.numpy().tolist())
    af.synchronize()

    async def main():  # inside a running event loop
        w = af.relu(x) * 2
        print("await (relu(x) * 2).numpy_async() =", (await w.numpy_async()).tolist())

    asyncio.run(main())

    a = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    t = af.from_numpy(a)
    start = time.perf_counter()
    for _ in range(2500):
        t = af.relu(t * 0.999 + 0.001) - 0.0005
    t.numpy()
    dt = time.perf_counter() - start
    print(f"a dependent chain of 10,000 ops on 1,000 floats: {dt * 1e6 / 10_000:.1f} us per op")
    s = af.lowlevel.vm_stats()
    print(
        f"vm: {s['issued']} instructions issued, {s['inlined']} ran inline, "
        f"{s['in_flight']} in flight; cpu peak {s['devices']['cpu']['peak']} bytes"
    )


def _count(what: str):
    """An argparse type: a whole number >= 1, refused with a message otherwise."""

    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{what} must be a whole number, got {text!r}"
            ) from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{what} must be at least 1, got {n}")
        return n

    return parse


def _writable_folder(parser, path: str, flag: str = "--out") -> None:
    """Refuses an --out (or ``flag``) folder that cannot be made or written, before
    anything runs."""
    import os
    from pathlib import Path

    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        parser.error(
            f"{flag} {path!r}: cannot make that folder ({e.strerror}); give a folder you can write"
        )
    if not os.access(folder, os.W_OK):
        parser.error(f"{flag} {path!r}: that folder is not writable; give one you can write")


def main(argv=None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="python -m actorflow")
    parser.add_argument("--version", action="version", version=f"actorflow {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="run the quickstart example")
    exp = sub.add_parser("experiments", help="reproduce the resource-dependency deadlock")
    exp.add_argument("name", choices=["figure1", "double-buffering", "random"])
    exp.add_argument("--seed", type=int, default=0, help="makes the run reproducible")
    exp.add_argument(
        "--out",
        default="experiments-out",
        help="folder for NAME.json and NAME.png (default experiments-out)",
    )
    exp.add_argument("--n", type=_count("--n"), default=None, help="random: how many DAGs (200)")
    exp.add_argument(
        "--pieces",
        type=_count("--pieces"),
        default=None,
        help="double-buffering: pieces through the pipeline (60)",
    )
    exp.add_argument(
        "--timeline",
        metavar="DIR",
        default=None,
        help="figure1, double-buffering: write each actors run's trace to DIR "
        "and draw it as a timeline PNG (acts, waits, memory in use)",
    )
    exp.add_argument(
        "--progress",
        action="store_true",
        help="double-buffering, random: progress bars (tqdm: pip install "
        "'actorflow[progress]'), with each actors run's bottleneck",
    )
    args = parser.parse_args(argv)
    if args.command == "experiments":
        _writable_folder(exp, args.out)
        if args.timeline is not None:
            if args.name == "random":
                exp.error(
                    "--timeline: the random experiment writes no trace; use it with "
                    "figure1 or double-buffering"
                )
            _writable_folder(exp, args.timeline, "--timeline")
    if args.command == "demo":
        demo()
    elif args.command == "experiments":
        from .experiments import main as run_experiment

        kw = {}
        if args.n is not None and args.name == "random":
            kw["n"] = args.n
        if args.pieces is not None and args.name == "double-buffering":
            kw["pieces"] = args.pieces
        if args.progress:
            kw["progress"] = True
        if args.timeline is not None:
            from .plots import plot_timeline

            kw.update(timeline=args.timeline, draw=plot_timeline)
        run_experiment(args.name, seed=args.seed, out=args.out, **kw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
