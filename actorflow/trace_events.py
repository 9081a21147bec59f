"""Chrome trace events (what ui.perfetto.dev and chrome://tracing open), built from plain
records: the one builder behind a run's timeline (``run(trace=...)``,
``runtime/timeline.py``), the eager VM's profile (``af.profile()``,
``vm/profile_events.py``) and a Ray run's merged trace (``distributed/report.py``). Each
of those reads its own records and says what they are; this module says how an event is
written.

Events are kept as their JSON text, one string per event, made with f-strings: a trace
holds an event or four per act, and building a dict per event to dump it costs about
twice as much as formatting it directly. ``events()`` parses that text back, so the
events a caller is handed and the file written are the same by construction.

The file: ``{"displayTimeUnit": "ms", "otherData": {...} (when given), "traceEvents":
[...]}``, one event per line, the metadata events (``ph: "M"``: process and thread names,
thread order) first. Times (``ts``, ``dur``) are microseconds from ``t0``, rounded to the
nanosecond.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as quote  # a str as JSON, as dumps does
from pathlib import Path

_dumps = json.JSONEncoder(separators=(",", ":")).encode


class _Quoted(dict):
    """Names and categories as JSON text, each made once (they repeat on every event)."""

    def __missing__(self, s: str) -> str:
        q = self[s] = quote(s)
        return q


class TraceEvents:
    """The events of one trace, in the order added (metadata first when written).

    Names and categories are plain strings; ``args`` is a dict, or, where a loop writes
    many events, its JSON text already (``'{"piece":3}'``); ``pid`` and ``tid`` are ints,
    the process and the track an event is drawn on. ``ts`` (an event's time) and ``dur``
    are microseconds, ``ts`` from ``t0`` (``us(t)`` turns a ``perf_counter`` time into
    one); a time that goes on several events may be given as its text (``repr(ts)``):
    formatting a float is the largest part of writing an event."""

    def __init__(self, t0: float = 0.0):
        self.t0 = t0
        self.head: list = []  # metadata events, JSON text
        self.body: list = []  # every other event, JSON text
        self.quoted = _Quoted()

    def __len__(self) -> int:
        return len(self.head) + len(self.body)

    def us(self, t: float) -> float:
        """``t`` (seconds, the clock ``t0`` is on) as microseconds from ``t0``."""
        return round((t - self.t0) * 1e6, 3)

    def process(self, pid: int, name: str, **args) -> None:
        """Names process ``pid`` (``args``: more to show with the name)."""
        self.head.append(
            f'{{"ph":"M","name":"process_name","ts":0,"pid":{pid},"tid":0,'
            f'"args":{_dumps({"name": name, **args})}}}'
        )

    def thread(self, pid: int, tid: int, name: str, sort: int | None = None) -> None:
        """Names track ``tid`` of process ``pid``; ``sort``: its place among the tracks."""
        add = self.head.append
        add(
            f'{{"ph":"M","name":"thread_name","ts":0,"pid":{pid},"tid":{tid},'
            f'"args":{{"name":{quote(name)}}}}}'
        )
        if sort is not None:
            add(
                f'{{"ph":"M","name":"thread_sort_index","ts":0,"pid":{pid},"tid":{tid},'
                f'"args":{{"sort_index":{sort}}}}}'
            )

    def complete(
        self, pid: int, tid: int, cat: str, name: str, ts: float | str, dur: float | str, args
    ) -> None:
        """A complete event (``ph: "X"``): from ``ts`` for ``dur``."""
        if args.__class__ is not str:
            args = _dumps(args)
        q = self.quoted
        self.body.append(
            f'{{"ph":"X","cat":{q[cat]},"name":{q[name]},"ts":{ts},'
            f'"dur":{dur},"pid":{pid},"tid":{tid},"args":{args}}}'
        )

    def flow(
        self, pid: int, tid: int, cat: str, name: str, id, ts: float | str, start: bool
    ) -> None:
        """One end of a flow arrow ``id`` (an int or a str): its start (``ph: "s"``, on the
        event that ends there) or an end (``ph: "f"``, bound to the event that starts
        there)."""
        ph = '"s"' if start else '"f","bp":"e"'
        q = self.quoted
        self.body.append(
            f'{{"ph":{ph},"cat":{q[cat]},"name":{q[name]},'
            f'"id":{id if id.__class__ is int else quote(id)},"ts":{ts},'
            f'"pid":{pid},"tid":{tid}}}'
        )

    def counter(self, pid: int, tid: int, name: str, ts: float | str, args) -> None:
        """A counter (``ph: "C"``): its values at ``ts`` (``args``, ``{series: number}``)."""
        if args.__class__ is not str:
            args = _dumps(args)
        self.body.append(
            f'{{"ph":"C","name":{self.quoted[name]},"ts":{ts},"pid":{pid},'
            f'"tid":{tid},"args":{args}}}'
        )

    def series(self, pid: int, tid: int, name: str, key: str, times, values) -> None:
        """A counter's values over time: ``{key: values[i]}`` at ``times[i]``."""
        head = f'{{"ph":"C","name":{self.quoted[name]},"pid":{pid},"tid":{tid},"ts":'
        tail = f',"args":{{{quote(key)}:'
        self.body += [f"{head}{ts}{tail}{v}}}}}" for ts, v in zip(times, values, strict=True)]

    def events(self) -> list:
        """The events as dicts (Chrome trace format), metadata first: what ``write``
        writes."""
        return json.loads("[" + ",".join(self.head + self.body) + "]")

    def write(self, path, other: dict | None = None) -> Path:
        """Writes the trace to ``path`` (a folder missing on the way is made), with
        ``other`` as its ``otherData`` when given; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            f.write('{"displayTimeUnit":"ms",')
            if other:
                f.write(f'"otherData":{json.dumps(other)},')
            f.write('"traceEvents":[\n')
            f.write(",\n".join(self.head + self.body))
            f.write("\n]}\n")
        return path
