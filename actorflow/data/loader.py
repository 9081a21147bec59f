"""DataLoader with PyTorch's habits, run as an actor graph: a source of batches of indices
(a seeded shuffle, a new one per pass) and a loading stage that fetches the samples and
collates them, on ``workers`` threads at once (replicas), with ``buffers`` registers per
actor under an optional ``memory`` budget, so loading runs ahead of the consumer but never
further than its registers allow."""

from __future__ import annotations

import numbers

import numpy as np

from ..creation import _next_seed, from_numpy
from ..errors import PlanError
from ..runtime.graph.checks import check_buffers
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.plan.spec import flatten, unflatten
from ..tensor.tensor import Tensor


class Dataset:
    """Map-style: ``__len__`` and ``__getitem__(i)`` returning a sample (an array, a
    number, or a tuple/list/dict of them)."""

    def __getitem__(self, index):
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class IterableDataset:
    """Iterable-style: ``__iter__`` yields samples (a new pass per call)."""

    def __iter__(self):
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class TensorDataset(Dataset):
    """Samples ``(a[i], b[i], ...)`` of arrays or tensors with the same first dim."""

    def __init__(self, *arrays):
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        self.arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
        n = {len(a) for a in self.arrays}
        if len(n) != 1:
            raise ValueError(f"TensorDataset: the arrays' first dims differ: "
                             f"{[len(a) for a in self.arrays]}")

    def __getitem__(self, i):
        return tuple(a[i] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])


def default_collate(samples: list):
    """Stacks a list of samples leaf by leaf: arrays along a new first dim, numbers into
    an array; tuples, lists and dicts keep their structure."""
    first = samples[0]
    leaves0, structure = flatten(first)
    cols = [[] for _ in leaves0]
    for s in samples:
        leaves, st = flatten(s)
        if st != structure:
            raise TypeError(f"collate: samples differ in structure ({type(first).__name__} "
                            f"vs {type(s).__name__}); every sample must have the same form")
        for c, leaf in zip(cols, leaves):
            c.append(leaf.numpy() if isinstance(leaf, Tensor) else leaf)
    return unflatten(structure, [np.stack([np.asarray(v) for v in c]) for c in cols])


class DataLoader:
    """Batches of a dataset, a new pass per ``for`` loop.

    Args:
        dataset: map-style (``__len__``, ``__getitem__``) or iterable-style.
        batch_size: samples per batch.
        shuffle: a new random order per pass (map-style), seeded by ``seed`` (else by
            ``af.manual_seed``'s generator when the loader is made).
        drop_last: drop the last, smaller batch.
        workers: threads loading batches at once (replicas of the loading stage); 0 or 1
            load on one thread. Batches still come in order. (An iterable dataset is
            read, and batched, by the source actor, in order.)
        buffers: registers per actor (batches ready ahead of the consumer), an int >= 1 or
            ``"auto"`` (chosen under the budget, as for ActorGraph). The loading stage
            gets at least ``workers`` of them, so that every worker can hold a batch.
        memory: byte budgets per device for the batches in flight, as for ActorGraph
            (``{"cpu": "64MiB"}``).
        collate_fn: turns a list of samples into a batch (default: ``default_collate``).
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False,
                 drop_last: bool = False, workers: int = 0, buffers: int = 2, memory=None,
                 collate_fn=None, seed=None):
        if not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(workers, numbers.Integral) or not 0 <= workers <= 64:
            raise ValueError(f"DataLoader: workers must be an int from 0 to 64, got {workers!r}")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"DataLoader: {name} must be True or False, got {flag!r}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"DataLoader: collate_fn must be a function of a list of samples, "
                            f"got {collate_fn!r}")
        if seed is not None and not isinstance(seed, numbers.Integral):
            raise TypeError(f"DataLoader: seed must be an int or None, got {seed!r}")
        self.map_style = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        if not self.map_style and not hasattr(dataset, "__iter__"):
            raise TypeError(f"DataLoader: the dataset must define __len__ and __getitem__, or "
                            f"__iter__; got {type(dataset).__name__}")
        if shuffle and not self.map_style:
            raise ValueError("DataLoader: shuffle needs a map-style dataset (__len__ and "
                             "__getitem__); shuffle an iterable dataset yourself")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.drop_last, self.workers = shuffle, drop_last, int(workers)
        self.collate_fn = collate_fn or default_collate
        self.seed = int(seed) if seed is not None else _next_seed()
        self.epoch = 0
        self.buffers = check_buffers(buffers, "DataLoader")
        if memory is not None and not isinstance(memory, dict):
            raise PlanError(f"DataLoader: memory takes a byte budget per device, e.g. "
                            f"memory={{'cpu': {memory!r}}}, got {memory!r}")
        self.memory = memory
        self.graph = self._graph(0, [])     # (checks the budgets now; each pass has its
        #                                     own, so passes may overlap: zip(dl, dl))

    def _graph(self, epoch: int, tail: list) -> ActorGraph:
        g = ActorGraph(memory=self.memory, buffers=self.buffers)
        batches = lambda: self._batches(epoch, tail)        # noqa: E731 - fresh per run
        if self.map_style:              # indices -> samples -> a batch, on the workers
            src = g.source(batches, name="sampler")
            buffers = self.buffers if self.buffers == "auto" else max(self.buffers,
                                                                      self.workers)
            g.sink(g.actor(self._load, src, name="load", replicas=max(1, self.workers),
                           buffers=buffers))
        else:                           # an iterable is read in order: the source batches
            g.sink(g.source(batches, name="load"))
        return g

    def __len__(self) -> int:
        if not self.map_style:
            raise TypeError("len() of a DataLoader over an iterable dataset is unknown")
        n, b = len(self.dataset), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of pass ``epoch`` (the same for the same seed and epoch)."""
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    # -- the graph's source and stage -----------------------------------------------------
    def _batches(self, epoch: int, tail: list):
        """Whole batches only (a register has one size); the last, smaller one goes to
        ``tail`` for ``__iter__`` to load after the run."""
        b = self.batch_size
        if self.map_style:
            idx = self.order(epoch)
            full = len(idx) - len(idx) % b
            for s in range(0, full, b):
                yield idx[s:s + b]
            if full < len(idx) and not self.drop_last:
                tail.append(("idx", idx[full:]))
            return
        batch = []
        for sample in self.dataset:
            batch.append(sample)
            if len(batch) == b:
                yield self.collate_fn(batch)
                batch = []
        if batch and not self.drop_last:
            tail.append(("samples", batch))

    def _load(self, idx):
        return self.collate_fn([self.dataset[int(i)] for i in idx])

    def __iter__(self):
        epoch, tail = self.epoch, []
        self.epoch += 1
        self.graph = g = self._graph(epoch, tail)
        for batch in g.run():
            yield _tensors(batch)
        for kind, rest in tail:
            yield _tensors(self.collate_fn(
                rest if kind == "samples" else [self.dataset[int(i)] for i in rest]))

    def stats(self):
        """The last pass's per-actor statistics (``ActorGraph.stats``)."""
        return self.graph.stats()


def _tensors(batch):
    leaves, structure = flatten(batch)
    return unflatten(structure, [from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray)
                                 else a for a in leaves])
