"""Actor graphs on cuda:0, on the CUDA emulator (and, for the tests taking the ``cuda``
fixture, on the GPU too: ``pytest -m gpu``; cuda_fixtures.py): a Pipeline load -> copy to
cuda:0 -> compute there -> copy to cpu equal to the same stages on cpu under random delays
of the driver's streams; copies on the copy streams and compute on the compute stream; the
copy of piece k+1 issued while piece k's compute is held on the device (two registers per
edge); a plan over the device's budget refused before anything runs;
DataLoader(device="cuda:0"); and the errors: a stage giving an array of the wrong side of
the host boundary, a stage writing its input, a copy that crosses nothing, a kernel fault
stopping the run with the runtime going on."""

import threading

import numpy as np
import pytest

import actorflow as af
from actorflow.backends.cuda.emu import EmuDriver, EmuStream
from actorflow.errors import ActorError, DeviceError, PlanError
from cuda_fixtures import CUDA, settle

pytestmark = pytest.mark.timeout(120)


class LoggedStream(EmuStream):
    """An emulator stream that logs the commands issued on it (kind, stream name) in the
    driver's ``log``, and, while the driver's ``hold`` is set, holds its first command
    on its thread until ``hold`` is set free (or a timeout: ``held_out`` then says so)."""

    def _note(self, kind):
        d = self._driver
        with d.log_lock:
            d.log.append((kind, self.name))

    def launch(self, kernel, args, grid=None, block=None):
        self._note("launch")
        self._gate()
        super().launch(kernel, args, grid, block)

    def copy_h2d(self, dst, src):
        self._note("copy_h2d")
        super().copy_h2d(dst, src)
        d = self._driver
        if d.armed:
            d.h2d_in_run += 1
            if d.h2d_in_run >= 2:
                d.let_go.set()

    def copy_d2h(self, dst, src):
        self._note("copy_d2h")
        super().copy_d2h(dst, src)

    def copy_d2d(self, dst, src):
        self._note("copy_d2d")
        self._gate()
        super().copy_d2d(dst, src)

    def _gate(self):
        d = self._driver
        if d.armed and not d.gated:
            d.gated = True

            def hold(s):  # (on this stream's thread: the device is held there)
                if not d.let_go.wait(d.hold_for):
                    d.held_out = True

            self._issue(lambda: (1, hold, "hold"))


class LoggedDriver(EmuDriver):
    def __init__(self, device, **kw):
        super().__init__(device, **kw)
        self.log, self.log_lock = [], threading.Lock()
        self.armed = self.gated = self.held_out = False
        self.h2d_in_run = 0
        self.let_go = threading.Event()  # (not "free": the driver's free() of a block)
        self.hold_for = 5.0
        self.pinned_made = []

    def pinned(self, shape, dtype):
        a = super().pinned(shape, dtype)
        self.pinned_made.append(a)
        return a

    def stream(self, name="compute"):
        with self._cv:
            s = LoggedStream(self, name, len(self._streams))
            self._streams.append(s)
        return s


EMU_DRIVER = LoggedDriver  # the emu and cuda fixtures' emulator (cuda_fixtures)


def _pieces(n, seed=0, shape=(8, 16)):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


def _compute(x):
    return (x * 2.0 + 1.0).sum(1)


# -- values ----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_pipeline_on_cuda_equals_cpu_under_delays(emu, seed):
    emu(delay=0.001, seed=seed)
    data = _pieces(50, seed)
    want = list(af.Pipeline([data, _compute], buffers=2, seed=seed).run())
    pipe = af.Pipeline(
        [data, af.Copy(CUDA), _compute, af.Copy("cpu")], buffers=2, memory={CUDA: "1MiB"}, seed=seed
    )
    got = list(pipe.run())
    assert len(got) == 50
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert pipe.graph.plan().totals[af.device(CUDA)] == 2 * (8 * 16 + 8) * 4


def test_graph_on_cuda_with_tuples_two_inputs_and_a_cuda_sink(cuda):
    g = af.ActorGraph()
    xs = _pieces(6, 1)
    src = g.source([(x, x[:, :4].copy()) for x in xs])
    dev = g.copy(src, CUDA, name="up")
    both = g.actor(lambda p: {"a": p[0] + 1.0, "b": p[1] * 3.0}, dev, name="two")
    mixed = g.actor(lambda d, p: d["a"][:, :4] - d["b"] + p[1], both, dev, name="mix")
    g.sink(mixed, name="dev")
    g.sink(g.copy(both, "cpu", name="down"), name="host")
    outs = list(g.run())
    assert len(outs) == 6
    for out, x in zip(outs, xs, strict=True):
        t = out["dev"]
        assert isinstance(t, af.Tensor) and str(t.device) == CUDA  # a copy, on cuda:0
        np.testing.assert_allclose(t.numpy(), x[:, :4] + 1.0 - x[:, :4] * 3.0 + x[:, :4], rtol=1e-6)
        np.testing.assert_allclose(out["host"]["a"], x + 1.0, rtol=1e-6)
        np.testing.assert_allclose(out["host"]["b"], x[:, :4] * 3.0, rtol=1e-6)


@pytest.mark.parametrize("seed", [0, 5, 7])
def test_register_is_written_again_only_after_its_device_reads(emu, seed):
    """The run's output copies a device register on the device (a VM read still pending
    when the register goes home); the copy actor writes that register again only once the
    read completed (without that wait, piece k reads piece k+2's values here)."""
    emu(delay=0.002, seed=seed)
    data = _pieces(30, seed, shape=(4, 8))
    g = af.ActorGraph(buffers=2, seed=seed)
    g.sink(g.copy(g.source(data), CUDA))
    outs = list(g.run())
    assert len(outs) == 30
    for out, x in zip(outs, data, strict=True):
        np.testing.assert_array_equal(out.numpy(), x)


# -- streams and overlap ---------------------------------------------------------------------
def test_copies_on_copy_streams_compute_on_compute_stream(emu):
    cuda = emu()
    pipe = af.Pipeline(
        [_pieces(12), af.Copy(CUDA), _compute, af.Copy("cpu")], memory={CUDA: "1MiB"}
    )
    pipe.plan()
    del cuda.log[:]
    assert len(list(pipe.run())) == 12
    where = {}
    for kind, stream in cuda.log:
        where.setdefault(kind, set()).add(stream)
    counts = {k: sum(1 for kk, _ in cuda.log if kk == k) for k in where}
    assert where["copy_h2d"] == {"h2d"} and counts["copy_h2d"] >= 12
    assert where["copy_d2h"] == {"d2h"} and counts["copy_d2h"] >= 11  # (piece 0: planned)
    assert where["launch"] == {"compute"} and counts["launch"] >= 12
    assert where.get("copy_d2d", {"compute"}) == {"compute"}


@pytest.mark.parametrize("buffers", [2, 1])
def test_h2d_of_next_piece_issued_while_compute_is_held(emu, buffers):
    """The compute stream is held at piece 0's first command until the copy actor has
    issued its copy of piece 1: two registers per edge let it (the copy of piece 1 goes to
    the second register while piece 0's compute reads the first); with one, the copy
    waits for piece 0's register to come home, after its compute completed."""
    cuda = emu()
    cuda.hold_for = 5.0 if buffers == 2 else 0.5
    g = af.ActorGraph(buffers=buffers)
    src = g.source(_pieces(6), out=af.Spec((8, 16)))
    stage = g.actor(_compute, g.copy(src, CUDA), out=af.Spec((8,)))
    g.sink(g.copy(stage, "cpu"))
    g.plan()  # (no piece 0 computed while planning)
    cuda.armed = True
    outs = list(g.run())
    assert len(outs) == 6 and cuda.gated
    assert cuda.held_out is (buffers == 1)


def test_host_registers_that_copies_read_or_write_are_pinned(emu):
    cuda = emu()
    g = af.ActorGraph(buffers=2)
    src = g.source(_pieces(4), out=af.Spec((8, 16)))
    stage = g.actor(_compute, g.copy(src, CUDA), out=af.Spec((8,)))
    g.sink(g.copy(stage, "cpu", name="down"))
    plan = g.plan()
    plan.allocate()
    try:
        made = {id(a) for a in cuda.pinned_made}
        regs = {a.name: port.registers for a, port in plan.ports.items()}
        for name in ("source", "down"):
            assert len(regs[name]) == 2
            assert all(id(r.arrays[0]) in made for r in regs[name])
        assert af.lowlevel.memory_stats("cpu").in_use >= 2 * (8 * 16 + 8) * 4
    finally:
        plan.release()
    assert len(list(g.run())) == 4


# -- memory ------------------------------------------------------------------------------------
def test_plan_over_the_cuda_budget_is_refused_before_the_run(cuda):
    pipe = af.Pipeline(
        [_pieces(3, shape=(256, 256)), af.Copy(CUDA), _compute, af.Copy("cpu")],
        buffers=2,
        memory={CUDA: "300KiB"},
    )
    with pytest.raises(PlanError) as e:
        pipe.plan()
    msg = str(e.value)
    assert e.value.device == CUDA and e.value.budget == 300 * 1024
    assert e.value.needed == 2 * (256 * 256 + 256) * 4
    assert "cuda:0 budget" in msg and "buffers=1" in msg
    assert "sharing" not in msg  # (device registers never share an arena)
    settle()  # (piece 0 was computed there to size it)
    assert af.lowlevel.memory_stats(CUDA).in_use == 0  # no register was allocated
    pipe = af.Pipeline(
        [_pieces(3, shape=(256, 256)), af.Copy(CUDA), _compute, af.Copy("cpu")],
        buffers=1,
        memory={CUDA: "300KiB"},
    )
    assert len(list(pipe.run())) == 3


# -- DataLoader ----------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_on_cuda_yields_cuda_tensors_equal_to_cpu(cuda, workers):
    x = np.arange(35 * 3, dtype=np.float32).reshape(35, 3)
    y = np.arange(35, dtype=np.int64)
    ds = af.data.TensorDataset(x, y)
    host = [
        (a.numpy(), b.numpy())
        for a, b in af.data.DataLoader(ds, batch_size=4, shuffle=True, seed=3, workers=workers)
    ]
    dl = af.data.DataLoader(
        ds, batch_size=4, shuffle=True, seed=3, workers=workers, device=CUDA, memory={CUDA: "64KiB"}
    )
    got = list(dl)
    assert len(got) == len(host) == 9
    for (a, b), (ha, hb) in zip(got, host, strict=True):
        assert str(a.device) == CUDA and str(b.device) == CUDA
        np.testing.assert_array_equal(a.numpy(), ha)
        np.testing.assert_array_equal(b.numpy(), hb)
    assert "to_device" in dl.stats().actors


# -- errors --------------------------------------------------------------------------------------
def test_stage_on_cuda_returning_a_host_array_is_refused(cuda):
    calls = []

    def f(x):
        calls.append(1)
        return x.numpy() if len(calls) == 4 else x * 2.0  # the 4th call: piece 3

    pipe = af.Pipeline(
        [_pieces(6), af.Copy(CUDA), f, af.Copy("cpu")], names=[None, None, "scale", None]
    )
    with pytest.raises(ActorError) as e:
        list(pipe.run())
    assert e.value.actor == "scale" and e.value.piece == 3
    assert isinstance(e.value.__cause__, DeviceError)
    msg = str(e.value)
    assert "returned a ndarray" in msg and "register is on cuda:0" in msg
    assert ".to('cuda:0')" in msg
    assert len(list(af.Pipeline([_pieces(3), af.Copy(CUDA), _compute, af.Copy("cpu")]).run())) == 3


def test_host_stage_returning_a_cuda_tensor_is_refused(cuda):
    g = af.ActorGraph()
    g.sink(g.actor(lambda x: af.tensor(x, device=CUDA), g.source(_pieces(3)), name="up"))
    with pytest.raises(ActorError) as e:
        list(g.run())
    assert e.value.actor == "up" and e.value.piece == 0
    msg = str(e.value)
    assert "tensor on cuda:0" in msg and "register is on cpu" in msg
    assert "g.copy(x, 'cpu')" in msg and "af.Copy('cpu')" in msg


def test_stage_on_cuda_writing_its_input_is_refused(cuda):
    def f(x):
        x.mul_(2.0)
        return x + 1.0

    with pytest.raises(ActorError) as e:
        list(af.Pipeline([_pieces(3), af.Copy(CUDA), f, af.Copy("cpu")]).run())
    assert "read-only" in str(e.value) and "clone" in str(e.value)


def test_copy_that_crosses_no_boundary_is_refused(cuda):
    g = af.ActorGraph()
    src = g.source(_pieces(2))
    with pytest.raises(DeviceError, match="crosses no host boundary"):
        g.copy(src, "cpu")
    up = g.copy(src, CUDA)
    with pytest.raises(DeviceError, match="crosses no host boundary"):
        g.copy(up, "cuda:0")


def test_kernel_fault_in_a_stage_stops_the_run_and_the_runtime_goes_on(emu):
    cuda = emu()

    def build():
        g = af.ActorGraph()
        src = g.source(_pieces(8), out=af.Spec((8, 16)))
        stage = g.actor(_compute, g.copy(src, CUDA), out=af.Spec((8,)), name="compute")
        g.sink(g.copy(stage, "cpu"))
        return g

    g = build()
    g.plan()
    cuda.fail_kernel(None, RuntimeError("injected fault"))
    with pytest.raises(ActorError) as e:
        list(g.run())
    assert e.value.actor == "compute"
    assert "injected fault" in str(e.value)
    settle()
    want = [_compute(x) for x in _pieces(8)]
    for got, w in zip(build().run(), want, strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-6)
    assert af.tensor([1.0, 2.0], device=CUDA).sum().item() == 3.0
