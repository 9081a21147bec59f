"""nn.Graph.run(loader): the DataLoader's actors (sampler, loading stage on its workers) join
the step's actor graph, so a batch goes sampler -> load -> the input register -> the op
actors: copied once into the register, never through a tensor, and a seeded schedule runs
it on one loop without a hang."""

import threading

import numpy as np
import pytest

import actorflow as af
from actorflow import creation, nn, optim
from actorflow.data import DataLoader, IterableDataset, TensorDataset
from actorflow.data import loader as loader_module
from actorflow.runtime.graph import actors as actor_module
from test_graph_mode import TrainStep


class SilentStep(TrainStep):
    def build(self, x, y):  # returns nothing: the run yields None
        self.loss(self.model(x), y).backward()


def data(n=100, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, 8)).astype(np.float32), rng.integers(0, 3, n).astype(np.int64))


def twins(opt=optim.SGD, **kw):
    m1, m2 = nn.Sequential(nn.Linear(8, 3)), nn.Sequential(nn.Linear(8, 3))
    m2.load_state_dict(m1.state_dict())
    return (m1, opt(m1.parameters(), lr=0.1, **kw)), (m2, opt(m2.parameters(), lr=0.1, **kw))


def step_losses(model, opt, batches):
    step = TrainStep(model, opt)
    return [float(step.step(x, y)) for x, y in batches]


class Counts:
    """Counts, while on, what a batch may go through on its way: tensors made from arrays,
    tensors read back, copies into a register and copies out of one."""

    def __init__(self, monkeypatch):
        self.n = dict(numpy=0, from_numpy=0, into_register=0, out_of_register=0)
        self.on = False
        numpy, from_numpy = af.Tensor.numpy, creation.from_numpy
        into, out = actor_module.check_piece, actor_module._copy_out

        def counting(name, fn):
            def f(*a, **k):
                if self.on:
                    self.n[name] += 1
                return fn(*a, **k)

            return f

        monkeypatch.setattr(af.Tensor, "numpy", counting("numpy", numpy))
        monkeypatch.setattr(creation, "from_numpy", counting("from_numpy", from_numpy))
        monkeypatch.setattr(loader_module, "from_numpy", counting("from_numpy", from_numpy))
        # a piece that is not one array is checked, then copied leaf by leaf into the
        # register (Actor._store); the sampler's index arrays take the one-array path
        monkeypatch.setattr(actor_module, "check_piece", counting("into_register", into))
        monkeypatch.setattr(actor_module, "_copy_out", counting("out_of_register", out))


@pytest.mark.timeout(120)
def test_a_batch_is_copied_once_into_the_register_and_never_made_a_tensor(monkeypatch):
    x, y = data(8 * 4)
    batches = [(x[i : i + 8], y[i : i + 8]) for i in range(0, 32, 8)]
    counts = Counts(monkeypatch)
    for kind in (SilentStep, TrainStep):  # a step that returns nothing, or its loss
        (m1, o1), (m2, o2) = twins()
        want = step_losses(m1, o1, batches * 2)
        step = kind(m2, o2)
        loader = DataLoader(TensorDataset(x, y), batch_size=8, workers=2)
        got = list(step.run(loader))  # (compiles: tracing reads its constants)
        counts.on = True
        got += list(step.run(loader))  # an epoch of 4 batches
        counts.on = False
        if kind is SilentStep:
            assert got == [None] * 8
            assert counts.n == dict(numpy=0, from_numpy=0, into_register=4, out_of_register=0)
        else:  # (the loss is the step's output, not a batch)
            assert [float(v) for v in got] == want
            assert counts.n["numpy"] == counts.n["from_numpy"] == 0
        np.testing.assert_array_equal(m2[0].weight.numpy(), m1[0].weight.numpy())
        counts.n = dict.fromkeys(counts.n, 0)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fused", [False, True])
def test_a_seeded_schedule_runs_a_hundred_batches_through_the_loader(af_seed, fused):
    x, y = data(203)  # 101 whole batches of 2 and one of 1
    (m1, o1), (m2, o2) = twins(optim.Adam)
    loader = DataLoader(TensorDataset(x, y), batch_size=2, shuffle=True, seed=5, workers=2)
    order = loader.order(0)
    want = step_losses(
        m1, o1, [(x[order[i : i + 2]], y[order[i : i + 2]]) for i in range(0, 203, 2)]
    )
    got = [float(v) for v in TrainStep(m2, o2).run(loader, fused=fused)]
    assert len(got) == 102 and got == want
    assert loader.epoch == 1


@pytest.mark.timeout(120)
def test_the_compiled_step_serves_every_epoch_and_every_loader_of_the_same_kind():
    x, y = data(40)
    (m1, o1), (m2, o2) = twins()
    step = TrainStep(m2, o2)
    first = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, seed=1)
    got = [float(v) for v in step.run(first)] + [float(v) for v in step.run(first)]
    other = DataLoader(TensorDataset(x[::-1].copy(), y[::-1].copy()), batch_size=8)
    got += [float(v) for v in step.run(other)]
    graphs = [k for k in step._compiled if k[0] == "graph"]
    assert len(graphs) == 1  # traced once, for all three passes
    batches = [
        (x[first.order(e)[i : i + 8]], y[first.order(e)[i : i + 8]])
        for e in (0, 1)
        for i in range(0, 40, 8)
    ]
    batches += [(x[::-1][i : i + 8], y[::-1][i : i + 8]) for i in range(0, 40, 8)]
    assert got == step_losses(m1, o1, batches)


@pytest.mark.timeout(120)
def test_an_iterable_dataset_and_a_collate_fn_join_the_graph_too():
    x, y = data(21)

    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(21):
                yield {"x": x[i], "y": int(y[i])}

    def collate(samples):  # (x, y) from dicts, y as int64
        return (np.stack([s["x"] for s in samples]), np.array([s["y"] for s in samples], np.int64))

    (m1, o1), (m2, o2) = twins()
    got = [
        float(v)
        for v in TrainStep(m2, o2).run(DataLoader(Stream(), batch_size=4, collate_fn=collate))
    ]
    want = step_losses(m1, o1, [(x[i : i + 4], y[i : i + 4]) for i in range(0, 21, 4)])
    assert len(got) == 6 and got == want


@pytest.mark.timeout(120)
def test_an_op_failing_on_a_loaders_batch_is_named_as_step_names_it():
    x, y = data(16)
    y[9] = 7  # out of range for 3 classes: batch 2
    (m, o), _ = twins()
    with pytest.raises(af.ActorError) as info:
        list(TrainStep(m, o).run(DataLoader(TensorDataset(x, y), batch_size=4)))
    assert info.value.piece == 2
    with pytest.raises(af.KernelError) as eager:
        TrainStep(*twins()[0]).step(x[8:12], y[8:12])
    assert info.value.original.op == eager.value.op


def test_loader_buffers_fewer_than_workers_are_refused_with_the_fix():
    ds = TensorDataset(np.zeros((10, 2), np.float32))
    with pytest.raises(
        ValueError,
        match=r"buffers=2 is fewer than workers=4.*give "
        r"buffers >= 4, or leave buffers out",
    ):
        DataLoader(ds, batch_size=2, workers=4, buffers=2)
    left_out = DataLoader(ds, batch_size=2, workers=4)  # chosen by the plan: at least
    assert left_out.buffers is None  # max(2, workers) each
    assert min(r["buffers"] for r in left_out.graph.plan().rows) >= 4
    assert min(r["buffers"] for r in DataLoader(ds, batch_size=2).graph.plan().rows) >= 2
    assert DataLoader(ds, batch_size=2, workers=4, buffers="auto").buffers == "auto"


@pytest.mark.timeout(120)
def test_a_batch_of_another_layout_than_the_first_is_refused_with_the_fix():
    x, y = data(16)

    def ragged(samples):  # a batch as long as its first label + 1
        n = int(samples[0][1]) + 1
        return (
            np.stack([s[0] for s in samples])[:, :n].copy(),
            np.array([s[1] for s in samples], np.int64),
        )

    class Head(nn.Graph):
        def build(self, x, y):
            return x.sum() + y.sum()

    loader = DataLoader(TensorDataset(x, y), batch_size=4, collate_fn=ragged)
    shapes = {ragged([(x[i], y[i]) for i in range(k, k + 4)])[0].shape for k in (0, 4, 8, 12)}
    assert len(shapes) > 1  # (the data has batches of several layouts)
    with pytest.raises(
        af.ActorError,
        match=r"a batch is \(float32\[4, \d\] on cpu, int64"
        r"\[4\] on cpu\) where the first batch was "
        r"\(float32\[4, 3\] .*collate every batch to "
        r"the same shapes and dtypes",
    ):
        list(Head().run(loader))


@pytest.mark.timeout(120)
def test_a_fused_step_reads_the_loaders_register_too(monkeypatch):
    x, y = data(36)  # 4 whole batches of 8 and one of 4
    (m1, o1), (m2, o2) = twins()
    want = step_losses(m1, o1, [(x[i : i + 8], y[i : i + 8]) for i in range(0, 36, 8)] * 2)
    step = TrainStep(m2, o2)
    loader = DataLoader(TensorDataset(x, y), batch_size=8, workers=2)
    counts = Counts(monkeypatch)
    got = list(step.run(loader, fused=True))  # (compiles: tracing reads its constants)
    counts.on = True
    got += list(step.run(loader, fused=True))  # an epoch of 5 batches
    counts.on = False
    assert [float(v) for v in got] == want
    # the 4 whole batches are copied into the loading stage's register, the last one into
    # the fed input's; none is made a tensor or read back; what is copied out is the
    # step's output (its loss), one per batch
    assert counts.n == dict(numpy=0, from_numpy=0, into_register=5, out_of_register=5)
    assert not any(k[0] == "graph" for k in step._compiled)  # (one op actor: the step)


def test_a_graph_step_counts_as_an_in_place_write_for_a_backward_that_saved_a_parameter():
    x, y = data(8)
    (m, o), _ = twins()
    pending = (m(af.tensor(x)) ** 2).sum()  # saves the weight for backward (eager)
    TrainStep(m, o).step(x, y)  # writes it in place, outside the VM
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        pending.backward()


@pytest.mark.timeout(120)
def test_tensor_items_are_read_once_each_on_the_fed_path(monkeypatch):
    x, y = data(32)
    batches = [(af.tensor(x[i : i + 8]), af.tensor(y[i : i + 8])) for i in range(0, 32, 8)]
    (m, o), _ = twins()
    step = SilentStep(m, o)
    list(step.run(batches))  # (compiles: tracing reads its constants)
    counts = Counts(monkeypatch)
    counts.on = True
    list(step.run(batches))
    counts.on = False
    # the layout of each item comes from its tensors' metadata; each leaf is read once,
    # by the copy into the fed input's register
    assert counts.n["numpy"] == 2 * len(batches)


@pytest.mark.timeout(120)
def test_a_second_run_while_one_goes_on_is_refused_and_leaves_the_first_its_loader():
    x, y = data(40)
    (m1, o1), (m2, o2) = twins()
    want = step_losses(m1, o1, [(x[i : i + 8], y[i : i + 8]) for i in range(0, 40, 8)])
    step = TrainStep(m2, o2)
    held = threading.Event()  # the first run cannot end before the second is refused

    class Held(TensorDataset):
        def __getitem__(self, i):
            if i >= 16:
                assert held.wait(60)
            return super().__getitem__(i)

    first = DataLoader(Held(x, y), batch_size=8)
    other = DataLoader(TensorDataset(x * 100, y), batch_size=8)  # same kind of loader
    run = step.run(first)
    got = [float(next(run))]
    try:
        with pytest.raises(RuntimeError, match="still going"):
            next(step.run(other))
    finally:
        held.set()
    got += [float(v) for v in run]
    assert got == want  # every batch from the first loader


@pytest.mark.timeout(120)
def test_a_compiled_step_keeps_no_loader_alive_after_its_run():
    import gc
    import weakref

    x, y = data(16)
    (m, o), _ = twins()
    step = TrainStep(m, o)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    list(step.run(loader))
    gone = weakref.ref(loader)
    del loader
    gc.collect()
    assert gone() is None


@pytest.mark.timeout(120)
def test_a_progress_bar_over_a_loader_of_an_iterable_dataset_has_no_total():
    pytest.importorskip("tqdm")
    import io

    x, y = data(12)

    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(12):
                yield x[i], y[i]

    (m, o), _ = twins()
    out = io.StringIO()
    got = list(TrainStep(m, o).run(DataLoader(Stream(), batch_size=4), progress={"file": out}))
    assert len(got) == 3
    assert out.getvalue().split("\r")[-1].startswith("steps: 3piece")  # (no total)
