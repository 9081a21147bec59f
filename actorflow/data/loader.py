"""DataLoader with PyTorch's habits, run as an actor graph: a source of batches of indices
(a seeded shuffle, a new one per pass) and a loading stage that fetches the samples and
collates them, on ``workers`` threads at once (replicas), with ``buffers`` registers per
actor under an optional ``memory`` budget, so loading runs ahead of the consumer but never
further than its registers allow.

The same actors join another graph with ``actors_into`` (``nn.Graph.run(loader)``: the
step's op actors read the loading stage's register; one graph, no tensor per batch)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import numpy as np

from ..creation import _next_seed, from_numpy
from ..device import device as as_device
from ..errors import PlanError, ShapeError
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.graph.checks import check_buffers
from ..runtime.graph.device_acts import device_memory
from ..runtime.plan.spec import PieceSpec, Spec, flatten, unflatten
from ..runtime.sched.processes import OwnsProcesses
from ..tensor.meta import TensorMeta
from ..tensor.tensor import Tensor

if TYPE_CHECKING:
    from ..device import Device
    from ..runtime.graph.actors import Actor
    from ..runtime.observe.stats import RunStats
    from ..runtime.sched.processes import StageProcesses

    class _MapStyle(Protocol):
        """A map-style dataset as ``DataLoader`` reads it (``Dataset``, a list...)."""

        def __getitem__(self, index: int, /) -> Any: ...
        def __len__(self) -> int: ...


class Dataset:
    """Map-style: ``__len__`` and ``__getitem__(i)`` returning a sample (an array, a
    number, or a tuple/list/dict of them)."""

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__")

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define __len__")


class IterableDataset:
    """Iterable-style: ``__iter__`` yields samples (a new pass per call)."""

    def __iter__(self) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define __iter__")


class TensorDataset(Dataset):
    """Samples ``(a[i], b[i], ...)`` of arrays or tensors with the same first dim."""

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        self.arrays = [a.numpy() if isinstance(a, Tensor) else np.asarray(a) for a in arrays]
        n = {len(a) for a in self.arrays}
        if len(n) != 1:
            raise ValueError(
                f"TensorDataset: the arrays' first dims differ: {[len(a) for a in self.arrays]}"
            )

    def __getitem__(self, i: int) -> tuple[Any, ...]:
        return tuple(a[i] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])


def default_collate(samples: list[Any]) -> Any:
    """Stacks a list of samples leaf by leaf: arrays along a new first dim, numbers into
    an array; tuples, lists and dicts keep their structure."""
    first = samples[0]
    leaves0, structure = flatten(first)
    cols: list[list[Any]] = [[] for _ in leaves0]
    for s in samples:
        leaves, st = flatten(s)
        if st != structure:
            raise TypeError(
                f"collate: samples differ in structure ({type(first).__name__} "
                f"vs {type(s).__name__}); every sample must have the same form"
            )
        for c, leaf in zip(cols, leaves, strict=True):
            c.append(leaf.numpy() if isinstance(leaf, Tensor) else leaf)
    return unflatten(structure, [np.stack([np.asarray(v) for v in c]) for c in cols])


class DataLoader(OwnsProcesses):
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
            ``"auto"`` (chosen under the budget, as for ActorGraph). Every worker holds a
            register while it loads, so an int must be at least ``workers``; left out,
            ``max(2, workers)`` (PyTorch's ``prefetch_factor`` counts per worker too; not
            the plan's choice of ActorGraph's default: a batch's load is a long act, and
            more registers measured slower for a loader holding the GIL, 8.7 against
            7.2 ms a batch of PNG files on 2 threads); with ``processes``,
            ``2 * workers + 1`` (two batches in each worker's pipe, as PyTorch's default
            ``prefetch_factor=2``, and the one being read).
        memory: byte budgets per device for the batches in flight, as for ActorGraph
            (``{"cpu": "64MiB"}``).
        collate_fn: turns a list of samples into a batch (default: ``default_collate``).
        processes: load on ``workers`` worker processes instead of threads (PyTorch's
            workers, ``persistent_workers=True``): spawned at the first pass and kept
            across passes until ``close()`` (or garbage collection, or the interpreter's
            exit); each writes its batches straight into the loading stage's registers,
            which are shared memory, so only the indices cross a pipe. The dataset and
            ``collate_fn`` must pickle (cloudpickle when installed); the workers load them
            as they are at the first pass (again when either is another object). For
            loaders whose Python code holds the interpreter lock (decoding, augmenting).
        device: where batches arrive: ``"cpu"`` (default), or a device with its own memory
            (``"cuda:0"``): each batch is then copied there by a copy actor (``to_device``,
            host to device on the device's copy stream, ``buffers`` registers in device
            memory under ``memory``'s budget for it), while the next batches load, and
            comes as tensors on it.
    """

    # (set in __init__; declared for type checkers)
    dataset: Any
    map_style: bool
    batch_size: int
    shuffle: bool
    drop_last: bool
    workers: int
    collate_fn: Callable[[list[Any]], Any]
    seed: int
    epoch: int
    buffers: int | Literal["auto"] | None
    memory: dict[str, int | str | None] | None
    procs: StageProcesses | None
    _layout: list[PieceSpec | None]
    device: Device
    on_device: bool
    graph: ActorGraph

    def __init__(
        self,
        dataset: _MapStyle | Iterable[Any],
        batch_size: int = 1,
        shuffle: bool = False,
        drop_last: bool = False,
        workers: int = 0,
        buffers: int | Literal["auto"] | None = None,
        memory: dict[str, int | str | None] | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        seed: int | None = None,
        device: Device | str | None = None,
        processes: bool = False,
    ) -> None:
        if not isinstance(batch_size, numbers.Integral) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be an int >= 1, got {batch_size!r}")
        if not isinstance(workers, numbers.Integral) or not 0 <= workers <= 64:
            raise ValueError(f"DataLoader: workers must be an int from 0 to 64, got {workers!r}")
        for name, flag in (
            ("shuffle", shuffle),
            ("drop_last", drop_last),
            ("processes", processes),
        ):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"DataLoader: {name} must be True or False, got {flag!r}")
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(
                f"DataLoader: collate_fn must be a function of a list of samples, "
                f"got {collate_fn!r}"
            )
        if seed is not None and not isinstance(seed, numbers.Integral):
            raise TypeError(f"DataLoader: seed must be an int or None, got {seed!r}")
        self.map_style = hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")
        if not self.map_style and not hasattr(dataset, "__iter__"):
            raise TypeError(
                f"DataLoader: the dataset must define __len__ and __getitem__, or "
                f"__iter__; got {type(dataset).__name__}"
            )
        if shuffle and not self.map_style:
            raise ValueError(
                "DataLoader: shuffle needs a map-style dataset (__len__ and "
                "__getitem__); shuffle an iterable dataset yourself"
            )
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.drop_last, self.workers = shuffle, drop_last, int(workers)
        self.collate_fn = collate_fn or default_collate
        self.seed = int(seed) if seed is not None else _next_seed()
        self.epoch = 0
        if buffers is None and processes:  # (two in each worker's pipe, one read)
            buffers = 2 * self.workers + 1
        self.buffers = None if buffers is None else check_buffers(buffers, "DataLoader")
        if self.buffers not in (None, "auto") and self.buffers < self.workers:
            raise ValueError(
                f"DataLoader: buffers={buffers} is fewer than workers={workers}: "
                f"each worker holds a register (a batch) while it loads, so "
                f"{workers} workers need at least {workers}; give buffers >= "
                f"{workers}, or leave buffers out (it is then max(2, workers))"
            )
        if memory is not None and not isinstance(memory, dict):
            raise PlanError(
                f"DataLoader: memory takes a byte budget per device, e.g. "
                f"memory={{'cpu': {memory!r}}}, got {memory!r}"
            )
        self.memory = memory
        self.procs = None  # the worker processes (processes=True)
        if processes:
            if workers < 1:
                raise ValueError(
                    f"DataLoader: processes=True loads on worker processes, "
                    f"and workers={workers}; give workers >= 1 (the number of "
                    f"processes)"
                )
            if not self.map_style:
                raise ValueError(
                    "DataLoader: processes=True needs a map-style dataset "
                    "(__len__ and __getitem__): an iterable one is read in "
                    "order, here"
                )
            from ..runtime.sched.processes import StageProcesses

            self.procs = StageProcesses(self.workers, "DataLoader")
        self._layout = []  # (processes: the batch layout, found once)
        self.device = as_device(device if device is not None else "cpu")
        self.on_device = device_memory(self.device)
        if not self.on_device and self.device.type != "cpu":
            raise ValueError(
                f"DataLoader: device={str(self.device)!r}: batches come on the "
                f"host ('cpu') or on a device with its own memory ('cuda:0')"
            )
        self.graph = self._graph()[0]  # (checks the budgets now; each pass has its own
        #                                graph, so passes may overlap: zip(dl, dl))

    def _graph(self, to_device: bool = True) -> tuple:
        g = ActorGraph(memory=self.memory, buffers=self.buffers)
        if self.procs is not None and not self._layout:  # (declared: piece 0 is
            self._layout.append(self.layout())  # not loaded here)
        layout = self._layout[0] if self.procs is not None else None
        actors = self.actors_into(g, layout, to_device=to_device)
        assert actors.node is not None  # (actors_into sets it)
        g.sink(actors.node)
        return g, actors

    def actors_into(
        self, g: ActorGraph, layout: PieceSpec | None = None, to_device: bool = True
    ) -> LoaderActors:
        """Adds this loader's actors to ``g``: for a map-style dataset a ``sampler`` source
        (batches of indices) and a ``load`` stage on ``workers`` replicas (the samples,
        collated), for an iterable one a ``load`` source reading and collating in order.
        Each run of ``g`` is a new pass (epoch) of whole batches: the last, smaller one is
        left out of the run (a register has one size) for ``LoaderActors.rest``.

        Args:
            g: the graph to add to; its ``memory`` budget counts the loader's registers.
            layout: the batch layout to declare (``layout()``); else piece 0 sizes it.
            to_device: for a loader on a device (``device="cuda:0"``), a copy actor
                ``to_device`` after the loading actor copies each batch there.

        Returns:
            LoaderActors: its ``node`` is the actor whose register holds a batch."""
        actors = LoaderActors(self)
        actors.layout = layout
        buffers = self.buffers  # (left out: at least the workers, double buffered)
        if buffers is None:
            buffers = max(2, self.workers)
        out = unflatten(layout.structure, list(layout.specs)) if layout is not None else None
        if self.map_style:  # indices -> samples -> a batch, on the workers
            src = g.source(actors.batches, name="sampler", buffers=buffers)
            if self.procs is not None:  # (its processes write the registers)
                actors.node = g.actor(
                    actors.load, src, name="load", out=out, processes=self.procs, buffers=buffers
                )
            else:
                actors.node = g.actor(
                    actors.load,
                    src,
                    name="load",
                    out=out,
                    replicas=max(1, self.workers),
                    buffers=buffers,
                )
            actors.actors = [src, actors.node]
        else:  # an iterable is read in order: the source batches
            actors.node = g.source(actors.batches, name="load", out=out, buffers=buffers)
            actors.actors = [actors.node]
        if self.on_device and to_device:  # double-buffered: a batch's copy overlaps the
            actors.node = g.copy(
                actors.node,
                self.device,
                name="to_device",  # next load
                buffers=buffers,
            )
            actors.actors.append(actors.node)
        return actors

    @property
    def actors_key(self) -> tuple:
        """What the actors ``actors_into`` adds depend on: a loader with the same key may be
        read by them (``LoaderActors.bind``)."""
        return (self.map_style, self.workers, self.buffers, self.device, self.procs is not None)

    def layout(self) -> PieceSpec | None:
        """The layout of a whole batch, from metadata: with ``default_collate``, the first
        sample's arrays (their shapes and dtypes, a batch dim in front); with another
        ``collate_fn``, the first ``batch_size`` samples collated. None when a pass has no
        whole batch."""
        b, default = self.batch_size, self.collate_fn is default_collate
        want = 1 if default else b
        if self.map_style:
            first = [self.dataset[i] for i in range(want)] if len(self.dataset) >= b else []
        else:
            first = []
            for sample in self.dataset:
                first.append(sample)
                if len(first) == want:
                    break
        if len(first) < want:
            return None
        if not default:
            return PieceSpec.of(self.collate_fn(first), "DataLoader: collate_fn's batch")
        leaves, structure = flatten(first[0])
        specs = []
        for leaf in leaves:  # as default_collate stacks them
            if isinstance(leaf, Tensor):
                m = cast(TensorMeta, leaf._impl.meta)  # (a tensor's impl has its meta)
                specs.append(Spec((b,) + tuple(m.shape), m.dtype))
            else:
                a = np.asarray(leaf)
                specs.append(Spec((b,) + a.shape, a.dtype))
        return PieceSpec(structure, specs)

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
                yield idx[s : s + b]
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

    def __iter__(self) -> Iterator[Any]:
        if not self.on_device:
            for batch in self.iter_arrays():
                yield _tensors(batch)
            return
        self.graph, actors = g, actors = self._graph()
        yield from g.run()  # (the run's output: copies of the device registers)
        dev = str(self.device)
        for batch in actors.rest():
            yield _tensors(batch, dev)

    def iter_arrays(self) -> Iterator[Any]:
        """A new pass, as ``for batch in loader`` gives it, but each batch as ``collate_fn``
        gives it (numpy arrays, on the host whatever ``device``) rather than as tensors."""
        self.graph, actors = g, actors = self._graph(to_device=False)
        yield from g.run()
        yield from actors.rest()

    def stats(self) -> RunStats:
        """The last pass's per-actor statistics (``ActorGraph.stats``)."""
        return self.graph.stats()

    def close(self) -> None:
        """Ends the worker processes (``processes=True``); a pass after this is refused."""
        if self.procs is not None:
            self.procs.close()

    def __getstate__(self) -> dict:
        """What a worker process loads batches with: the loader without its graph and
        processes."""
        state = dict(self.__dict__)
        state["graph"] = state["procs"] = None
        return state


class LoaderActors:
    """What ``DataLoader.actors_into`` added to a graph, reading passes of ``loader``:
    ``node`` (the actor whose register holds a batch), ``actors`` (all of them)."""

    def __init__(self, loader: DataLoader):
        self.loader = loader
        self.key = loader.actors_key
        self.node: Actor | None = None
        self.actors: list = []
        self.layout: PieceSpec | None = None  # the declared layout of a batch, if any
        self.epoch = None  # the last run's pass, and what it left out
        self.tail: list = []

    def __getstate__(self) -> dict:
        """What a worker process needs to run ``load`` (processes=True): the loader (without
        its graph) and the declared layout."""
        return {"loader": self.loader, "key": self.key, "layout": self.layout}

    def process_key(self) -> tuple:
        """What ``load`` computes with: a worker loads it again when one of these is
        another object (``LoaderActors.bind`` to another loader)."""
        return (self.loader, self.loader.dataset, self.loader.collate_fn, self.layout)

    def bind(self, loader: DataLoader) -> None:
        """The next runs read passes of ``loader`` (whose ``actors_key`` is this one's)."""
        if loader.actors_key != self.key:
            raise ValueError(
                f"LoaderActors.bind: these actors were made for a loader of "
                f"(map_style, workers, buffers) = {self.key}, not "
                f"{loader.actors_key}; add the other loader's own actors"
            )
        self.loader = loader

    def batches(self):
        """The source's items in a run: a new pass (the loader's next epoch)."""
        loader = self.loader
        self.epoch, self.tail = loader.epoch, []
        loader.epoch += 1
        batches = loader._batches(self.epoch, self.tail)
        if loader.map_style or self.layout is None:
            return batches
        return (self._checked(b) for b in batches)

    def load(self, idx):
        batch = self.loader._load(idx)
        return batch if self.layout is None else self._checked(batch)

    def _checked(self, batch):
        """``batch``, if it has the declared layout (its arrays' shapes and dtypes, read
        from their metadata); else the error that names both and the fix."""
        want = self.layout
        leaves, structure = flatten(batch)
        if structure == want.structure and len(leaves) == len(want.specs):
            for a, s in zip(leaves, want.specs, strict=True):
                if type(a) is np.ndarray:
                    if a.shape != s.shape or a.dtype != s.dtype.np:
                        break
                elif Spec.of(a) != s:
                    break
            else:
                return batch
        got = PieceSpec(structure, [Spec.of(a) for a in leaves])
        raise ShapeError(
            f"DataLoader: a batch is {got.describe(False)} where the first batch "
            f"was {want.describe(False)}; a loader's whole batches share one "
            f"register layout: collate every batch to the same shapes and "
            f"dtypes (pad to a fixed length)"
        )

    def rest(self) -> list:
        """The batches the last run left out (its last, smaller one), collated."""
        loader = self.loader
        return [
            loader.collate_fn(r if kind == "samples" else [loader.dataset[int(i)] for i in r])
            for kind, r in self.tail
        ]

    def batch(self, piece: int):
        """Batch ``piece`` of the last run, loaded again (the same samples, collated); None
        for an iterable dataset (a pass cannot be read again)."""
        loader = self.loader
        if not loader.map_style or self.epoch is None:
            return None
        b = loader.batch_size
        return loader._load(loader.order(self.epoch)[piece * b : (piece + 1) * b])


def _tensors(batch, device=None):
    leaves, structure = flatten(batch)
    leaves = [
        from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a for a in leaves
    ]
    if device is not None:
        leaves = [a.to(device) if isinstance(a, Tensor) else a for a in leaves]
    return unflatten(structure, leaves)
