"""A pipelined training script: loader -> preprocess -> train step, eager and graph mode.

It makes a classification task (Gaussian clusters, 10 classes in 64 dims), then trains
an MLP 64-128-10 with Adam for a few epochs twice: in eager mode (a plain loop over an
``af.data.DataLoader`` whose loading and preprocessing run on worker threads ahead of
the loop) and in graph mode (``nn.Graph``: the step traced once, run as an op actor behind
the loader, so batch i+1 loads while batch i trains). Loss and accuracy per epoch, with
a progress bar. About a second on 2 cores.

    python examples/train_mlp.py [--epochs 3] [--samples 8192]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time

import numpy as np

import actorflow as af
from actorflow import nn, optim
from actorflow.data import DataLoader, Dataset

CLASSES, DIM, HIDDEN, BATCH = 10, 64, 128, 128


def make_task(n: int, seed: int = 0):
    """``n`` samples of 10 Gaussian clusters in 64 dims: features float32, labels int64."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 1.0, (CLASSES, DIM))
    y = rng.integers(0, CLASSES, n)
    x = (centers[y] + rng.normal(0, 2.5, (n, DIM))).astype(np.float32)
    return x, y


class Clusters(Dataset):
    """Samples of the task; ``__getitem__`` preprocesses (standardizes) each one, with the
    training set's statistics."""

    def __init__(self, x, y, mean=None, std=None):
        self.x, self.y = x, y
        self.mean = x.mean(0) if mean is None else mean
        self.std = x.std(0) if std is None else std

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return (self.x[i] - self.mean) / self.std, self.y[i]


def model_and_optimizer(seed: int):
    af.manual_seed(seed)
    model = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, CLASSES))
    return model, optim.Adam(model.parameters(), lr=2e-3)


class TrainStep(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss(self.model(x), y)
        loss.backward()
        return loss


def progress(done: int, total: int, loss: float, t0: float) -> None:
    width = 30
    fill = int(width * done / total)
    rate = done / max(time.perf_counter() - t0, 1e-9)
    sys.stdout.write(
        f"\r  [{'#' * fill}{'.' * (width - fill)}] {done}/{total} "
        f"loss {loss:.4f} {rate:.0f} batches/s"
    )
    sys.stdout.flush()


def accuracy(model, data: Clusters) -> float:
    with af.no_grad():
        x = af.tensor((data.x - data.mean) / data.std)
        pred = model(x).argmax(dim=1).numpy()
    return float((pred == data.y).mean())


def have_tqdm() -> bool:
    return importlib.util.find_spec("tqdm") is not None


def train(mode: str, train_set, test_set, epochs: int, bar: bool = False) -> tuple:
    model, opt = model_and_optimizer(seed=0)
    loader = DataLoader(
        train_set, batch_size=BATCH, shuffle=True, seed=0, drop_last=True, workers=2, buffers=4
    )
    loss_fn = nn.CrossEntropyLoss()
    step = TrainStep(model, opt) if mode == "graph" else None
    print(f"{mode} mode:")
    first = last = None
    t_all = time.perf_counter()
    for epoch in range(epochs):
        t0 = time.perf_counter()
        total, losses = len(loader), []
        if step is None:
            batches = loader
            if bar:
                from tqdm import tqdm

                batches = tqdm(loader, desc=f"  epoch {epoch + 1}", unit="batch")
            for x, y in batches:
                opt.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.item())
                if not bar:
                    progress(len(losses), total, losses[-1], t0)
        else:
            # with a bar: actorflow's own (tqdm), with pieces/s and the run's bottleneck
            shown = {"desc": f"  epoch {epoch + 1}", "unit": "batch"} if bar else False
            for loss in step.run(loader, buffers=2, memory={"cpu": "64MiB"}, progress=shown):
                losses.append(float(loss))
                if not bar:
                    progress(len(losses), total, losses[-1], t0)
        mean = float(np.mean(losses))
        first = mean if first is None else first
        last = mean
        print(
            f"\n  epoch {epoch + 1}: loss {mean:.4f}, test accuracy "
            f"{accuracy(model, test_set):.1%} ({time.perf_counter() - t0:.1f} s)"
        )
    return first, last, accuracy(model, test_set), time.perf_counter() - t_all


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument(
        "--progress",
        choices=["auto", "bar", "line"],
        default="auto",
        help="bar: tqdm progress bars (graph mode: actorflow's, with the "
        "bottleneck); line: a plain line; auto: bar when tqdm is installed",
    )
    args = p.parse_args(argv)
    if args.epochs < 1 or args.samples < BATCH:
        p.error(f"--epochs must be >= 1 and --samples >= {BATCH}")
    x, y = make_task(args.samples + 2048, seed=1)
    train_set = Clusters(x[: args.samples], y[: args.samples])
    test_set = Clusters(x[args.samples :], y[args.samples :], train_set.mean, train_set.std)
    bar = args.progress == "bar" or args.progress == "auto" and have_tqdm()
    results = {
        mode: train(mode, train_set, test_set, args.epochs, bar) for mode in ("eager", "graph")
    }
    for mode, (first, last, acc, secs) in results.items():
        print(f"{mode}: loss {first:.4f} -> {last:.4f}, test accuracy {acc:.1%}, {secs:.1f} s")
    same = results["eager"][1] == results["graph"][1]
    print("eager and graph mode give the same losses:", same)
    return 0 if same and all(r[1] < r[0] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
