"""floor_divide (//), remainder (%), unary +, clamp: against numpy and PyTorch; integer
division by zero raises as in PyTorch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import actorflow as af
from actorflow.lowlevel import get_vm

pytestmark = pytest.mark.timeout(60)

ints = hnp.arrays(np.int64, hnp.array_shapes(max_dims=2, max_side=5), elements=st.integers(-50, 50))
floats = hnp.arrays(
    np.float32, hnp.array_shapes(max_dims=2, max_side=5), elements=st.floats(-50, 50, width=32)
)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(a=st.one_of(ints, floats), d=st.sampled_from([3, -3, 2, 7]))
def test_floor_divide_and_remainder_match_numpy(a, d):
    x = af.from_numpy(a)
    np.testing.assert_array_equal((x // d).numpy(), a // a.dtype.type(d))
    np.testing.assert_allclose(
        (x % d).numpy(), np.remainder(a, a.dtype.type(d)), rtol=1e-6, atol=1e-5
    )
    assert (x // d).dtype == x.dtype and (x % d).dtype == x.dtype


def test_floor_divide_and_remainder_tensor_tensor_and_reflected():
    a = np.array([7, -7, 9, -9], np.int64)
    b = np.array([2, 2, -4, -4], np.int64)
    x, y = af.from_numpy(a), af.from_numpy(b)
    np.testing.assert_array_equal((x // y).numpy(), a // b)
    np.testing.assert_array_equal((x % y).numpy(), a % b)
    np.testing.assert_array_equal((100 // y).numpy(), 100 // b)
    np.testing.assert_array_equal((100 % y).numpy(), 100 % b)
    np.testing.assert_array_equal(af.floor_divide(x, 2.0).numpy(), a // 2.0)
    assert af.floor_divide(x, 2.0).dtype == af.float32


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_division_by_a_zero_scalar_raises_at_the_call(dtype):
    x = af.tensor([5, 0, 1], dtype=dtype)
    for op in (lambda: x // 0, lambda: x % 0, lambda: af.remainder(x, 0)):
        with pytest.raises(ZeroDivisionError, match=r"(floor_divide|remainder).*by zero"):
            op()
    if dtype == "bool":  # bool // bool is refused first, as PyTorch refuses it
        with pytest.raises(af.DTypeError, match="bool operands"):
            af.floor_divide(x, False)
    else:
        with pytest.raises(ZeroDivisionError, match=r"floor_divide.*by zero"):
            af.floor_divide(x, False)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # PyTorch's type, too
        x // 0
    if dtype != "bool":
        with pytest.raises(ZeroDivisionError, match=f"floor_divide.*x // 0, in {dtype}"):
            x //= 0
        with pytest.raises(ZeroDivisionError, match="remainder"):
            x.remainder_(0)
    np.testing.assert_array_equal(x.numpy(), np.array([5, 0, 1], dtype))  # x unchanged
    np.testing.assert_array_equal((x // 1).numpy(), np.array([5, 0, 1], dtype) // 1)


@pytest.mark.parametrize("queued", [False, True])
@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_integer_division_by_a_zero_element_fails_the_op(dtype, queued):
    vm = get_vm()
    saved = vm.inline_max_cost
    vm.inline_max_cost = -1 if queued else saved  # through the loop, or on the spot
    try:
        x = af.tensor([7, -7, 9], dtype=dtype)
        zero = af.tensor([2, 0, 1], dtype=dtype)
        for make, name in (
            (lambda: x // zero, "floor_divide"),
            (lambda: x % zero, "remainder"),
            (lambda: 10 // zero, "rfloor_divide_scalar"),
            (lambda: 10 % zero, "rremainder_scalar"),
        ):
            with pytest.raises(
                af.KernelError,
                match=rf"'{name}'.*ZeroDivisionError.*"
                rf"divisor holds a 0, in {dtype}",
            ) as info:
                make().numpy()
            assert isinstance(info.value.original, ZeroDivisionError)
        x //= zero  # in place: nothing is written
        with pytest.raises(af.KernelError, match="floor_divide"):
            x.numpy()
        np.testing.assert_array_equal(x.numpy(), np.array([7, -7, 9], dtype))
        x %= af.tensor([0, 1, 1], dtype=dtype)
        with pytest.raises(af.KernelError, match="remainder"):
            af.synchronize()
        x //= af.tensor([2, 2, 2], dtype=dtype)
        np.testing.assert_array_equal(x.numpy(), np.array([3, -4, 4], dtype))
        x %= af.tensor([2, 3, 3], dtype=dtype)
        np.testing.assert_array_equal(x.numpy(), np.array([1, 2, 1], dtype))
    finally:
        vm.inline_max_cost = saved


def test_float_division_by_zero_stays_inf_and_nan():
    x = af.tensor([5.0, -5.0, 0.0])
    np.testing.assert_array_equal((x // 0).numpy(), [np.inf, -np.inf, np.nan])
    np.testing.assert_array_equal((x % af.tensor([0.0, 0.0, 0.0])).numpy(), [np.nan] * 3)
    np.testing.assert_array_equal((af.tensor([5]) // 0.0).numpy(), [np.inf])  # int // float
    af.synchronize()


def test_against_torch():
    torch = pytest.importorskip("torch")
    a = np.array([-3.5, -1.0, 0.5, 2.0, 7.0], np.float32)
    x, t = af.from_numpy(a), torch.from_numpy(a)
    np.testing.assert_array_equal((x // 2).numpy(), (t // 2).numpy())
    np.testing.assert_allclose((x % -2).numpy(), (t % -2).numpy())
    np.testing.assert_array_equal(x.clamp(min=-1, max=3).numpy(), t.clamp(min=-1, max=3).numpy())
    np.testing.assert_array_equal(x.clamp(min=3, max=-1).numpy(), t.clamp(min=3, max=-1).numpy())
    i = np.array([1, 5, 9])
    assert (
        af.clamp(af.from_numpy(i), max=6).tolist()
        == torch.clamp(torch.from_numpy(i), max=6).tolist()
    )
    assert af.clamp(af.from_numpy(i), min=2.5).dtype == af.float32  # as torch: int + float bound


def test_unary_plus_and_clamp_errors():
    x = af.tensor([1.0, -2.0])
    assert +x is x
    with pytest.raises(ValueError, match="at least one"):
        af.clamp(x)
    with pytest.raises(TypeError, match="min"):
        af.clamp(x, min="a")
    assert af.clamp(x, min=0).tolist() == [1.0, 0.0]  # the runtime keeps working
