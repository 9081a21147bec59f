"""Stages and loaders in worker processes (``processes=``): kept across runs, registers in
shared memory written in place by the workers, credits counted by the scheduler here."""

import gc
import mmap
import os
import signal
import threading

import numpy as np
import pytest

import actorflow as af

pytestmark = pytest.mark.timeout(60)


class Samples(af.data.Dataset):
    """Sample i: 1024 float32 of value i, and i (a batch of 8 is 32 KiB of x)."""

    def __len__(self):
        return 29

    def __getitem__(self, i):
        return np.full((1024,), i, np.float32), i


class DieOnce:
    """Adds 1; on the piece whose value is 3, while ``marker`` exists, removes it and kills
    its own process (SIGKILL): the first run loses a worker, the next runs do not."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __call__(self, x):
        if x[0, 0] == 3 and os.path.exists(self.marker):
            os.remove(self.marker)
            os.kill(os.getpid(), signal.SIGKILL)
        return x + 1


def pid_of(x):
    return np.array([os.getpid()], np.int64)


def add_one(x):
    return x + 1


def wrong_shape(x):
    return np.zeros((2, 2), np.float32) if x[0, 0] == 2 else x + 1


PIECES = [np.full((4, 3), i, np.float32) for i in range(6)]


@pytest.fixture(scope="module")
def made():
    """The shared-memory blocks made meanwhile, by name (each must be gone from /dev/shm)."""
    from multiprocessing import shared_memory

    names, base = [], shared_memory.SharedMemory

    class Recorded(base):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            names.append(self.name)

    shared_memory.SharedMemory = Recorded
    yield names
    shared_memory.SharedMemory = base


@pytest.fixture(scope="module")
def loader(made):
    dl = af.data.DataLoader(
        Samples(), batch_size=8, shuffle=True, seed=3, workers=2, processes=True
    )
    yield dl
    dl.close()


@pytest.fixture(scope="module")
def pipe(made):
    p = af.Pipeline([PIECES, DieOnce("/nonexistent")], processes=2)
    yield p
    p.close()


def no_block_left(names):
    return not [n for n in names if os.path.exists(f"/dev/shm/{n.lstrip('/')}")]


def test_loader_in_processes_gives_the_threads_values_and_keeps_its_workers(loader, made):
    threads = af.data.DataLoader(Samples(), batch_size=8, shuffle=True, seed=3, workers=2)
    pids = None
    for _ in range(2):  # two passes (epochs): the same processes
        got, want = list(loader.iter_arrays()), list(threads.iter_arrays())
        assert len(got) == len(want) == 4
        for (x, i), (x2, i2) in zip(got, want, strict=True):
            assert np.array_equal(x, x2) and np.array_equal(i, i2)
        assert pids is None or loader.procs.pids == pids
        pids = loader.procs.pids
    assert loader.procs.spawned == 2 and len(set(pids)) == 2
    assert loader.procs.fn_version == 1  # the dataset sent once, not per pass
    assert all(pid != os.getpid() for pid in pids)
    assert made and no_block_left(made)


def in_shared_memory(batch):
    """Whether the batch a stage reads is a view of a shared block's mapping."""
    x = batch[0]
    while isinstance(x, np.ndarray):
        x = x.base
    return np.array(isinstance(x, mmap.mmap))


def test_batches_are_written_in_shared_memory_and_no_array_is_pickled(loader, made):
    sent, received = loader.procs.sent, loader.procs.received
    v0 = loader.procs.fn_version
    g = af.ActorGraph()
    actors = loader.actors_into(g, loader.layout())
    g.sink(g.actor(in_shared_memory, actors.node))
    assert [bool(v) for v in g.run()] == [True] * 3  # read in place by the next actor
    assert [bool(v) for v in g.run()] == [True] * 3
    # 6 batches of 32 KiB went through the registers; through the pipes only messages:
    # indices (8 int64) and a header each; an act answers b""
    assert loader.procs.received == received
    per_act = (loader.procs.sent - sent) / 6
    assert per_act < 2048, per_act  # (a batch: 32 KiB)
    assert loader.procs.fn_version == v0 + 1 and len(loader.procs.pids) == 2  # (a new layout)
    assert no_block_left(made)
    threads = af.data.DataLoader(Samples(), batch_size=8, workers=2)
    g = af.ActorGraph()
    g.sink(g.actor(in_shared_memory, threads.actors_into(g).node))
    assert [bool(v) for v in g.run()] == [False] * 3


def test_a_killed_worker_is_an_actor_error_and_the_next_run_has_a_new_one(pipe, made, tmp_path):
    marker = tmp_path / "die"
    marker.write_text("")
    stage = pipe.graph.actors[1]
    stage.fn = DieOnce(marker)
    with pytest.raises(af.ActorError) as info:
        list(pipe.run())
    e = info.value
    assert e.actor == stage.name and e.piece == 3
    assert "exit code -9" in str(e) and "SIGKILL" in str(e)
    assert no_block_left(made)
    before = stage.procs.spawned
    out = list(pipe.run())
    assert [o[0, 0] for o in out] == [i + 1 for i in range(6)]
    assert stage.procs.spawned == before + 1 and len(stage.procs.pids) == 2
    assert no_block_left(made)


def test_a_wrong_piece_in_a_worker_is_the_local_engines_error(pipe):
    stage = pipe.graph.actors[1]
    stage.fn = wrong_shape
    with pytest.raises(af.ActorError) as got:
        list(pipe.run())
    with pytest.raises(af.ActorError) as local:
        list(af.Pipeline([PIECES, wrong_shape], names=[None, stage.name]).run())
    assert got.value.piece == local.value.piece == 2
    assert str(got.value).splitlines()[0] == str(local.value).splitlines()[0]
    assert "(in the worker process)" in str(got.value)


def test_piece_0_that_sizes_the_registers_is_computed_in_a_worker_too(pipe, made):
    stage = pipe.graph.actors[1]
    stage.fn = pid_of
    lazy = [int(o[0]) for o in pipe.run()]  # piece 0 sizes the registers
    pipe.plan()  # piece 0 computed while planning
    planned = [int(o[0]) for o in pipe.run()]
    assert len(lazy) == len(planned) == 6
    assert set(lazy + planned) <= set(stage.procs.pids) and os.getpid() not in lazy + planned
    assert no_block_left(made)


def test_close_ends_the_workers_and_leaves_no_block(made):
    p = af.Pipeline([PIECES, wrong_shape], processes=1)
    with pytest.raises(af.ActorError):
        list(p.run())
    procs = p.graph.actors[1].procs
    workers = list(procs.workers)
    p.close()
    assert all(not w.process.is_alive() for w in workers)
    assert no_block_left(made)
    with pytest.raises(af.PlanError, match="closed"):
        list(p.run())


def test_the_workers_end_when_their_graph_is_collected(made):
    p = af.Pipeline([PIECES, add_one], processes=1)
    p.plan()  # (started; a run's graph the test plugin keeps)
    workers = list(p.graph.actors[1].procs.workers)
    assert workers[0].process.is_alive()
    del p
    gc.collect()
    assert workers and all(not w.process.is_alive() for w in workers)
    assert no_block_left(made)


def test_graph_run_reads_a_loader_in_processes_bit_for_bit(made):
    from test_graph_mode import TrainStep

    rng = np.random.default_rng(0)
    ds = af.data.TensorDataset(
        rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 3, 64).astype(np.int64)
    )
    m1, m2 = af.nn.Linear(8, 3), af.nn.Linear(8, 3)
    m2.load_state_dict(m1.state_dict())
    o1, o2 = (af.optim.SGD(m.parameters(), lr=0.1) for m in (m1, m2))
    threads = af.data.DataLoader(ds, batch_size=16, shuffle=True, seed=1, workers=2)
    want = [float(v) for _ in range(2) for v in TrainStep(m1, o1).run(threads, fused=True)]
    with af.data.DataLoader(
        ds, batch_size=16, shuffle=True, seed=1, workers=1, processes=True
    ) as dl:
        step = TrainStep(m2, o2)
        got = [float(v) for _ in range(2) for v in step.run(dl, fused=True)]
        assert dl.procs.spawned == 1 and dl.procs.fn_version == 1
    assert got == want and len(got) == 8
    assert no_block_left(made)


GAIN = 1.0  # (read by scaled, a stage function of this module)


def scaled(x):
    return x * GAIN


def test_a_global_its_function_reads_reaches_the_workers(made):
    """A global of the function's module, rebound here between runs: the workers (whose
    own import of this module has the file's value) compute with this process's value, as
    threads do."""
    global GAIN
    g = af.ActorGraph()
    src = g.source(lambda: (np.full((2,), i, np.float32) for i in range(3)))
    g.sink(g.actor(scaled, src, processes=2))
    try:
        got = []
        for gain in (1.0, 3.0, 0.5):
            GAIN = gain
            got.append([float(v[0]) for v in g.run()])
        assert got == [[0.0, 1.0, 2.0], [0.0, 3.0, 6.0], [0.0, 0.5, 1.0]]
    finally:
        GAIN = 1.0
        g.close()


_LOADED_BY = None  # (set by load_once on first use, in whichever process runs it)


def load_once(x):
    global _LOADED_BY
    if _LOADED_BY is None:
        _LOADED_BY = os.getpid()  # (what a load-once global keeps: its own process's)
    return np.full_like(x, float(_LOADED_BY == os.getpid()))


def test_a_global_its_function_sets_itself_stays_the_workers_own(made):
    """Not a setting but state the function keeps (a model loaded once): already set
    here by a call in this process, it is not sent; each worker loads its own."""
    global _LOADED_BY
    load_once(np.zeros(2, np.float32))
    g = af.ActorGraph()
    g.sink(g.actor(load_once, g.source(lambda: (np.zeros(2, np.float32) for _ in range(4))),
                   processes=2))  # fmt: skip
    try:
        assert [float(v[0]) for v in g.run()] == [1.0] * 4
    finally:
        _LOADED_BY = None
        g.close()


def test_a_function_that_does_not_pickle_is_refused_when_planned():
    lock = threading.Lock()
    p = af.Pipeline([PIECES, lambda x: (lock, x)[1]], names=[None, "locked"], processes=1)
    with pytest.raises(af.PlanError, match="'locked'.*does not pickle.*module level"):
        p.plan()
    assert p.graph.actors[1].procs.spawned == 0


def test_processes_arguments_are_checked():
    with pytest.raises(ValueError, match="workers >= 1"):
        af.data.DataLoader(Samples(), workers=0, processes=True)
    g = af.ActorGraph()
    src = g.source(PIECES)
    with pytest.raises(ValueError, match="not both"):
        g.actor(wrong_shape, src, replicas=2, processes=2)
    with pytest.raises(ValueError, match="from 1 to 32"):
        g.actor(wrong_shape, src, processes=0)


def test_passes_broken_off_leave_the_workers_whole():
    # a stopped pass released its block while an act of it still waited for a worker: that
    # act sent the worker a block to map and then no descriptor, and the worker died (the
    # next pass failed with WorkerDied in about 1 break of 13)
    with af.data.DataLoader(Samples(), batch_size=2, workers=2, processes=True) as dl:
        for _ in range(40):
            for _b in dl:
                break
            assert [int(b[1][0]) for b in dl] == list(range(0, 29, 2))
        assert dl.procs.spawned == 2
