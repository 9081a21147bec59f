"""The experiments compare like with like (the same budgets per device for every contender,
peaks per device) and their pictures show what their tables show."""

import pytest

import actorflow as af
from actorflow.backends import get_backend
from actorflow.experiments import double_buffering, figure1, random_dags

MiB = 1 << 20


def null_spec(mib, device="null"):
    return af.Spec((mib * MiB // 4,), af.float32, device)


def test_null_devices_are_separate_devices_each_with_its_own_budget():
    assert str(af.device("null:1")) == "null:1" and af.device("null:1").index == 1
    assert af.device("null:0") is af.device("null") and str(af.device("null:0")) == "null"
    assert af.device("null:1") is not af.device("null")
    with pytest.raises(af.DeviceError, match="only index 0"):
        af.device("cpu:1")
    af.lowlevel.set_null_latency(0.25)  # one setting for every null device
    assert get_backend(af.device("null:1")).latency == 0.25
    af.lowlevel.set_null_latency(0.0)

    def graph(mib_on_1):
        g = af.ActorGraph(memory={"null": "4MiB", "null:1": "4MiB"}, buffers=1)
        a = g.source([None] * 2, out=null_spec(3), name="a")
        g.sink(g.actor(lambda x: None, a, out=null_spec(mib_on_1, "null:1"), name="b"))
        return g

    g = graph(3)  # 3 MiB on each: 6 MiB, no pool of 6
    assert {str(d): t for d, t in g.plan().totals.items()} == {"null": 3 * MiB, "null:1": 3 * MiB}
    assert len(list(g.run())) == 2
    m = g.stats().memory
    assert m["null"]["peak"] == m["null:1"]["peak"] == 3 * MiB
    assert m["null"]["budget"] == m["null:1"]["budget"] == 4 * MiB
    with pytest.raises(af.PlanError, match="does not fit the null:1 budget") as info:
        graph(5).plan()  # 5 MiB on null:1; null still fits
    assert info.value.device == "null:1" and info.value.actors == {"b": 5 * MiB}


def test_double_buffering_actors_get_the_naive_budgets_per_device():
    assert double_buffering.CAPACITY == {"cpu": 24 * MiB, "gpu": 24 * MiB}
    for b in (1, 2, 3):
        plan = double_buffering.actors(b, 2).plan()
        totals = {str(d): t for d, t in plan.totals.items()}
        assert totals == {"null": b * 8 * MiB, "null:1": b * 5 * MiB}
        assert {str(d): v for d, v in plan.budget.budgets.items()} == {
            "null": 24 * MiB,
            "null:1": 24 * MiB,
        }
    # four registers per stage need 32 MiB on the cpu side: refused there, as a 24 MiB
    # cpu pool would be, although both sides together (52 MiB) never met one pool of 48
    with pytest.raises(af.PlanError, match="budget is 24.0 MiB") as info:
        double_buffering.actors(4, 2).plan()
    assert info.value.device == "null" and info.value.needed == 32 * MiB


@pytest.fixture(scope="module")
def db_data():
    return double_buffering.run(pieces=12)


def test_double_buffering_reports_peaks_per_device(db_data):
    headers = db_data["headers"]
    assert "peak MiB" not in headers
    cpu, gpu = headers.index("peak cpu MiB"), headers.index("peak gpu MiB")
    rows = {r[0]: r for r in db_data["rows"]}
    assert (rows["naive (wait)"][cpu], rows["naive (wait)"][gpu]) == (24, 0)
    least = headers.index("minimum cpu/gpu MiB")
    for b in (1, 2, 3):
        r = rows[f"actors, buffers={b}"]
        assert (r[cpu], r[gpu]) == (8 * b, 5 * b)
        assert r[least] == f"{8 * b}/{5 * b}"  # sharing saves nothing in this chain
    assert rows["actors, buffers=4"][1] == "refused"
    assert "buffers=4 refused: sharing registers by lifetime" in db_data["table"]
    for r in db_data["rows"]:
        assert r[cpu] <= 24 and r[gpu] <= 24
    assert "peak cpu MiB  peak gpu MiB" in db_data["table"]
    assert "24 MiB on cpu" in db_data["table"] and "24 MiB on gpu" in db_data["table"]


def test_double_buffering_picture_names_the_runs_that_did_not_finish(db_data):
    bars = {b[0]: b for b in double_buffering.bars(db_data)}
    assert len(bars) == len(db_data["rows"])
    assert bars["naive (wait)"][1:3] == (0.0, "deadlock")
    assert bars["naive (fail)"][1:3] == (0.0, "out of memory")
    assert bars["actors, buffers=2"][3:] == (16, 10)


@pytest.fixture(scope="module")
def random_data():
    return random_dags.run(seed=0, n=30, size=6)


def test_random_picture_counts_every_dag_for_every_scheduler(random_data):
    stacks = dict(random_dags.stacks(random_data))
    assert len(stacks) == len(random_data["rows"])
    for label, counts in stacks.items():
        assert sum(counts.values()) == 30, label
    actors = stacks["actors / plan"]
    refused = next(r[5] for r in random_data["rows"] if r[0] == "actors")
    assert actors["refused"] == refused
    assert actors["deadlocked"] == actors["out of memory"] == 0


def test_random_actors_run_every_dag_at_the_exact_minimum(random_data):
    # every capacity is drawn at or above the exact minimum peak: actors run them all,
    # sharing registers where side by side they do not fit, and plan exactly that minimum
    plans = random_data["plans"]
    assert len(plans) == 30 and all("measured" in p for p in plans)
    shared = [p for p in plans if "edges" in p]
    assert shared and all(p["capacity"] < p["unshared"] for p in shared)
    for p in shared:
        assert p["planned"] == p["min_peak"] == p["measured"] <= p["capacity"]
        assert p["exact"]
    for p in plans:
        if "edges" not in p:
            assert p["planned"] == p["unshared"] <= p["capacity"]  # nothing changes
    head, row = random_data["plan_headers"], random_data["plan_row"]
    assert row[head.index("planned = exact minimum")] == len(shared)


def test_figure1_picture_has_every_row_of_the_table():
    data = figure1.run(seed=0, time=0.0005)
    bars = figure1.bars(data)
    assert [b[2] for b in bars] == [
        "ok",
        "ok",
        "deadlock",
        "out of memory",
        "ok, shared: 6 MiB of its 8 MiB",
        "refused: the plan needs 10.0 MiB",
        "ok, within its 10 MiB budget",
    ]
    assert data["min_peak"] == 6 * MiB
    assert [b[1] for b in bars] == [r[3] for r in data["rows"]]


# -- the pictures themselves (when matplotlib is installed) ----------------------------------


def _texts(fig):
    """Every visible text of a figure, after drawing it."""
    fig.canvas.draw()
    return [
        t.get_text()
        for t in fig.findobj(lambda a: hasattr(a, "get_text"))
        if t.get_visible() and t.get_text()
    ]


def _check_inside(fig):
    """Everything drawn (titles, labels, texts, legends) lies inside the figure."""
    texts = _texts(fig)
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches
    w, h = fig.get_size_inches()
    if not (box.x0 >= -0.01 and box.y0 >= -0.01 and box.x1 <= w + 0.01 and box.y1 <= h + 0.01):
        r = fig.canvas.get_renderer()
        out = [
            f"{type(a).__name__} {getattr(a, 'get_text', lambda: '')()!r}"
            for a in fig.findobj(lambda a: hasattr(a, "get_window_extent") and a.get_visible())
            if _outside(a, r, fig)
        ]
        raise AssertionError(
            f"{fig.get_suptitle()!r}: something drawn is cut off: {box} "
            f"outside {w}x{h} in: {out[:8]}"
        )
    return texts


def _outside(artist, renderer, fig):
    try:
        e = artist.get_window_extent(renderer)
    except Exception:  # noqa: BLE001 - artists without an extent
        return False
    W, H = fig.bbox.width, fig.bbox.height
    return e.width > 0 and (e.x0 < -1 or e.y0 < -1 or e.x1 > W + 1 or e.y1 > H + 1)


def test_pictures_show_their_tables_and_fit(db_data, random_data, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    fig = double_buffering.figure(db_data)
    texts = _check_inside(fig)
    assert "deadlock" in texts and "out of memory" in texts
    assert fig.get_suptitle().startswith("Figure 2")
    plt.close(fig)

    fig = random_dags.figure(random_data)
    texts = _check_inside(fig)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    row = labels.index("actors / plan")
    width = sum(
        p.get_width() for p in ax.patches if abs(p.get_y() + p.get_height() / 2 - row) < 1e-9
    )
    assert width == 30  # every DAG is drawn
    plt.close(fig)

    data = figure1.run(seed=0, time=0.0005)
    fig = figure1.figure(data)
    texts = _check_inside(fig)
    assert len(fig.axes[1].patches) == len(data["rows"])
    assert "refused: the plan needs 10.0 MiB" in texts
    plt.close(fig)
    assert double_buffering.plot(db_data, tmp_path / "d.png") and (tmp_path / "d.png").exists()


def test_figure1_fits_whatever_the_runs_took():
    # the runs' times vary with the machine: a fast one once put the annotation (placed
    # in data units) outside the figure
    pytest.importorskip("matplotlib")
    import copy

    import matplotlib.pyplot as plt

    data = figure1.run(seed=0, time=0.0005)
    for k in (0.001, 0.1, 10, 1000):
        d = copy.deepcopy(data)
        d["timelines"] = {n: [(t * k, a, b) for t, a, b in tl] for n, tl in d["timelines"].items()}
        fig = figure1.figure(d)
        _check_inside(fig)
        plt.close(fig)


def test_progress_bars_in_the_experiments(tmp_path, capsys):
    from actorflow.__main__ import main

    assert main(["experiments", "random", "--n", "3", "--progress", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "random DAGs: 100%" in err and "3/3" in err
    assert (
        main(
            [
                "experiments",
                "double-buffering",
                "--pieces",
                "6",
                "--progress",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    for b in (1, 2, 3):  # each actors run that fits draws its bar
        assert f"actors, buffers={b}: 100%" in err and "6/6" in err
    assert "actors, buffers=4" not in err  # refused by its plan: no run, no bar
