"""``af.parallel.record()``: what global calls did, as a list of plain records: each op call
with the layouts of its inputs and the signature it ran under, and each boxing conversion
(which collective, the logical shape, the bytes it moved between ranks). Boxing is where
a global program's communication happens, so this is the place to see it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

OPEN: list = []  # the recordings open now (nested ones each get every record)

COLLECTIVE = {  # (from kind, to kind) -> the collective a conversion is
    ("S", "B"): "all-gather",
    ("S", "S"): "all-to-all",
    ("P", "B"): "all-reduce",
    ("P", "S"): "reduce-scatter",
    ("B", "S"): "slice",
    ("B", "P"): "zeros on other ranks",
    ("S", "P"): "pad with zeros",
}


class Call(NamedTuple):
    """A global op call: ``op``, the layouts its inputs had, and the signature it ran."""

    op: str
    given: tuple
    ins: tuple
    outs: tuple

    def __str__(self) -> str:
        def fmt(sbps):
            return ", ".join(map(str, sbps))

        boxed = "" if self.given == self.ins else f" (given {fmt(self.given)})"
        return f"{self.op}: {fmt(self.ins)} -> {fmt(self.outs)}{boxed}"


class Boxing(NamedTuple):
    """A conversion of a global tensor's layout: ``src`` -> ``dst`` over ``ranks`` ranks,
    ``collective`` its name, ``moved`` the bytes sent between ranks."""

    src: Any
    dst: Any
    shape: tuple
    dtype: Any
    ranks: int
    collective: str
    moved: int

    def __str__(self) -> str:
        return (
            f"boxing {self.src} -> {self.dst} ({self.collective}) of {self.dtype}"
            f"{list(self.shape)} over {self.ranks} ranks: {self.moved} bytes moved"
        )


class Recording:
    """The records of a ``record()`` block, in call order (``calls``: ``Call`` and
    ``Boxing`` records); ``summary()`` counts the conversions and the bytes they moved."""

    def __init__(self) -> None:
        self.calls: list = []

    def boxings(self) -> list:
        return [c for c in self.calls if isinstance(c, Boxing)]

    def summary(self) -> str:
        lines = [f"{len(self.calls) - len(self.boxings())} global op calls"]
        by: dict = {}
        for b in self.boxings():
            n, moved = by.get((str(b.src), str(b.dst), b.collective), (0, 0))
            by[(str(b.src), str(b.dst), b.collective)] = (n + 1, moved + b.moved)
        for (src, dst, what), (n, moved) in sorted(by.items()):
            lines.append(f"{n} x {src} -> {dst} ({what}): {moved} bytes moved")
        return "\n".join(lines)

    def __str__(self) -> str:
        return "\n".join(map(str, self.calls))


def note(rec: Any) -> None:
    for r in OPEN:
        r.calls.append(rec)


@contextmanager
def record() -> Iterator[Recording]:
    """Records every global op call and boxing conversion made inside the block.

    Example::

        with af.parallel.record() as rec:
            loss = model(x).sum()
        print(rec.summary())  # "12 global op calls\\n1 x P -> B (all-reduce): ..."
    """
    r = Recording()
    OPEN.append(r)
    try:
        yield r
    finally:
        OPEN.remove(r)
