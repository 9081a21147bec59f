"""trace_events.TraceEvents, the one builder of Chrome trace events (run(trace=...),
af.profile(), a Ray run's trace): the events it hands back are the ones it writes, names
are quoted as JSON, metadata comes first, times given as text stay the same numbers."""

import json

from actorflow.trace_events import TraceEvents


def sample() -> TraceEvents:
    tr = TraceEvents(t0=10.0)
    tr.complete(1, 1, "act", 'lo"ad\\1', tr.us(10.000002), 1.5, {"piece": 0, "é": [1, 2]})
    tr.flow(1, 1, "register", "register", 'lo"ad\\1/0', repr(tr.us(10.0000035)), True)
    tr.flow(1, 2, "register", "register", 'lo"ad\\1/0', 4.0, False)
    tr.flow(1, 2, "flow", "blob", 7, 4.0, False)
    tr.counter(1, 2, "s free registers", "4.0", '{"free":1}')
    tr.series(1, 0, "memory cpu", "bytes in use", [0.0, 2.0, 5.5], [0, 64, 0])
    tr.process(1, "actorflow run", waits_left_out=3)
    tr.thread(1, 1, 'lo"ad\\1', sort=1)
    tr.thread(1, 0, "memory")
    return tr


def test_the_events_handed_back_are_the_ones_written(tmp_path):
    tr = sample()
    path = tr.write(tmp_path / "sub" / "t.json", {"memory": {"cpu": {"planned": 64}}})
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ms"
    assert doc["otherData"] == {"memory": {"cpu": {"planned": 64}}}
    assert doc["traceEvents"] == tr.events()
    assert len(tr) == len(tr.events()) == 12
    assert "otherData" not in json.loads(tr.write(tmp_path / "plain.json").read_text())


def test_each_kind_of_event_has_the_chrome_fields():
    evs = sample().events()
    assert [e["ph"] for e in evs[:4]] == ["M"] * 4  # metadata first, as added
    assert evs[0] == {
        "ph": "M",
        "name": "process_name",
        "ts": 0,
        "pid": 1,
        "tid": 0,
        "args": {"name": "actorflow run", "waits_left_out": 3},
    }
    assert evs[1]["args"] == {"name": 'lo"ad\\1'} and evs[2]["args"] == {"sort_index": 1}
    act, start, end, blob, free = evs[4:9]
    assert act == {
        "ph": "X",
        "cat": "act",
        "name": 'lo"ad\\1',
        "ts": 2.0,
        "dur": 1.5,
        "pid": 1,
        "tid": 1,
        "args": {"piece": 0, "é": [1, 2]},
    }
    assert start == {
        "ph": "s",
        "cat": "register",
        "name": "register",
        "id": 'lo"ad\\1/0',
        "ts": 3.5,
        "pid": 1,
        "tid": 1,
    }
    assert end["ph"] == "f" and end["bp"] == "e" and end["id"] == start["id"]
    assert blob["id"] == 7
    assert free == {
        "ph": "C",
        "name": "s free registers",
        "ts": 4.0,
        "pid": 1,
        "tid": 2,
        "args": {"free": 1},
    }
    assert [(e["ts"], e["args"]["bytes in use"]) for e in evs[9:]] == [
        (0.0, 0),
        (2.0, 64),
        (5.5, 0),
    ]
