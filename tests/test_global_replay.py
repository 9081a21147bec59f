"""Step programs (actorflow/parallel/programs.py): an ``nn.Graph`` step over global tensors on
process ranks is recorded, and once two steps in a row issued the same commands every rank
replays it from one command. Replayed steps give the bits of inline ranks (which never
replay); a change of what the commands depend on (the optimizer's settings or state, the
inputs' shapes) records again; a step that cannot be replayed says why and runs eagerly; a
replay keeps no part it made on the workers; a killed worker is an ActorError."""

import os
import signal

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.errors import ActorError
from actorflow.parallel import programs, ranks_of, use_ranks
from actorflow.parallel import workers as W

pytestmark = pytest.mark.timeout(120)

S0, B = af.sbp.split(0), af.sbp.broadcast


@pytest.fixture(scope="module", autouse=True)
def closed():
    """The process ranks made here closed at the end."""
    yield
    for (kind, _), g in list(af.parallel.ranks._GROUPS.items()):
        if kind == "processes":
            g.close()


class Step(nn.Graph):
    def __init__(self, model, opt, read=None):
        super().__init__()
        self.model, self.loss = model, nn.CrossEntropyLoss()
        self.add_optimizer(opt)
        self.read = read  # what build does besides (a test's)

    def build(self, x, y):
        out = self.model(x)
        loss = self.loss(out, y)
        if self.read is not None:
            loss = self.read(loss)
        loss.backward()
        return loss, out


def graph(k=2, opt="SGD", read=None):
    af.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 5))
    model.to_global(af.placement("cpu", k))
    if opt == "SGD":
        o = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        o = optim.Adam(model.parameters(), lr=1e-2)
    return model, o, Step(model, o, read)


def batches(n, b=10, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((b, 12)).astype(np.float32), rng.integers(0, 5, b)) for _ in range(n)
    ]


def train(kind, data, k=2, opt="SGD", read=None, between=None):
    """Steps over ``data`` on ranks of ``kind``: the losses, outputs and parameters (numpy)
    and the graph. ``between(i, o, step)`` runs before step i."""
    with use_ranks(kind):
        model, o, step = graph(k, opt, read)
        got = []
        for i, (x, y) in enumerate(data):
            if between is not None:
                between(i, o, step)
            loss, out = step(x, y)
            got += [loss.numpy(), out.numpy()]
        got += [p.numpy() for p in model.parameters()]
        return got, step


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes()


@pytest.mark.parametrize("k", [2, 3])
def test_later_steps_are_replayed_with_the_bits_of_inline_ranks(k):
    data = batches(7)  # (10 rows over 3 ranks: parts of 4, 3, 3)
    want, _ = train("inline", data, k)
    got, step = train("processes", data, k)
    same(got, want)
    # step 1 makes the momentum (another key), steps 2 and 3 record the same commands
    assert step._replay.replays == len(data) - 3 and step._replay.why is None


def test_run_over_a_loader_replays_its_steps():
    """``run()`` takes each batch as ``step()`` does: recorded, then replayed."""
    data = batches(6, seed=12)
    x = np.concatenate([a for a, _ in data])
    y = np.concatenate([b for _, b in data])

    def run(kind):
        with use_ranks(kind):
            model, _, step = graph()
            loader = af.data.DataLoader(af.data.TensorDataset(x, y), batch_size=10)
            got = [loss.numpy() for loss, _ in step.run(loader)]
            return got + [p.numpy() for p in model.parameters()], step

    want, _ = run("inline")
    got, step = run("processes")
    same(got, want)
    assert step._replay.replays == len(data) - 3


def test_a_changed_rate_or_state_records_the_step_again():
    data = batches(10, seed=1)

    def between(i, o, step):
        if i == 5:
            o.param_groups[0]["lr"] = 0.01  # folded into the update's commands
        if i == 7:
            o.load_state_dict(o.state_dict())  # new state tensors: new parts

    want, _ = train("inline", data, between=between)
    got, step = train("processes", data, between=between)
    same(got, want)
    # steps 1-3 recorded (the program defined at 3), 4-5 replayed; the rate: 6-7 recorded,
    # the state: 8-9 recorded, 10 replayed
    assert step._replay.replays == 2 + 1


def test_new_input_shapes_record_anew_and_global_inputs_are_taken_as_they_are():
    data = batches(4, b=10) + batches(4, b=6, seed=2)
    want, _ = train("inline", data)
    got, step = train("processes", data)
    same(got, want)
    assert step._replay.replays == 1 + 2
    with use_ranks("processes"):
        _, _, g = graph()
        p = g.model[0].weight.placement
        for x, y in batches(5, seed=3):
            g(af.tensor(x).to_global(p, S0), af.tensor(y).to_global(p, S0))
        assert g._replay.replays == 2


BIAS = 0.0  # (read by Scale.forward)


class Scale(nn.Module):
    gain = 1.0  # (a class attribute its forward reads)

    def __init__(self, s):
        super().__init__()
        self.s = s

    def forward(self, x):
        return x * self.s * self.gain + BIAS


def _class_attr(i, o, step):
    Scale.gain = 2.0 if i >= 5 else 1.0  # set on the class (1.0 again for the next run)


def _global(i, o, step):
    global BIAS
    BIAS = 0.25 if i >= 5 else 0.0  # a global a module's forward reads, rebound


def _module_attr(i, o, step):
    if i == 5:
        step.model[1].s = 0.5  # an attribute a module's forward reads


def _hook(i, o, step):
    if i == 5:
        step.model[2].register_forward_hook(lambda m, a, out: out * 2.0)


def _swap(i, o, step):
    if i == 5:
        step.model[1] = nn.Tanh()


def _graph_attr(i, o, step):
    if i == 5:
        step.factor = 3.0  # an attribute build reads


def _frozen(i, o, step):
    if i == 5:
        step.model[0].weight.requires_grad = False


def _out_of_optimizer(i, o, step):
    if i == 5:
        o.param_groups[0]["params"] = o.param_groups[0]["params"][2:]


@pytest.mark.parametrize(
    "between",
    [_module_attr, _class_attr, _global, _hook, _swap, _graph_attr, _frozen, _out_of_optimizer],
    ids=[
        "module attribute",
        "class attribute",
        "global",
        "hook",
        "module replaced",
        "graph attribute",
        "frozen",
        "dropped",
    ],
)
def test_what_build_and_the_optimizers_read_is_checked_before_a_replay(between):
    """As a local graph's compiled step is traced again, a step is recorded again when what
    build's Python read changed: replays never run the old commands."""

    class Scaled(Step):
        def build(self, x, y):
            out = self.model(x)
            loss = self.loss(out, y) * self.factor
            loss.backward()
            return loss, out

    def run(kind):
        with use_ranks(kind):
            af.manual_seed(0)
            model = nn.Sequential(nn.Linear(12, 16), Scale(1.0), nn.Linear(16, 5))
            model.to_global(af.placement("cpu", 2))
            o = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            step = Scaled(model, o)
            step.factor = 1.0
            got = []
            for i, (x, y) in enumerate(batches(9, seed=9)):
                between(i, o, step)
                loss, out = step(x, y)
                got += [loss.numpy(), out.numpy()]
            return got + [p.numpy() for p in model.parameters()], step

    global BIAS
    try:
        want, _ = run("inline")
        got, step = run("processes")
    finally:
        Scale.gain, BIAS = 1.0, 0.0
    same(got, want)
    assert step._replay.replays == 2 + 2  # (steps 4-5, then 8-9)


def test_an_input_given_twice_or_laid_out_otherwise_records_anew():
    with use_ranks("inline"):
        want = _twice()
    with use_ranks("processes"):
        got, step = _twice(replays=True)
    same(got, want)


def _twice(replays=False):
    """Steps on (x, x) then on (x, x2), then on a transposed x: the same shapes."""

    class Sum(nn.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, a, b):
            loss = (self.model(a) * self.model(b)).sum()
            loss.backward()
            return loss

    af.manual_seed(0)
    p = af.placement("cpu", 2)
    model = nn.Linear(6, 6).to_global(p)
    g = Sum(model, optim.SGD(model.parameters(), lr=0.01))
    rng = np.random.default_rng(10)
    xs = [af.tensor(rng.standard_normal((6, 6)).astype(np.float32)) for _ in range(3)]
    xs = [x.to_global(p, B) for x in xs]
    got = []
    for a, b in [(xs[0], xs[0])] * 4 + [(xs[0], xs[1])] * 2 + [(xs[2].T, xs[1])] * 4:
        got.append(g(a, b).numpy())
    got += [q.numpy() for q in model.parameters()]
    if replays:
        # (x, x): 1-3 recorded, 4 replayed; (x, x2): 5-6 recorded; x.T: 7-8 recorded, 9-10
        assert g._replay.replays == 1 + 0 + 2
        return got, g
    return got


@pytest.mark.parametrize("extra", ["detach", "view"])
def test_an_output_given_twice_or_a_view_is_not_replayed(extra):
    class Twice(Step):
        def build(self, x, y):
            loss, out = super().build(x, y)
            return loss, loss.detach() if extra == "detach" else out.T, out

    def run(kind):
        with use_ranks(kind):
            model, o, _ = graph()
            step = Twice(model, o)
            got = []
            for x, y in batches(6, seed=11):
                got += [t.numpy() for t in step(x, y)]
            return got, step

    want, _ = run("inline")
    got, step = run("processes")
    same(got, want)
    why = "parts twice" if extra == "detach" else "returns a view"
    assert step._replay.replays == 0 and why in step._replay.why


@pytest.mark.parametrize(
    "read,why",
    [
        (lambda loss: loss * float(loss.item() > 0), "reads a value or a shape on this process"),
        (lambda loss: loss * OUTSIDE[0], "made outside the step"),
    ],
    ids=["item", "outside"],
)
def test_a_step_that_cannot_be_replayed_says_why_and_runs_eagerly(read, why):
    data = batches(5, seed=4)
    OUTSIDE.clear()
    with use_ranks("inline"):
        OUTSIDE.append(af.tensor(np.float32(0.5)).to_global(af.placement("cpu", 2), B))
    want, _ = train("inline", data, read=read)
    OUTSIDE.clear()
    with use_ranks("processes"):
        OUTSIDE.append(af.tensor(np.float32(0.5)).to_global(af.placement("cpu", 2), B))
    got, step = train("processes", data, read=read)
    same(got, want)
    assert step._replay.replays == 0 and why in step._replay.why


OUTSIDE: list = []


def test_steps_whose_commands_change_every_time_are_no_longer_recorded():
    """A number build folds into an op's attributes, new every step: no two steps are the
    same commands, so after ``MISSES`` tries the steps are not recorded any more."""
    data = batches(6, seed=5)

    count = [0]

    def scaled(loss):
        count[0] += 1
        return loss * (1.0 + count[0] / 100)

    want, _ = train("inline", data, read=scaled)
    count[0] = 0
    got, step = train("processes", data, read=scaled)
    same(got, want)
    r = step._replay
    assert r.replays == 0 and r.program is None and r.misses == programs.MISSES
    assert "different commands each time" in r.why


def test_adam_puts_its_step_count_so_it_is_not_replayed_and_trains_as_inline():
    data = batches(5, seed=8)
    want, _ = train("inline", data, opt="Adam")
    got, step = train("processes", data, opt="Adam")
    same(got, want)
    assert step._replay.replays == 0 and "puts a tensor from this process" in step._replay.why


def test_a_replayed_step_keeps_no_part_it_made_on_the_workers():
    with use_ranks("processes"):
        _, _, step = graph()
        ranks = ranks_of(step.model[0].weight.placement)

        def held():
            ranks.synchronize()
            return [ranks._request(r, (W.PING,))[1] for r in range(ranks.size)]

        counts = []
        for i, (x, y) in enumerate(batches(12, seed=6)):
            loss, out = step(x, y)
            del loss, out
            if i in (5, 11):
                counts.append(held())
        assert step._replay.replays == 9
        assert counts[0] == counts[1]  # (parameters, momentum, the last inputs)


def test_a_worker_killed_between_replays_is_an_actor_error_naming_its_rank():
    with use_ranks("processes"):
        _, _, step = graph(k=2)
        data = batches(6, seed=7)
        for x, y in data[:5]:
            float(step(x, y)[0])
        assert step._replay.replays == 2
        ranks = ranks_of(step.model[0].weight.placement)
        os.kill(ranks.pids[1], signal.SIGKILL)
        with pytest.raises(ActorError, match="rank 1"):
            x, y = data[5]
            float(step(x, y)[0])
