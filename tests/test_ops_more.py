"""floor_divide (//), remainder (%), unary +, clamp: against numpy and PyTorch."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import actorflow as af

pytestmark = pytest.mark.timeout(60)

ints = hnp.arrays(np.int64, hnp.array_shapes(max_dims=2, max_side=5),
                  elements=st.integers(-50, 50))
floats = hnp.arrays(np.float32, hnp.array_shapes(max_dims=2, max_side=5),
                    elements=st.floats(-50, 50, width=32))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(a=st.one_of(ints, floats), d=st.sampled_from([3, -3, 2, 7]))
def test_floor_divide_and_remainder_match_numpy(a, d):
    x = af.from_numpy(a)
    np.testing.assert_array_equal((x // d).numpy(), a // a.dtype.type(d))
    np.testing.assert_allclose((x % d).numpy(), np.remainder(a, a.dtype.type(d)), rtol=1e-6,
                               atol=1e-5)
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


def test_against_torch():
    torch = pytest.importorskip("torch")
    a = np.array([-3.5, -1.0, 0.5, 2.0, 7.0], np.float32)
    x, t = af.from_numpy(a), torch.from_numpy(a)
    np.testing.assert_array_equal((x // 2).numpy(), (t // 2).numpy())
    np.testing.assert_allclose((x % -2).numpy(), (t % -2).numpy())
    np.testing.assert_array_equal(x.clamp(min=-1, max=3).numpy(), t.clamp(min=-1, max=3).numpy())
    np.testing.assert_array_equal(x.clamp(min=3, max=-1).numpy(), t.clamp(min=3, max=-1).numpy())
    i = np.array([1, 5, 9])
    assert af.clamp(af.from_numpy(i), max=6).tolist() == torch.clamp(torch.from_numpy(i), max=6).tolist()
    assert af.clamp(af.from_numpy(i), min=2.5).dtype == af.float32   # as torch: int + float bound


def test_unary_plus_and_clamp_errors():
    x = af.tensor([1.0, -2.0])
    assert +x is x
    with pytest.raises(ValueError, match="at least one"):
        af.clamp(x)
    with pytest.raises(TypeError, match="min"):
        af.clamp(x, min="a")
    assert af.clamp(x, min=0).tolist() == [1.0, 0.0]          # the runtime keeps working
