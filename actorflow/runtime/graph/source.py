"""Source actors: the first actor of a chain, yielding the items of an iterable, an async
iterable or a zero-argument callable returning one (called at the start of each run)."""

from __future__ import annotations

import inspect

from ..plan.registers import EOS
from ..sched.loop import run_on_graph_loop
from .actors import Actor, Sized


def _one_shot(src) -> bool:
    """An iterator (a generator object...): iterating it again gives what is left of it."""
    if isinstance(src, type):
        return False
    if hasattr(src, "__next__") and hasattr(src, "__iter__"):
        return True
    return hasattr(src, "__anext__") and hasattr(src, "__aiter__")


def source_words(name: str, piece: int, fed: bool = False) -> str:
    """Which source gave ``piece``, as errors say it (``fed``: from ``run(feed=...)``)."""
    if fed:
        return f"run(feed=...) item {piece} (for {name!r})"
    return f"source {name!r} (piece {piece})"


def open_items(src, name: str):
    """The iterator a source reads in a run: ``src`` called first when it is a factory (a
    zero-argument callable, a class too), then iterated (``__aiter__`` for an async one)."""
    if isinstance(src, type) or (
        callable(src) and not hasattr(src, "__iter__") and not hasattr(src, "__aiter__")
    ):
        src = src()  # a factory: a fresh iterable per run
    if hasattr(src, "__aiter__"):
        return src.__aiter__()
    if hasattr(src, "__iter__"):
        return iter(src)
    raise TypeError(f"source {name!r}: the callable returned {type(src).__name__}, not an iterable")


async def _next_of(it):
    return await it.__anext__()


class SourceActor(Actor):
    """Yields the items of ``source``: an iterable, an async iterable, or a zero-argument
    callable returning one (called at the start of each run)."""

    kind = "source"

    def __init__(self, name, source, fed: bool = False, one_argument: bool = False, **kw):
        """``fed``: its pieces come from ``run(feed=...)`` (``source`` is unused then);
        ``one_argument``: its items are argument tuples of a function of one argument (a
        traced function's inputs): ``(x,)`` is taken as ``x``, as ``(x, w)`` is for two."""
        super().__init__(name, [], **kw)
        if not fed and not (
            callable(source) or hasattr(source, "__iter__") or hasattr(source, "__aiter__")
        ):
            raise TypeError(
                f"source {name!r}: expected an iterable, an async iterable or a "
                f"zero-argument callable returning one, got {type(source).__name__}"
            )
        self.source = None if fed else source
        self.fed = fed
        self.it = None
        self.is_async = False
        self.spent = False  # a one-shot iterator an earlier run used (and closed)
        self.single_argument = one_argument

    def start(self) -> None:
        """Opens the source for a run (the plan's probe may have opened it already)."""
        if self.it is not None:
            return
        src = self.source
        if self.spent and _one_shot(src):
            raise ValueError(
                f"source {self.name!r} is a one-shot iterator ({type(src).__name__}) that an "
                f"earlier run (or plan) used up; give the graph something it can iterate again: a "
                f"function returning a fresh iterator (g.source(read_batches), not "
                f"g.source(read_batches())), or a list"
            )
        self.it = open_items(src, self.name)
        self.is_async = hasattr(self.it, "__anext__")

    def _what(self, piece: int) -> str:
        return source_words(self.name, piece, self.fed)

    def close(self) -> None:
        it, self.it = self.it, None
        if it is not None and _one_shot(self.source):
            self.spent = True
        self.cached.clear()
        if it is not None and hasattr(it, "close") and not inspect.isasyncgen(it):
            try:
                it.close()
            except Exception:  # noqa: BLE001 - a generator's own cleanup failed; run is over
                pass

    def probe(self, ins):
        self.start()
        if 0 in self.cached:  # read by an earlier plan() of this graph
            return self.cached[0]
        try:
            if self.is_async:  # read on the graph loop (plan() is plain code)
                value = run_on_graph_loop(_next_of(self.it))
            else:
                value = next(self.it)
        except (StopIteration, StopAsyncIteration):
            return EOS
        if self.single_argument:
            value = one_argument(value)
        return self._checked_leaves(value, self._what(0))

    def compute(self, piece, ins, outs):
        if outs is None and piece in self.cached:
            return Sized(self.cached.pop(piece))  # read by plan(), sizing the run now
        if outs is not None and self._copy_cached(piece, outs):
            return None
        try:
            value = next(self.it)
        except StopIteration:
            return EOS
        if self.single_argument:
            value = one_argument(value)
        return self._put(value, outs, self._what(piece))

    async def compute_async(self, piece, ins, outs):
        if outs is None and piece in self.cached:
            return Sized(self.cached.pop(piece))
        if outs is not None and self._copy_cached(piece, outs):
            return None
        try:
            value = await self.it.__anext__()
        except StopAsyncIteration:
            return EOS
        if self.single_argument:
            value = one_argument(value)
        return self._put(value, outs, self._what(piece))


def one_argument(item):
    """An item of a one-argument function's source: a 1-tuple ``(x,)`` is its argument
    ``x`` (a tuple of arguments, as for a function of several); anything else is as given."""
    if type(item) is tuple and len(item) == 1:
        return item[0]
    return item
