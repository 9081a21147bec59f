"""A 4-stage pipeline on Ray: its CPU-heavy preprocess stage replicated over Ray worker
processes, its two cheap stages grouped in one process (one Ray call per batch for both),
the outputs equal to the same graph run in this process.

    load (driver) -> preprocess (pure Python, 2 replicas) -> [augment -> features]

Run: ``python examples/ray_pipeline.py`` (needs ``pip install 'actorflow[ray]'``; starts a
local Ray cluster of 2 CPUs, or joins ``--address``).
"""

import argparse
import sys
import time

import numpy as np

import actorflow as af

SIZE = 32768


def load():
    rng = np.random.default_rng(0)
    for _ in range(PIECES[0]):
        yield rng.standard_normal(SIZE).astype(np.float32)


def preprocess(x):
    """CPU-heavy and GIL-bound: a running sum in plain Python (a tokenizer, a parser...)."""
    acc, out = 0.0, np.empty_like(x)
    for i, v in enumerate(x.tolist()):
        acc = 0.9 * acc + v
        out[i] = acc
    return out


def augment(x):
    return np.clip(x, -3, 3) * np.float32(0.5)


def features(x):
    return np.stack([x.mean(), x.std(), x.min(), x.max()]).astype(np.float32)


PIECES = [64]


def graph() -> af.ActorGraph:
    g = af.ActorGraph(buffers=2)
    x = g.source(load, name="load", out=af.Spec((SIZE,), af.float32))
    x = g.actor(preprocess, x, name="preprocess", replicas=2, out=af.Spec((SIZE,), af.float32))
    x = g.actor(augment, x, name="augment", out=af.Spec((SIZE,), af.float32))
    g.sink(g.actor(features, x, name="features", out=af.Spec((4,), af.float32)))
    return g


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pieces", type=int, default=64)
    p.add_argument("--address", default=None, help="a Ray cluster to join")
    args = p.parse_args(argv)
    PIECES[0] = args.pieces
    g = graph()
    t = time.perf_counter()
    local = [o.copy() for o in g.run()]
    t_local = time.perf_counter() - t
    print(f"local: {len(local)} pieces in {t_local:.2f} s")
    engine = af.distributed.RayEngine(
        address=args.address,
        init={"num_cpus": 2},
        placement={
            "preprocess": {"num_cpus": 0.5},  # 2 replicas: 1 CPU in all
            "light": {"num_cpus": 0.5},
        },  # the group: one process
        groups={"light": ["augment", "features"]},
        memory={"node:0": "8MiB"},
    )
    t = time.perf_counter()
    remote = list(g.run(engine=engine))
    t_ray = time.perf_counter() - t
    stats = g.stats()
    print(f"ray:   {len(remote)} pieces in {t_ray:.2f} s (Ray actor processes started in the run)")
    print(stats)
    for name in ("preprocess", "augment", "features"):
        row = stats.actors[name]
        print(
            f"  {name}: processes {row['processes']}, acts in a call sent for the stage "
            f"before it: {row['fused_acts']}"
        )
    same = len(local) == len(remote) and all(
        np.array_equal(a, b) for a, b in zip(local, remote, strict=True)
    )
    print("outputs equal to the local run:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
