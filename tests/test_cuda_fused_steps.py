"""A compiled step on cuda:0 (nn.Graph.step, on the CUDA emulator) launches generated
kernels, made once per program, and makes each chain of consecutive elementwise steps
whose intermediates are temporaries read only inside it ONE generated kernel, a run
(kernels.fused): fewer launches per step, values equal to cpu's graph mode bit for bit
(the emulator runs each run kernel's numpy reference, which computes the chain step by
step from the packed arguments), captured or launched one by one; every run's source
launched compiles with NVRTC; a chain is cut where an intermediate is also a program
output or a state's new value; ops the generator does not cover launch their reference
form."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn
from actorflow.backends.cuda import kernels as K
from actorflow.backends.cuda import nvrtc
from actorflow.backends.cuda.emu import EmuDriver, EmuStream
from actorflow.backends.cuda.selection import use_driver
from actorflow.errors import DivisionByZeroError
from cuda_fixtures import CUDA, settle
from test_cuda_graph_mode import OPTS, batches, make, program_of

pytestmark = pytest.mark.timeout(120)


def train(device, opt_name, kwargs, data, seen=None, **graph_kw):
    """Trains test_cuda_graph_mode's MLP on ``data``: (losses, parameters, the Graph).
    ``seen``: the launches list, emptied once the model and the batches are on the device
    (it then holds the steps' launches only)."""
    model, step = make(device, opt_name, kwargs, **graph_kw)
    items = [(af.tensor(x, device=device), af.tensor(y, device=device)) for x, y in data]
    if seen is not None:
        af.synchronize(30)
        del seen[:]
    losses = [step(x, y) for x, y in items]
    return [float(v) for v in losses], [p.numpy() for p in model.parameters()], step


def run_kernels(seen):
    """The launched kernels that are runs of several ops (their names join the ops by '+')."""
    return [k for k in seen if k.source and "+" in k.name]


# launches of one MLP step: one per op before fusion, per planned launch now (Adam's
# 1 - beta1 and 1 - beta2 per parameter: 0-d ops of their own, the betas being state;
# SGD's momentum != 0 per parameter, the selects on it joining the chains)
LAUNCHES = {"SGD": (64, 44), "Adam": (124, 64)}


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["launched", "captured"])
@pytest.mark.parametrize("opt_name,kwargs", OPTS, ids=[o for o, _ in OPTS])
def test_a_step_fuses_its_elementwise_chains_and_equals_cpu(launches, opt_name, kwargs, cuda_graph):
    data = batches(5)
    want, want_params, _ = train("cpu", opt_name, kwargs, data)
    got, got_params, step = train(CUDA, opt_name, kwargs, data, launches, cuda_graph=cuda_graph)
    assert got == want
    for a, b in zip(want_params, got_params, strict=True):
        np.testing.assert_array_equal(a, b)
    run = program_of(step)
    before, after = LAUNCHES[opt_name]
    assert (len(run.program.steps), len(run.kernels)) == (before, after)
    chains = [launch for launch in run.kernels if launch.ops > 1]
    assert chains and all(launch.kernel.source for launch in chains)
    # the kernels launched by the steps (a capture records its launches once: they run
    # again at each replay without a launch call), the generated ones carrying a source
    times = 2 if cuda_graph else 5  # (the first run and its capture, or 5 runs)
    mine = {id(launch.kernel) for launch in run.kernels}
    launches = [k for k in launches if id(k) in mine]  # (not the state's eager creation)
    assert len(launches) == times * after
    assert len(run_kernels(launches)) == times * len(chains)
    assert sum(1 for k in launches if k.source) == times * sum(
        1 for launch in run.kernels if launch.kernel.source
    )
    # the generated kernels (a run or one op) are most of a step's launches
    assert sum(1 for launch in run.kernels if launch.kernel.source) > after // 2
    # the intermediates of the chains got no memory
    assert sum(t is None for t in run.tmp) == sum(launch.ops - 1 for launch in chains)


def test_a_chain_is_cut_at_a_state_written_back(launches):
    data = batches(3)
    want, want_params, _ = train("cpu", "SGD", dict(lr=0.1, momentum=0.9), data)
    got, got_params, step = train(CUDA, "SGD", dict(lr=0.1, momentum=0.9), data)
    assert got == want
    for x, y in zip(want_params, got_params, strict=True):
        np.testing.assert_array_equal(x, y)
    run = program_of(step)
    names = [launch.name for launch in run.kernels if launch.ops > 1]
    # buf = where(momentum != 0, buf * 0.9 + grad, buf) is a state's new value, read by
    # the next step too: the chain ends there; then p = p - where(..., buf, grad) * 0.1
    # (the momentum and the rate 0-d tensors: state the step reads, for a schedule, which
    # may take the momentum through 0: then the buffer is kept, as PyTorch's)
    assert names.count("mul+add+where") == 4 and names.count("where+mul+sub") == 4
    news = {("tmp", ref[1]) for _, ref in run.program.assigns}
    for launch, slots in zip(run.kernels, run._slots, strict=True):
        if launch.ops > 1:  # written: the write-back copies it
            assert (launch.name in ("mul+add+where", "where+mul+sub")) == (slots[0] in news)


@pytest.mark.skipif(
    not nvrtc.available(),
    reason="NVRTC is not installed: pip install -e "
    "'.[nvrtc]' to compile the launched kernels without a GPU",
)
def test_every_run_source_launched_compiles_with_nvrtc(launches):
    for opt_name, kwargs in OPTS:
        train(CUDA, opt_name, kwargs, batches(2))
    x = af.tensor(np.arange(8, dtype=np.float16), device=CUDA)

    class Half(nn.Graph):  # a float16 chain: the scalar form
        def build(self, x):
            return ((x * 2 + 1).relu() - x).abs().sum()

    float(Half()(x))
    settle()
    sources = {k.source: k for k in run_kernels(launches)}
    assert len(sources) >= 8
    assert any(k.entry.endswith("_v4") for k in sources.values())  # float4 form
    assert any(not k.entry.endswith("_v4") for k in sources.values())
    nvrtc.compile_together(K.KernelSource(k.entry, s, (), k.params) for s, k in sources.items())


@pytest.mark.parametrize("opt_name,kwargs", OPTS, ids=[o for o, _ in OPTS])
def test_run_sources_compute_on_the_host_what_the_emulator_computed(
    monkeypatch, tmp_path, opt_name, kwargs
):
    """Each run kernel the MLP's steps launch, its CUDA C built by the host's C++
    compiler (tests/test_cuda_kernels.py's shim), run on the arguments the emulator packed
    for it, writes what its numpy reference wrote (bit for bit but libm's functions)."""
    import ctypes
    import dataclasses

    from test_cuda_kernels import _CTYPE, _assert_same, _host_library

    records = []
    launch = EmuStream.launch

    def recording(self, kernel, args, grid=None, block=None):
        if kernel.source and "+" in kernel.name:
            ref = kernel.reference

            def reference(*a, kernel=kernel):
                before = [x.copy() if isinstance(x, np.ndarray) else x for x in a]
                ref(*a)
                records.append((kernel, before, a[0].copy()))

            kernel = dataclasses.replace(kernel, reference=reference)
        return launch(self, kernel, args, grid, block)

    monkeypatch.setattr(EmuStream, "launch", recording)
    settle()
    use_driver(lambda dev: EmuDriver(dev))
    try:
        train(CUDA, opt_name, kwargs, batches(2), cuda_graph=False)
        settle()
    finally:
        use_driver(None)
    assert records
    lib = _host_library(
        [K.KernelSource(k.entry, k.source, (), k.params) for k, _, _ in records], tmp_path
    )
    for kernel, args, want in records:
        got = np.full_like(want, 7)
        packed = [ctypes.c_void_p(got.ctypes.data)]
        for (_, kind, t), a in zip(kernel.params[1:], args[1:], strict=True):
            if kind == "in":
                packed.append(ctypes.c_void_p(a.ctypes.data))
            elif kind == "scalar":
                packed.append(getattr(ctypes, _CTYPE[t])(a.item()))
            else:
                packed.append(ctypes.c_longlong(int(a)))
        getattr(lib, kernel.entry)(*packed)
        _assert_same(got.reshape(-1), want.reshape(-1), kernel.name)
    assert len({k.name for k, _, _ in records}) >= (4 if opt_name == "SGD" else 8)


class Chain(nn.Graph):
    """x -> a = x * 2 -> b = a + 1 -> c = b.exp() -> d = c - x, returning d and also
    ``also`` (a, b or c), which then must be written: the chain is cut there."""

    def __init__(self, also=None):
        super().__init__()
        self.also = also

    def build(self, x):
        a = x * 2
        b = a + 1
        c = b.exp()
        d = c - x
        vals = dict(a=a, b=b, c=c)
        return d if self.also is None else (d, vals[self.also])


def _eager_chain(x):
    a = x * 2
    b = a + 1
    c = b.exp()
    return c - x, dict(a=a, b=b, c=c)


@pytest.mark.parametrize("also", [None, "a", "b", "c"])
def test_a_chain_is_cut_where_an_intermediate_is_a_step_output(launches, also):
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    g = Chain(also)
    for _ in range(2):  # the first run, then a replay
        got = g(af.tensor(x, device=CUDA))
        d, vals = _eager_chain(af.tensor(x))
        if also is None:
            np.testing.assert_array_equal(got.numpy(), d.numpy())
        else:
            np.testing.assert_array_equal(got[0].numpy(), d.numpy())
            np.testing.assert_array_equal(got[1].numpy(), vals[also].numpy())
    run = program_of(g)
    cut = {None: [4], "a": [1, 3], "b": [2, 2], "c": [3, 1]}[also]
    assert [launch.ops for launch in run.kernels] == cut


def test_ops_the_generator_does_not_cover_launch_their_reference_form(launches):
    class Mixed(nn.Graph):
        def build(self, x, b):
            y = (x + b) * 2  # a broadcast row: not a generated kernel's
            z = y.T.exp()  # a strided view: the reference form
            return (z.sum(0) + 1).relu()

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    b = np.arange(4, dtype=np.float32)
    g = Mixed()
    got = [g(af.tensor(x, device=CUDA), af.tensor(b, device=CUDA)).numpy() for _ in range(2)]
    want = ((af.tensor(x) + af.tensor(b)) * 2).T.exp().sum(0).add(1).relu().numpy()
    for v in got:
        np.testing.assert_array_equal(v, want)
    plan = program_of(g).kernels
    by_name = {launch.name: launch for launch in plan}
    assert not by_name["add"].kernel.source  # the broadcast: reference form
    assert not by_name["sum"].kernel.source
    assert by_name["add_scalar+relu"].kernel.source and by_name["add_scalar+relu"].ops == 2


class Div(nn.Graph):
    def build(self, a, b):
        return (a // b + 1) * 2


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["launched", "captured"])
def test_an_integer_division_by_zero_in_a_step_raises(launches, cuda_graph):
    a = np.array([7, -7, 9, 3], np.int64)
    good, bad = np.array([2, 3, -4, 1], np.int64), np.array([2, 0, 1, 1], np.int64)
    g = Div(cuda_graph=cuda_graph)
    for _ in range(2):
        got = g(af.tensor(a, device=CUDA), af.tensor(good, device=CUDA)).numpy()
        np.testing.assert_array_equal(got, (a // good + 1) * 2)
    out = g(af.tensor(a, device=CUDA), af.tensor(bad, device=CUDA))
    with pytest.raises(DivisionByZeroError, match="floor_divide") as e:
        out.numpy()
    assert "Div.step" in str(e.value) and "nothing was written back" in str(e.value)
    assert "the stream's sticky error" in str(e.value)  # unlike an eager division
    del out
    settle()
    got = g(af.tensor(a, device=CUDA), af.tensor(good, device=CUDA)).numpy()
    np.testing.assert_array_equal(got, (a // good + 1) * 2)
    run = program_of(g)
    assert [launch.name for launch in run.kernels] == ["floor_divide", "add_scalar+mul_scalar"]
    assert (run.captures, run.replays) == ((1, 3) if cuda_graph else (0, 0))
    del g, run
    settle()
