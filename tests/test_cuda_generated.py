"""Elementwise op calls on cuda:0 launch the generated CUDA C kernels (kernels.py), on the
emulator too: each such launch carries the kernel's source and a numpy reference over the
same packed arguments (outputs, inputs, scalar parameters, n, the zero flag), which the
emulator runs. Checked here: every elementwise op in every dtype, with full, one-element
(0-d and not) operands and Python-number attrs of each kind, equals cpu and took the
generated path; the calls the generator cannot take (strided views, other broadcasts, an
in-place write over a one-element view of itself) fall back to the op's numpy kernel and
equal cpu too; an integer division by zero raises DivisionByZeroError through the zero
flag; every source launched compiles with NVRTC."""

import numpy as np
import pytest

import actorflow as af
from actorflow.backends.cuda import kernels as K
from actorflow.backends.cuda import nvrtc
from actorflow.eager.interpreter import apply
from actorflow.errors import DivisionByZeroError, DTypeError, KernelError
from actorflow.ops.registry import all_ops
from actorflow.tensor.tensor import wrap
from cuda_fixtures import CUDA

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("one_launch_per_op")]

DTYPES = [af.bool, af.int32, af.int64, af.float16, af.float32, af.float64]
PYVALUES = {"bool": True, "int": 3, "float": -1.5}


def _values(dtype, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    v = rng.uniform(-4.0, 4.0, size=shape)
    if dtype is af.bool:
        return v > 0
    if dtype.is_floating_point:
        return v.astype(dtype.np)
    v = np.ceil(v)
    return np.where(v == 0, 1, v).astype(dtype.np)  # no integer divisor is 0


def _run(op, arrays, dtypes, attrs, device):
    """The op's outputs on ``device`` as numpy arrays, or the error's type."""
    impls = [
        af.tensor(a, dtype=d, device=device)._impl for a, d in zip(arrays, dtypes, strict=True)
    ]
    try:
        out = apply(op, impls, dict(attrs))
    except (DTypeError, TypeError, ValueError) as e:
        return ("refused", type(e))
    try:
        return [wrap(o).numpy() for o in out]
    except KernelError as e:
        return ("failed", type(e.original))


def _same(a, b):
    if isinstance(a, tuple) or isinstance(b, tuple):
        assert a == b
        return
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


def _generated(seen):
    return [k for k in seen if k.source]


def _cases(name):
    """``(arrays, dtypes, attrs)`` for op ``name``: each dtype with full operands, a 0-d and
    a one-element second operand, and each kind of Python number for a scalar attr."""
    op = all_ops()[name]
    n_in = len(op.inputs)
    for dt in DTYPES:
        arrays = [_values(dt, seed=j) for j in range(n_in)]
        scalar_attrs = (
            [{"scalar": v} for v in PYVALUES.values()] if op.attrs == ("scalar",) else [{}]
        )
        if name == "gelu":
            scalar_attrs = [{"approximate": "none"}, {"approximate": "tanh"}]
        for attrs in scalar_attrs:
            yield arrays, [dt] * n_in, attrs
        if n_in == 2:
            for other in DTYPES:
                for shape in ((), (1,), (3, 4)):
                    yield [arrays[0], _values(other, shape, seed=5)], [dt, other], {}


COVERED = sorted(
    n
    for n, op in all_ops().items()
    if n in K.OPS and op.elementwise and op.attrs in ((), ("scalar",), ("approximate",))
)


def test_the_covered_ops_are_the_families():
    assert {
        "add",
        "rsub_scalar",
        "eq",
        "floor_divide",
        "gelu",
        "bitwise_xor",
        "copy",
        "logical_or",
        "pow_scalar",
    } <= set(COVERED)


@pytest.mark.parametrize("name", COVERED)
def test_every_op_and_dtype_on_the_generated_path_equals_cpu(launches, name):
    op = all_ops()[name]
    ran = 0
    for arrays, dtypes, attrs in _cases(name):
        cpu = _run(op, arrays, dtypes, attrs, "cpu")
        if isinstance(cpu, tuple):
            continue  # a dtype the op refuses on cpu too
        del launches[:]
        dev = _run(op, arrays, dtypes, attrs, CUDA)
        _same(cpu, dev)
        gen = [k for k in _generated(launches) if k.name == name]
        assert len(gen) == 1, (name, dtypes, attrs, launches)
        assert gen[0].entry in gen[0].source and gen[0].params
        f32 = cpu[0].dtype == np.float32 and all(d is af.float32 for d in dtypes)
        assert gen[0].entry.endswith("_v4") == f32  # float4 loads for float32
        ran += 1
    assert ran, f"{name}: no case ran"


def test_clamp_where_cast_and_clamp_tensor_take_the_generated_path(launches):
    x = _values(af.float32)
    lo = _values(af.float32, seed=1)
    for f in (
        lambda d: af.tensor(x, device=d).clamp(-1, 2),
        lambda d: af.tensor(x, device=d).clamp(min=0.5),
        lambda d: af.tensor(x, device=d).clamp(max=1),
        lambda d: af.tensor(x, device=d).clamp(min=af.tensor(lo, device=d)),
        lambda d: af.tensor(x, device=d).clamp(
            af.tensor(lo, device=d), af.tensor(lo + 1, device=d)
        ),
        lambda d: af.where(af.tensor(x, device=d) > 0, af.tensor(x, device=d), 0),
        lambda d: af.where(af.tensor(x, device=d) > 0, 1.5, -2),
        lambda d: af.where(
            af.tensor(x, device=d) > 0, af.tensor(lo, device=d), af.tensor(x, device=d).double()
        ),
        lambda d: af.tensor(x, device=d).half(),
        lambda d: af.tensor(x, device=d).long(),
        lambda d: af.tensor(x, device=d).half() * 0.1,
        lambda d: af.tensor(x, device=d).clone(),
    ):
        cpu = f("cpu").numpy()
        del launches[:]
        dev = f(CUDA).numpy()
        assert cpu.dtype == dev.dtype
        np.testing.assert_array_equal(cpu, dev)
        assert _generated(launches), launches
        assert all(
            k.source
            for k in launches
            if k.name in ("clamp", "clamp_tensor", "where", "cast", "copy")
        )


def test_in_place_ops_take_the_generated_path(launches):
    x = _values(af.float32)
    outs = {}
    for dev in ("cpu", CUDA):
        t = af.tensor(x, device=dev)
        t.add_(1)
        t.mul_(t)
        t.clamp_(max=5)
        t[1].sub_(2)  # a contiguous row view: generated too
        outs[dev] = t.numpy()
    np.testing.assert_array_equal(outs["cpu"], outs[CUDA])
    assert [k.name for k in _generated(launches)] == ["add_scalar", "mul", "clamp", "sub_scalar"]


@pytest.mark.parametrize(
    "case",
    ["transposed", "row broadcast", "column broadcast", "strided slice", "one element of itself"],
)
def test_calls_the_generator_cannot_take_fall_back_and_equal_cpu(launches, case):
    x = _values(af.float32, (4, 6))
    row = _values(af.float32, (6,), seed=2)
    col = _values(af.float32, (4, 1), seed=3)

    def f(d):
        t = af.tensor(x, device=d)
        if case == "transposed":
            return t.T * 2
        if case == "row broadcast":
            return t + af.tensor(row, device=d)
        if case == "column broadcast":
            return t - af.tensor(col, device=d)
        if case == "strided slice":
            return t[:, ::2].exp()
        t.add_(t[0, 0])  # reads element 0 while writing it
        return t

    cpu = f("cpu").numpy()
    del launches[:]
    dev = f(CUDA).numpy()
    np.testing.assert_array_equal(cpu, dev)
    ops = [k for k in launches if k.name in ("mul_scalar", "add", "sub", "exp")]
    assert ops and not any(k.source for k in ops), launches


@pytest.mark.parametrize("expr", ["a // b", "a % b", "trunc", "7 // a", "7 % a"])
@pytest.mark.parametrize("dtype", [af.int32, af.int64])
def test_integer_division_by_zero_raises_through_the_zero_flag(launches, expr, dtype):
    a = np.array([6, -7, 0, 9], dtype.np)
    b = np.array([2, 0, 3, -4], dtype.np)
    fns = {
        "a // b": lambda x, y: x // y,
        "a % b": lambda x, y: x % y,
        "trunc": lambda x, y: af.div(x, y, rounding_mode="trunc"),
        "7 // a": lambda x, y: 7 // x,
        "7 % a": lambda x, y: 7 % x,
    }
    fn = fns[expr]
    with pytest.raises(DivisionByZeroError) as cpu_err:
        fn(af.tensor(a), af.tensor(b)).numpy()
    x, y = af.tensor(a, device=CUDA), af.tensor(b, device=CUDA)
    with pytest.raises(DivisionByZeroError) as dev_err:
        fn(x, y).numpy()
    assert str(
        cpu_err.value.original if hasattr(cpu_err.value, "original") else cpu_err.value
    ).split(":")[0] in str(dev_err.value)
    assert any(k.source and "zero" in [p[1] for p in k.params] for k in launches)
    # no zero divisor: the same kernel, and no error
    good = np.array([2, 5, 3, -4], dtype.np)
    del launches[:]
    np.testing.assert_array_equal(
        fn(af.tensor(good, device=CUDA), af.tensor(good, device=CUDA)).numpy(),
        fn(af.tensor(good), af.tensor(good)).numpy(),
    )
    assert _generated(launches)
    af.synchronize(30)


def test_an_integer_division_by_zero_fails_only_the_op_and_what_is_computed_from_it(launches):
    """As on cpu: the eager zero flag is checked when the op completes, not as the stream's
    sticky error, so an op issued after it on its stream that does not read its output runs;
    the ops issued ahead of the check that read it (on its stream and across) fail with its
    error. The compute stream is held, so that all of them are issued before the check."""
    import threading

    from actorflow.backends import get_backend
    from actorflow.eager.interpreter import use_stream

    a = af.tensor(np.arange(1, 9, dtype=np.int64), device=CUDA)
    z = af.tensor(np.array([1, 0, 1, 1, 1, 1, 1, 1], np.int64), device=CUDA)
    side = af.lowlevel.stream(CUDA, "side")
    af.synchronize(30)
    b = get_backend(af.device(CUDA))
    gate = threading.Event()
    b.driver_stream(b.compute).add_callback(lambda: gate.wait(60))
    try:
        x = a // z  # divides by zero
        y = x + 1  # computed from it, same stream
        with use_stream(side):
            w = y * 2  # and across streams
        v = a * 3  # reads only a, after it on its stream
    finally:
        gate.set()
    for t in (x, y, w):
        with pytest.raises(DivisionByZeroError, match="floor_divide: integer division by zero"):
            t.numpy()
    np.testing.assert_array_equal(v.numpy(), np.arange(1, 9) * 3)
    np.testing.assert_array_equal((a + 1).numpy(), np.arange(2, 10))
    af.synchronize(30)  # reported once, by the reads


@pytest.mark.skipif(
    not nvrtc.available(),
    reason="NVRTC is not installed: pip install -e "
    "'.[nvrtc]' to compile the launched kernels without a GPU",
)
def test_every_source_launched_compiles_with_nvrtc(launches):
    for name in COVERED:
        op = all_ops()[name]
        for arrays, dtypes, attrs in _cases(name):
            _run(op, arrays, dtypes, attrs, CUDA)
    sources = {k.source: k for k in _generated(launches)}
    assert len(sources) > 300
    nvrtc.compile_together(K.KernelSource(k.entry, s, (), k.params) for s, k in sources.items())


def test_contiguous_views_take_the_generated_path(launches):
    x = _values(af.float32, (5, 4))
    y = _values(af.float32, (3, 4), seed=1)
    fns = (
        lambda d: af.tensor(x, device=d)[1:4] + af.tensor(y, device=d),
        lambda d: af.tensor(y, device=d)[0] * af.tensor(x, device=d)[2],
        lambda d: af.tensor(x, device=d)[1:4].reshape(12) - af.tensor(y, device=d).reshape(12),
        lambda d: af.tensor(x, device=d)[1:2, 1:2] * af.tensor(y, device=d),
    )
    for f in fns:
        cpu = f("cpu").numpy()
        del launches[:]
        np.testing.assert_array_equal(f(CUDA).numpy(), cpu)
        assert [k.name for k in _generated(launches)] in (["add"], ["mul"], ["sub"])


def test_where_with_a_number_for_x_or_for_y_gets_its_own_kernel(launches):
    x = _values(af.float32)
    for f in (
        lambda d: af.where(af.tensor(x, device=d) > 0, 1.5, af.tensor(x, device=d)),
        lambda d: af.where(af.tensor(x, device=d) > 0, af.tensor(x, device=d), 1.5),
    ):
        np.testing.assert_array_equal(f(CUDA).numpy(), f("cpu").numpy())
    assert len({k.entry for k in _generated(launches) if k.name == "where"}) == 2


def test_a_python_int_past_the_parameters_range_takes_the_numpy_kernel(launches):
    x = _values(af.int64)
    np.testing.assert_array_equal(
        (af.tensor(x, device=CUDA) + (1 << 62)).numpy(), (af.tensor(x) + (1 << 62)).numpy()
    )
    errors = []
    for dev in ("cpu", CUDA):
        try:
            (af.tensor(x, device=dev) + (1 << 70)).numpy()
        except Exception as e:  # noqa: BLE001 - compared below
            errors.append(type(getattr(e, "original", e)))
    assert len(errors) == 2 and errors[0] is errors[1]
