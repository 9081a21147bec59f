"""nn.Graph.run() on cuda:0, on the CUDA emulator (and, for the tests taking the ``cuda``
fixture, on the GPU too, equal to cpu within a few ulp there; cuda_fixtures.py): the batches
live in device registers (cuda tensors stored as they are, host batches and a host
DataLoader's copied there by a copy actor on the h2d stream, a DataLoader(device="cuda:0")'s
own copy); with fused=True the step's op actor issues the compiled step on the compute
stream (replayed as a CUDA graph), with an actor per op each op's actor launches its kernel
there and each state's writer writes it back there; acts end on the device work's
completion, and the losses come back through a copy on the d2h stream: host arrays, as on
the cpu, equal to the cpu's bit for bit with the same parameters after, under random stream
delays too; the copy of batch k+1 is issued while step k is held on the device; a plan over
the device's budget is refused before any step; a kernel fault stops the run with
ActorError, the parameters keep the steps before it, and training goes on."""

from collections import Counter

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.errors import ActorError, KernelError, PlanError
from cuda_fixtures import CUDA, assert_captures, assert_same, settle
from test_cuda_actors import LoggedDriver
from test_cuda_graph_mode import batches, make, program_of, train

pytestmark = pytest.mark.timeout(120)

EMU_DRIVER = LoggedDriver  # the emu and cuda fixtures' emulator (cuda_fixtures)

OPTS = [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=1e-2))]


def _same(want_params, model) -> None:
    """``model``'s parameters equal ``want_params`` (cpu's after the same steps): bit for
    bit on the emulator, within 1e-4 on a GPU (the steps' matmuls, sums and exp/log)."""
    for a, p in zip(want_params, model.parameters(), strict=True):
        assert_same(p.numpy(), a, exact=False, rtol=1e-4)


def _same_losses(got, want) -> None:
    """As ``_same``, for the losses of a run."""
    assert_same([float(v) for v in got], want, exact=False, rtol=1e-4)


def _feed(kind, data):
    if kind == "cuda tensors":
        return [(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA)) for x, y in data]
    if kind == "cpu tensors":
        return [(af.tensor(x), af.tensor(y)) for x, y in data]
    return data


MODES = {
    "fused, captured": dict(fused=True),
    "fused, launched": dict(fused=True),
    "an actor per op": dict(fused=False),
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("kind", ["cuda tensors", "numpy", "cpu tensors"])
@pytest.mark.parametrize("opt_name,kwargs", OPTS, ids=[o for o, _ in OPTS])
def test_a_run_on_cuda_equals_cpu_bit_for_bit(cuda, opt_name, kwargs, kind, mode):
    data = batches(5, seed=7)
    want, want_params, _ = train("cpu", opt_name, kwargs, data)
    model, step = make(CUDA, opt_name, kwargs, cuda_graph=mode != "fused, launched")
    outs = list(step.run(_feed(kind, data), **MODES[mode]))
    assert all(type(o) is np.ndarray and o.shape == () for o in outs)  # as the cpu's run
    _same_losses(outs, want)
    _same(want_params, model)
    names = set(step.stats().actors)
    assert ("to_device" in names) is (kind != "cuda tensors")  # cuda batches: no copy
    if mode == "an actor per op":
        assert "set state 0" in names and any(n.endswith(" to host") for n in names)
        return
    assert "step" in names and "to_host" in names
    run = program_of(step)
    if mode == "fused, captured":
        assert_captures(run, 1, 4)
    else:
        assert (run.captures, run.replays) == (0, 0)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "an actor per op"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_run_under_random_stream_delays_equals_cpu(emu, fused, seed):
    emu(delay=2e-4, seed=seed)
    data = batches(4, seed=seed)
    want, want_params, _ = train("cpu", "Adam", dict(lr=1e-2), data)
    model, step = make(CUDA, "Adam", dict(lr=1e-2))
    _same_losses(step.run(data, fused=fused), want)
    _same(want_params, model)


def test_the_work_is_on_its_streams_with_no_round_trip_through_the_host(emu):
    cuda = emu()
    data = batches(4, seed=1)
    _, step = make(CUDA, "SGD", dict(lr=0.1))
    list(step.run(data, fused=True))  # (compiled and captured)
    del cuda.log[:]
    assert len(list(step.run(data, fused=True))) == 4
    counts = Counter(cuda.log)
    # per batch: x and y copied up on h2d, the loss down on d2h; on the compute stream the
    # replay's static input and output copies only (the kernels are the replayed graph's)
    assert counts == {
        ("copy_h2d", "h2d"): 2 * 4,
        ("copy_d2d", "compute"): 3 * 4,
        ("copy_d2h", "d2h"): 4,
    }
    items = _feed("cuda tensors", data)
    af.synchronize()  # (their own copies up: done)
    del cuda.log[:]
    assert len(list(step.run(items, fused=True))) == 4
    counts = Counter(kind for kind, _ in cuda.log)
    assert counts["copy_h2d"] == 0 and counts["copy_d2h"] == 4


def test_one_run_of_cuda_then_host_batches_is_a_run_per_kind(cuda):
    data = batches(5, seed=2)
    want, want_params, _ = train("cpu", "Adam", dict(lr=1e-2), data)
    model, step = make(CUDA, "Adam", dict(lr=1e-2))
    items = _feed("cuda tensors", data[:3]) + data[3:]
    _same_losses(step.run(items, fused=True), want)
    _same(want_params, model)


def _loader(device=None, **kw):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 8)).astype(np.float32), rng.integers(0, 3, 40)
    return af.data.DataLoader(
        af.data.TensorDataset(x, y), batch_size=8, shuffle=True, seed=1, device=device, **kw
    )


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "an actor per op"])
@pytest.mark.parametrize("device", [None, CUDA], ids=["host loader", "cuda loader"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_run_on_cuda_from_a_dataloader_equals_cpu(cuda, device, workers, fused):
    cpu_model, cpu_step = make("cpu", "SGD", dict(lr=0.1, momentum=0.9))
    want = [float(v) for e in range(2) for v in cpu_step.run(_loader(workers=workers), fused=fused)]
    model, step = make(CUDA, "SGD", dict(lr=0.1, momentum=0.9))
    got = [
        float(v) for e in range(2) for v in step.run(_loader(device, workers=workers), fused=fused)
    ]
    assert len(got) == 10
    _same_losses(got, want)
    _same([p.numpy() for p in cpu_model.parameters()], model)
    names = set(step.stats().actors)
    assert "to_device" in names and "load" in names


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "an actor per op"])
@pytest.mark.parametrize("buffers", [2, 1])
def test_h2d_of_the_next_batch_is_issued_while_the_step_is_held(emu, buffers, fused):
    """The compute stream is held at step 0's first command until the copy actor has
    issued its copy of batch 1 (one array a batch): with two registers it does (batch 1
    goes to the second register while step 0 reads the first); with one, batch 1 waits
    for step 0's register, which comes home only when step 0 completed."""
    cuda = emu()

    class Fit(nn.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)

        def build(self, x):
            loss = (self.model(x) ** 2).mean()
            loss.backward()
            return loss

    af.manual_seed(0)
    model = nn.Linear(8, 2, device=CUDA)
    step = Fit(model, optim.SGD(model.parameters(), lr=0.1))
    data = [x for x, _ in batches(6, seed=3)]
    want = [float(v) for v in step.run(data, fused=fused, buffers=buffers)]  # (compiled)
    cuda.hold_for = 5.0 if buffers == 2 else 0.5
    cuda.armed = True
    got = [float(v) for v in step.run(data, fused=fused, buffers=buffers)]
    assert len(got) == 6 and cuda.gated
    assert cuda.held_out is (buffers == 1)
    assert got != want  # (trained on: the parameters moved)


def test_a_plan_over_the_cuda_budget_is_refused_before_any_step(cuda):
    data = batches(3)
    model, step = make(CUDA, "SGD", dict(lr=0.1))
    before = [p.numpy() for p in model.parameters()]
    with pytest.raises(PlanError) as e:
        list(step.run(data, fused=True, memory={CUDA: "256B"}))
    msg = str(e.value)
    assert e.value.device == CUDA and e.value.budget == 256
    assert "cuda:0 budget" in msg and "to_device" in msg and "workspace" in msg
    _same(before, model)  # no step ran
    assert program_of(step).launches == 0
    want, want_params, _ = train("cpu", "SGD", dict(lr=0.1), data)
    _same_losses(step.run(data, fused=True, memory={CUDA: "1MiB"}), want)
    _same(want_params, model)


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "an actor per op"])
@pytest.mark.parametrize("kind", ["numpy", "cuda tensors"])
def test_a_kernel_fault_mid_run_stops_it_and_training_goes_on(emu, kind, fused):
    cuda = emu()
    data = batches(6, seed=5)
    model, step = make(CUDA, "SGD", dict(lr=0.1, momentum=0.9))
    items = _feed(kind, data)
    list(step.run(items[:1], fused=fused))  # (compiled and captured)

    def faulty():
        for k, item in enumerate(items[1:]):
            if k == 2:
                cuda.fail_kernel("relu")  # a step of the run's fails
            yield item

    with pytest.raises(ActorError) as e:
        list(step.run(faulty(), fused=fused))
    assert e.value.actor == ("step" if fused else "relu")
    assert isinstance(e.value.original, KernelError)
    assert "injected fault in kernel relu" in str(e.value)
    failed = 1 + e.value.piece  # (the index in data)
    assert 1 <= failed < len(data)
    settle()
    # the steps before the failed one were applied, it and those after it were not
    _, want_params, _ = train("cpu", "SGD", dict(lr=0.1, momentum=0.9), data[:failed])
    _same(want_params, model)
    rest = [float(v) for v in step.run(items[failed:], fused=fused)]  # training goes on
    want, want_params, _ = train("cpu", "SGD", dict(lr=0.1, momentum=0.9), data)
    assert rest == want[failed:]
    _same(want_params, model)


def test_a_traced_op_actor_on_cuda_registers_is_refused_naming_a_stage(cuda):
    g = af.ActorGraph()
    up = g.copy(g.source([np.ones(4, np.float32)]), CUDA)
    with pytest.raises(PlanError, match=r"g\.actor"):
        g.op(af.relu, up)
