"""nn.Graph on cuda:0, on the CUDA emulator (and, for the tests taking the ``cuda`` fixture, on
the GPU too, equal to cpu within a few ulp there; cuda_fixtures.py): a compiled step is one
instruction on the device's compute stream, equal to cpu's graph mode bit for bit; a static
step is captured once as a CUDA graph and replayed, reading each step's new inputs through
its static input buffers; a new layout compiles anew; a kernel fault inside a replayed step
surfaces at the loss read and leaves the parameters as they were; af.profile lists the
step's kernels."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.backends.cuda.emu import EmuDriver
from actorflow.backends.cuda.selection import use_driver
from actorflow.errors import DeviceError, KernelError
from cuda_fixtures import CUDA, assert_captures, assert_same, settle
from test_graph_mode import TrainStep

pytestmark = pytest.mark.timeout(120)


def batches(n, b=6, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((b, 8)).astype(np.float32), rng.integers(0, 3, b)) for _ in range(n)
    ]


def make(device, opt_name, kwargs, **graph_kw):
    af.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16, device=device), nn.ReLU(), nn.Linear(16, 3, device=device)
    )
    opt = getattr(optim, opt_name)(model.parameters(), **kwargs)
    return model, TrainStep(model, opt, **graph_kw)


def train(device, opt_name, kwargs, data, **graph_kw):
    model, step = make(device, opt_name, kwargs, **graph_kw)
    losses = []
    for x, y in data:
        loss = step(af.tensor(x, device=device), af.tensor(y, device=device))
        assert str(loss.device) == device
        losses.append(loss)
    return [float(loss) for loss in losses], [p.numpy() for p in model.parameters()], step


def program_of(step):
    """The DeviceProgram of a Graph's one compiled step."""
    (c,) = [c for c in step._compiled.values() if c.device is not None]
    return c.device


def _same_training(got, got_params, want, want_params) -> None:
    """Losses and parameters after training on cuda:0 equal cpu's: bit for bit on the
    emulator, within 1e-4 on a GPU (the steps' matmuls, sums and exp/log, compounded)."""
    assert len(got) == len(want) and len(got_params) == len(want_params)
    assert_same(got, want, exact=False, rtol=1e-4)
    for b, a in zip(got_params, want_params, strict=True):
        assert_same(b, a, exact=False, rtol=1e-4)


OPTS = [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=1e-2))]


def assert_captured(run, steps: int) -> None:
    """``run`` was captured once and replayed at each later step of ``steps`` (see
    ``assert_captures`` for CuPy's refusal of cuBLAS)."""
    assert_captures(run, 1, steps - 1)


@pytest.mark.parametrize("cuda_graph", [True, False], ids=["captured", "launched"])
@pytest.mark.parametrize("opt_name,kwargs", OPTS, ids=[o for o, _ in OPTS])
def test_a_step_on_cuda_trains_as_cpu_graph_mode_bit_for_bit(cuda, opt_name, kwargs, cuda_graph):
    data = batches(5)
    want, want_params, _ = train("cpu", opt_name, kwargs, data)
    got, got_params, step = train(CUDA, opt_name, kwargs, data, cuda_graph=cuda_graph)
    _same_training(got, got_params, want, want_params)
    run = program_of(step)
    if cuda_graph:
        assert_captured(run, 5)
    else:
        assert (run.captures, run.replays, run.launches) == (0, 0, 5 * len(run.kernels))


def test_a_captured_step_is_one_replay_per_step_and_reads_each_steps_inputs(cuda):
    data = batches(6, seed=3)
    want, _, _ = train(CUDA, "SGD", dict(lr=0.1, momentum=0.9), data, cuda_graph=False)
    got, _, step = train(CUDA, "SGD", dict(lr=0.1, momentum=0.9), data)
    assert got == want
    run = program_of(step)
    kernels = len(run.kernels)  # (a run of elementwise steps is one)
    # captured once (after the first step's own launches), then one replay per step: no
    # kernel was launched one by one after the first step
    assert_captured(run, len(data))
    if run.capture_failed is not None:  # (CuPy's refusal of cuBLAS)
        assert run.launches == len(data) * kernels
        return
    assert run.launches == kernels
    if hasattr(run.graph, "__len__"):  # (the emulator's graph counts its commands)
        assert run.captured_commands >= kernels
        assert len(run.graph) == run.captured_commands


def test_a_replay_reads_new_inputs_not_the_captured_ones(cuda):
    class Double(nn.Graph):
        def build(self, x):
            return (x * 2).sum()

    g = Double()
    outs = [g(af.tensor(np.full(4, float(k), np.float32), device=CUDA)) for k in range(4)]
    assert [float(o) for o in outs] == [0.0, 8.0, 16.0, 24.0]
    run = program_of(g)
    assert_captured(run, 4)
    host = np.full(4, 5.0, np.float32)  # a host input: copied to the device first
    assert float(g(host)) == 40.0


def test_a_new_layout_or_option_compiles_and_captures_anew(cuda):
    model, step = make(CUDA, "SGD", dict(lr=0.1))
    big, small = batches(3, b=6), batches(2, b=4, seed=1)
    for x, y in big + small + big[:1]:
        step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))
    af.synchronize()  # (the counts move as the steps run)
    runs = [step._compiled[k].device for k in step._compiled]
    assert len(runs) == 2  # one per layout, kept
    for r, replays in zip(
        sorted(runs, key=lambda r: r.replays + r.uncaptured), (1, 3), strict=True
    ):
        assert_captures(r, 1, replays)
    step._optimizers[0].param_groups[0]["lr"] = 0.05  # a new rate: state the replay
    x, y = big[0]  # reads, nothing compiled anew
    step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))
    assert len(step._compiled) == 2
    step._optimizers[0].param_groups[0]["weight_decay"] = 0.1  # a new option: compiled
    step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))
    assert len(step._compiled) == 3
    model.eval()  # a new mode: compiled and captured anew too
    step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))
    af.synchronize()
    assert len(step._compiled) == 4
    for c in step._compiled.values():  # each captured once
        assert_captures(c.device, 1, c.device.replays or c.device.uncaptured)


def test_replaced_state_is_captured_again(cuda):
    model, step = make(CUDA, "Adam", dict(lr=1e-2))
    data = batches(4)
    for x, y in data[:2]:
        step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))
    opt = step._optimizers[0]
    opt.load_state_dict(opt.state_dict())  # new state tensors: new addresses
    for x, y in data[2:]:
        step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))
    af.synchronize()
    run = program_of(step)
    assert_captures(run, 2, 2)
    _, want_params, _ = train("cpu", "Adam", dict(lr=1e-2), data)
    _same_training([], [p.numpy() for p in model.parameters()], [], want_params)


def test_a_fault_in_a_replayed_step_surfaces_at_the_loss_and_keeps_the_parameters(emu):
    drv = emu()
    data = batches(4, seed=5)
    model, step = make(CUDA, "SGD", dict(lr=0.1, momentum=0.9))
    losses = []
    for x, y in data[:2]:
        losses.append(float(step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))))
    before = [p.numpy() for p in model.parameters()]
    drv.fail_kernel("relu")  # inside the replayed step
    x, y = data[2]
    loss = step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))
    with pytest.raises(KernelError, match="injected fault in kernel relu") as e:
        float(loss)
    assert "TrainStep.step" in str(e.value) and "nothing was written back" in str(e.value)
    del loss
    settle()
    for a, p in zip(before, model.parameters(), strict=True):
        np.testing.assert_array_equal(a, p.numpy())  # nothing was written back
    for x, y in data[2:]:  # the runtime goes on
        losses.append(float(step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))))
    want, want_params, _ = train("cpu", "SGD", dict(lr=0.1, momentum=0.9), data)
    assert losses == want
    for a, p in zip(want_params, model.parameters(), strict=True):
        np.testing.assert_array_equal(a, p.numpy())
    assert (af.ones(3, device=CUDA) + 1).numpy().tolist() == [2.0, 2.0, 2.0]
    assert program_of(step).captures == 1


def test_steps_under_random_stream_delays_equal_cpu(emu):
    emu(delay=2e-4, seed=11)
    data = batches(4, seed=2)
    want, want_params, _ = train("cpu", "Adam", dict(lr=1e-2), data)
    got, got_params, _ = train(CUDA, "Adam", dict(lr=1e-2), data)
    assert got == want
    for a, b in zip(want_params, got_params, strict=True):
        np.testing.assert_array_equal(a, b)


def test_profile_on_cuda_lists_the_kernels_of_a_step(cuda):
    data = batches(3)
    model, step = make(CUDA, "SGD", dict(lr=0.1))
    x, y = data[0]
    step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))  # compiled, captured
    with af.profile() as prof:
        loss = step(af.tensor(data[1][0], device=CUDA), af.tensor(data[1][1], device=CUDA))
        z = af.ones(4, device=CUDA) * 3
        float(loss), z.numpy()
    names = [launch.name for launch in program_of(step).kernels]  # (a run: add+mul...)
    kernels = [e for e in prof.events() if e.get("cat") == "op"]
    by_name = [e["name"] for e in kernels]
    step_ev = next(e for e in kernels if e["name"] == "TrainStep.step")
    assert step_ev["args"]["kernels"] == len(names)
    inside = [
        e
        for e in kernels
        if e["name"] != "TrainStep.step"  # (its stream: a
        and e["tid"] == step_ev["tid"]
        and step_ev["ts"] <= e["ts"]
        and e["ts"] + e["dur"] <= step_ev["ts"] + step_ev["dur"] + 0.01
    ]
    assert [e["name"] for e in inside][: len(names)] == names  # release may overlap)
    assert "mul_scalar" in by_name or "mul" in by_name  # the eager op too
    table = prof.summary()
    assert "TrainStep.step" not in table and "matmul" in table
    for e in kernels:
        if e["name"] == "release":  # a device blob's free: host work, no launch
            continue
        assert e["dur"] >= 0 and "launched_us" in e["args"]
        assert "skipped" not in e["args"] and "failed" not in e["args"]


def test_a_fused_run_on_cuda_trains_as_cpu_from_cuda_tensors_and_a_loader(cuda):
    data = batches(4, seed=4)
    want, want_params, _ = train("cpu", "Adam", dict(lr=1e-2), data)
    model, step = make(CUDA, "Adam", dict(lr=1e-2))
    items = [(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA)) for x, y in data]
    got = [float(v) for v in step.run(items[:2], fused=True)]
    got += [float(v) for v in step.run(data[2:], fused=True)]  # host batches
    _same_training(got, [p.numpy() for p in model.parameters()], want, want_params)
    run = program_of(step)
    assert_captures(run, 1, 3)  # one step, one graph

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((40, 8)).astype(np.float32), rng.integers(0, 3, 40)

    def loader():
        return af.data.DataLoader(af.data.TensorDataset(x, y), batch_size=16, shuffle=True, seed=1)

    _, cpu_step = make("cpu", "SGD", dict(lr=0.1, momentum=0.9))
    _, cuda_step = make(CUDA, "SGD", dict(lr=0.1, momentum=0.9))
    want = [float(v) for v in cpu_step.run(loader(), fused=True)]
    got = [float(v) for v in cuda_step.run(loader(), fused=True)]
    assert len(got) == 3  # (the last smaller)
    _same_training(got, [], want, [])


def test_a_run_with_an_actor_per_op_on_cuda_trains_as_cpu(cuda):
    data = batches(3, seed=8)
    want, want_params, _ = train("cpu", "SGD", dict(lr=0.1, momentum=0.9), data)
    model, step = make(CUDA, "SGD", dict(lr=0.1, momentum=0.9))
    got = [float(v) for v in step.run(data)]
    _same_training(got, [p.numpy() for p in model.parameters()], want, want_params)


def test_a_poisoned_input_fails_the_step_and_leaves_the_parameters_readable(emu):
    drv = emu()
    data = batches(3, seed=6)
    model, step = make(CUDA, "SGD", dict(lr=0.1, momentum=0.9))
    x, y = data[0]
    first = float(step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA)))
    before = [p.numpy() for p in model.parameters()]
    drv.fail_kernel("abs")
    bad = af.abs(af.tensor(data[1][0], device=CUDA))  # poisoned by its failed kernel
    loss = step(bad, af.tensor(data[1][1], device=CUDA))
    with pytest.raises(KernelError, match="abs"):
        float(loss)
    del loss, bad
    settle()
    for a, p in zip(before, model.parameters(), strict=True):
        np.testing.assert_array_equal(a, p.numpy())
    got = [first] + [
        float(step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))) for x, y in data[1:]
    ]
    want, _, _ = train("cpu", "SGD", dict(lr=0.1, momentum=0.9), data)
    assert got == want


def test_eager_adam_on_cuda_equals_cpu(cuda):
    def run(device):
        af.manual_seed(0)
        model = nn.Sequential(
            nn.Linear(8, 16, device=device), nn.ReLU(), nn.Linear(16, 3, device=device)
        )
        opt = optim.Adam(model.parameters(), lr=1e-2)
        losses = []
        for x, y in batches(3):
            opt.zero_grad()
            loss = nn.CrossEntropyLoss()(
                model(af.tensor(x, device=device)), af.tensor(y, device=device)
            )
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses, [p.numpy() for p in model.parameters()]

    (a, pa), (b, pb) = run("cpu"), run(CUDA)
    _same_training(b, pb, a, pa)


class _NoCaptureOfAllocations(EmuDriver):
    """A driver that, as CuPy's, cannot capture a reference form's allocations."""

    captures_allocations = False


def test_a_step_with_reference_forms_is_launched_one_by_one_where_the_driver_cannot_capture(emu):
    settle()
    use_driver(lambda dev: _NoCaptureOfAllocations(dev))
    data = batches(5)
    want, want_params, _ = train("cpu", "SGD", dict(lr=0.1), data)
    got, got_params, step = train(CUDA, "SGD", dict(lr=0.1), data)
    assert got == want
    for a, b in zip(want_params, got_params, strict=True):
        np.testing.assert_array_equal(a, b)
    run = program_of(step)
    assert run.reference_launches  # (matmul's, at least)
    assert (run.captures, run.replays, run.uncaptured) == (0, 0, 5)
    assert run.launches == 5 * len(run.kernels)


class _RefusesACapture(EmuDriver):
    """A driver whose streams refuse one capture, as CuPy's do when a reference form
    synchronizes or reads host memory while captured."""

    refused = 0

    def stream(self, name: str = "compute"):
        s = super().stream(name)
        end = s.end_capture

        def end_capture():
            graph = end()
            if _RefusesACapture.refused == 0:
                _RefusesACapture.refused += 1
                raise DeviceError(f"stream {s.name}: the capture failed (a test's refusal)")
            return graph

        s.end_capture = end_capture
        return s


def test_a_refused_capture_runs_that_step_and_the_later_ones_launched(emu, monkeypatch):
    settle()
    monkeypatch.setattr(_RefusesACapture, "refused", 0)
    use_driver(lambda dev: _RefusesACapture(dev))
    data = batches(5)
    want, want_params, _ = train("cpu", "Adam", dict(lr=1e-2), data)
    got, got_params, step = train(CUDA, "Adam", dict(lr=1e-2), data)
    assert got == want  # the refused capture's step ran (its first run), once
    for a, b in zip(want_params, got_params, strict=True):
        np.testing.assert_array_equal(a, b)
    run = program_of(step)
    assert _RefusesACapture.refused == 1 and "a test's refusal" in run.capture_failed
    # step 1: its first run, then the refused capture; steps 2-5 launched one by one
    assert (run.captures, run.replays, run.uncaptured) == (0, 0, 4)
    assert run.launches == 5 * len(run.kernels)


class Reductions(nn.Graph):
    def build(self, x):
        return (x.exp() * 2).sum(dim=0) - x.max() + x.mean(dim=1).sum()


def test_a_step_of_reductions_in_the_reference_form_is_captured(cuda):
    """A step whose reference launches allocate temporaries (CuPy's reductions) but call no
    cuBLAS is captured on CuPy too (its temporaries from the capture's own pool), and every
    replay computes the new input's values."""
    step = Reductions()
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((6, 5)).astype(np.float32) for _ in range(4)]
    got = [step(af.tensor(x, device=CUDA)).numpy() for x in xs]
    want = [Reductions()(af.tensor(x)).numpy() for x in xs]
    for g, w in zip(got, want, strict=True):
        assert_same(g, w, exact=False)
    run = program_of(step)
    assert run.reference_launches  # (what the capture's pool is for)
    assert run.capture_failed is None
    assert (run.captures, run.replays, run.uncaptured) == (1, 3, 0)


class Affine(nn.Graph):
    def build(self, x):
        return x * 2.0 + 1.0


def test_a_step_of_generated_kernels_is_captured_on_such_a_driver_too(emu):
    settle()
    use_driver(lambda dev: _NoCaptureOfAllocations(dev))
    step = Affine()
    x = np.arange(6, dtype=np.float32)
    for k in range(3):
        out = step(af.tensor(x + k, device=CUDA))
        np.testing.assert_array_equal(out.numpy(), (x + k) * 2 + 1)
    run = program_of(step)
    assert run.reference_launches == ()
    assert (run.captures, run.replays, run.uncaptured) == (1, 2, 0)


def test_the_rates_follow_the_parameters_moved_to_cuda(emu):
    emu()
    data = batches(4, seed=3)
    want, want_params, _ = train("cpu", "SGD", dict(lr=0.1), data)
    af.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = optim.SGD(model.parameters(), lr=0.1)
    step = TrainStep(model, opt)
    got = [float(step(af.tensor(x), af.tensor(y))) for x, y in data[:2]]  # rates on cpu
    model.to("cuda:0")  # (the same graph: compiled anew there)
    got += [
        float(step(af.tensor(x, device="cuda:0"), af.tensor(y, device="cuda:0")))
        for x, y in data[2:]
    ]
    assert got == want
    for p, w in zip(model.parameters(), want_params, strict=True):
        assert_same(p.numpy(), w)
