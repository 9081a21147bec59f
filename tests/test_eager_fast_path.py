"""The eager per-op fast path: operators bound to functional's prebuilt functions, shared
TensorMetas, the identity memo in front of elementwise inference, the fresh-kernel contract
checked at registration, and the VM's inline limit."""

import gc

import numpy as np
import pytest

import actorflow as af
from actorflow.lowlevel import OpDef, get_vm

pytestmark = pytest.mark.timeout(60)


def test_operators_are_functional_prebuilt_functions():
    from actorflow import functional as F
    from actorflow.tensor.tensor import Tensor

    assert Tensor.__mul__.__module__ == F.elementwise.__name__
    assert Tensor.__rsub__.__qualname__ == "Tensor.__rsub__"
    x = af.tensor([1.0, 2.0])
    np.testing.assert_array_equal((2 - x).numpy(), [1.0, 0.0])
    np.testing.assert_array_equal((x / 2).numpy(), [0.5, 1.0])
    np.testing.assert_array_equal((2**x).numpy(), [2.0, 4.0])
    np.testing.assert_array_equal((x == 1).numpy(), [True, False])
    # numpy scalars, 0-d and n-d arrays take the general path
    assert (x + np.float64(1)).dtype == af.float32
    np.testing.assert_array_equal((x * np.array(3.0)).numpy(), [3.0, 6.0])
    assert (np.ones(2) + x).dtype == af.float64
    with pytest.raises(TypeError, match=r"add\(\): argument 'other' must be a Tensor or a number"):
        x + "a"
    with pytest.raises(TypeError, match=r"sub\(\): argument 'input' must be a Tensor or a number"):
        "a" - x
    with pytest.raises(TypeError, match=r"eq\(\): argument 'other' must be a Tensor or a"):
        x == None  # noqa: B015, E711 - comparing with None must raise (not a None check)
    with pytest.raises(TypeError, match=r"relu\(\): argument 'input' must be a Tensor, not list"):
        af.relu([1.0])


def test_outputs_of_one_shape_dtype_and_device_share_their_meta():
    x = af.tensor(np.arange(6, dtype=np.float32))
    a, b = x * 2, x + 1
    assert a._impl.meta is b._impl.meta
    c = (x * 2).reshape(2, 3)
    assert c.shape == (2, 3) and c._impl.meta is not a._impl.meta
    n = af.zeros(6, device="null") * 2
    assert n._impl.meta is not a._impl.meta and n.device == af.device("null")
    assert (x.int() * 2)._impl.meta.dtype == af.int32


def test_inference_memo_follows_the_scalar_type_and_the_metas():
    xi = af.tensor([1, 2, 3], dtype=af.int32)
    xf = af.tensor([1.0, 2.0, 3.0])
    for _ in range(2):  # alternate so that every call changes the memo's entry
        assert (xi * 2).dtype == af.int32
        assert (xi * 2.5).dtype == af.float32
        assert (xi * True).dtype == af.int32
        assert (xf * 2).dtype == af.float32
        assert (xi + xi).dtype == af.int32
        assert (xi + xf).dtype == af.float32
        assert af.exp(xi).dtype == af.float32
        assert af.exp(xf.double()).dtype == af.float64
        assert (af.tensor([[1.0], [2.0]]) + xf).shape == (2, 3)
    np.testing.assert_array_equal((xi * 2.5).numpy(), [2.5, 5.0, 7.5])


def test_results_of_a_chain_match_numpy_bit_for_bit():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1000).astype(np.float32)
    b = rng.random(1000).astype(np.float32)
    z, y = af.from_numpy(a), af.from_numpy(b)
    r = a
    for _ in range(20):
        z = af.exp(af.tanh(af.relu(z * 0.5 + y) - 0.25))
        r = np.exp(np.tanh(np.maximum(r * 0.5 + b, 0) - 0.25))
    np.testing.assert_array_equal(z.numpy(), r)


def test_fresh_outputs_are_counted_exactly():
    gc.collect()
    get_vm().synchronize()
    before = af.lowlevel.memory_stats("cpu").in_use
    x = af.tensor(np.ones(1000, np.float32))
    ys = [x * 2 for _ in range(5)]
    assert af.lowlevel.memory_stats("cpu").in_use == before + 6 * 4000
    del ys
    assert af.lowlevel.memory_stats("cpu").in_use == before + 4000


def test_fresh_kernels_are_for_single_output_static_ops():
    with pytest.raises(ValueError, match="fresh kernels are for ops with one output"):
        OpDef(
            "two_outs",
            ("x",),
            lambda m, a: [],
            fresh={"cpu": lambda i, a, d: None},
            outputs=("a", "b"),
        )
    with pytest.raises(ValueError, match="fresh kernels are for ops with one output"):
        OpDef("dyn", ("x",), lambda m, a: [], fresh={"cpu": lambda i, a, d: None}, dynamic=True)


def test_inline_limit_follows_the_setting_and_the_test_hook():
    vm = get_vm()
    x = af.tensor([1.0, 2.0])
    saved = vm.inline_max_cost
    try:
        before = vm.stats()["inlined"]
        x * 2
        assert vm.stats()["inlined"] == before + 1
        vm.inline_max_cost = -1
        x * 2
        vm.synchronize()
        assert vm.stats()["inlined"] == before + 1
        vm.inline_max_cost = saved
        vm.set_test_hooks(seed=1)
        vm.inline_max_cost = saved  # the hook still sends everything to the loop
        np.testing.assert_array_equal((x * 2).numpy(), [2.0, 4.0])
        assert vm.stats()["inlined"] == before + 1
        vm.set_test_hooks(None)
        x * 2
        assert vm.stats()["inlined"] == before + 2
    finally:
        vm.set_test_hooks(None)
        vm.inline_max_cost = saved
