"""The emulator's CuPy-like arrays (actorflow/backends/cuda/cupylike.py): what CuPy refuses
at numpy's API boundary is refused here too, so an op kernel that could not run over cupy
arrays on a GPU fails in CI; the rest computes as numpy does."""

import numpy as np
import pytest

from actorflow.backends.cuda.cupylike import CupyLikeArray, Pointer


def _arr(values):
    a = np.asarray(values, np.float32)
    buf = np.zeros(a.nbytes + 16, np.uint8)
    view = buf[8 : 8 + a.nbytes].view(np.float32).reshape(a.shape)
    view[...] = a
    return CupyLikeArray.of(view, buf, 8)


def test_an_implicit_conversion_is_refused_as_cupy_refuses_it():
    x = _arr([1, 2, 3])
    for convert in (
        np.asarray,
        np.ascontiguousarray,
        lambda a: np.lib.stride_tricks.as_strided(a, (2,), (4,)),
    ):
        with pytest.raises(TypeError, match="Implicit conversion"):
            convert(x)
    # (not tried: a numpy Generator given ``out=x``. Its Cython casts ``out`` to an
    # ndarray unchecked and reads its flags from whatever lies there: usually an error,
    # once a segfault of the test's worker. The random ops run on host copies on a GPU,
    # ``OpDef.host_only``, so no kernel hands a generator a device array.)


def test_a_numpy_array_beside_device_arrays_is_refused_a_number_is_not():
    x = _arr([1, 2, 3])
    with pytest.raises(TypeError, match="Unsupported type"):
        np.add(x, np.ones(3, np.float32))
    with pytest.raises(TypeError, match="Unsupported type"):
        np.concatenate([x, np.ones(3, np.float32)])
    y = np.add(x, np.float32(1)) * 2
    assert isinstance(y, CupyLikeArray) and y.get().tolist() == [4, 6, 8]
    assert np.concatenate([x, x]).get().tolist() == [1, 2, 3, 1, 2, 3]


def test_ufunc_methods_are_refused():
    x = _arr([1, 2, 3])
    with pytest.raises(NotImplementedError, match="cupy_add.at"):
        np.add.at(x, [0, 0], 1)
    with pytest.raises(NotImplementedError, match="cupy_maximum.reduce"):
        np.maximum.reduce(x)
    assert float(x.max()) == 3.0 and int(x.argmax()) == 2  # the methods work


def test_views_by_cupys_constructor_and_copies_both_ways():
    x = _arr([[1, 2, 3], [4, 5, 6]])
    col = CupyLikeArray((2,), np.float32, x.data + 4, (12,))  # column 1, as _strided
    assert col.get().tolist() == [2, 5] and isinstance(x.data, Pointer)
    x[0] = 9
    assert x.get()[0].tolist() == [9, 9, 9]
    x.set(np.zeros((2, 3), np.float32))
    assert x.get().sum() == 0
    with pytest.raises(RuntimeError, match="non-contiguous"):
        x.T.set(np.zeros((3, 2), np.float32))
    out = _arr([0, 0, 0])
    np.multiply(_arr([1, 2, 3]), 2, out=out)  # out= writes in place
    assert out.get().tolist() == [2, 4, 6]
