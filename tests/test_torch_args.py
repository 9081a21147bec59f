"""PyTorch's arguments, taken with PyTorch's meaning: clamp with tensor bounds (values and
gradients), add/sub with ``alpha``, ``nonzero(as_tuple=True)`` and ``where(condition)``,
cat skipping 1-dim empty tensors, ``-`` refused with a bool operand, div's
``rounding_mode``, ``out=`` refused by name, and the keyword spellings PyTorch accepts
(``other=``, ``exponent=``, ``axis=``/``keepdims=``, softmax's ``dtype``, ``to(copy=)``...).
Where PyTorch is installed, results are compared with it."""

import numpy as np
import pytest

import actorflow as af

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def t_of(torch, a):
    return torch.from_numpy(np.array(a, copy=True))


def same(got, want):
    """``got`` (actorflow) equals ``want`` (torch): values, NaNs, shape and dtype name."""
    g = got.numpy()
    w = want.detach().numpy()
    assert g.shape == w.shape, (g.shape, w.shape)
    assert str(got.dtype).split(".")[-1] == str(want.dtype).split(".")[-1], (got.dtype, want.dtype)
    np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7, equal_nan=True)


# -- clamp with tensor bounds ------------------------------------------------------------------

X = np.array([[-2.0, -0.5, 0.0, 0.5], [1.0, 1.5, np.nan, 3.0], [0.25, 2.0, -1.0, 0.75]])
LO = np.array([-1.0, 0.0, 0.5, 1.0])  # broadcasts along rows
HI = np.array([[0.5], [1.0], [-2.0]])  # last row: max below min, max wins


@pytest.mark.parametrize(
    "kind", ["both", "min", "max", "min tensor, max number", "0-dim bounds", "nan bound"]
)
def test_clamp_with_tensor_bounds_matches_torch(torch, kind):
    lo, hi = LO, HI
    if kind == "min tensor, max number":
        hi = 1.25
    if kind == "0-dim bounds":
        lo, hi = np.array(-0.75), np.array(1.25)
    if kind == "nan bound":
        lo = np.array([np.nan, 0.0, 0.5, 1.0])
    a_lo = None if kind == "max" else (af.tensor(lo) if isinstance(lo, np.ndarray) else lo)
    a_hi = None if kind == "min" else (af.tensor(hi) if isinstance(hi, np.ndarray) else hi)
    t_lo = None if a_lo is None else (t_of(torch, lo) if isinstance(lo, np.ndarray) else lo)
    t_hi = None if a_hi is None else (t_of(torch, hi) if isinstance(hi, np.ndarray) else hi)
    if kind == "min tensor, max number":  # PyTorch wants both tensors
        t_hi = torch.tensor(hi, dtype=torch.float64)
    want = torch.clamp(t_of(torch, X), min=t_lo, max=t_hi)
    same(af.clamp(af.tensor(X), min=a_lo, max=a_hi), want)
    same(af.tensor(X).clamp(a_lo, a_hi), want)
    same(af.tensor(X).clip(min=a_lo, max=a_hi), want)
    y = af.tensor(X)
    assert y.clamp_(min=a_lo, max=a_hi) is y
    same(y, want)


def test_clamp_with_tensor_bounds_promotes_and_broadcasts_as_torch(torch):
    i = np.array([1, 2, 3], np.int64)
    same(
        af.clamp(af.tensor(i), min=af.tensor([1.5])),
        torch.clamp(t_of(torch, i), min=torch.tensor([1.5])),
    )
    f = np.array([1.0, 2.0, 3.0], np.float32)
    got = af.clamp(af.tensor(f), min=af.ones(2, 1, dtype=af.float64))
    want = torch.clamp(t_of(torch, f), min=torch.ones(2, 1, dtype=torch.float64))
    same(got, want)
    assert got.shape == (2, 3)


def test_clamp_in_place_with_tensor_bounds_refuses_what_torch_refuses():
    y = af.tensor([1.0, 2.0, 3.0])
    with pytest.raises(af.ShapeError, match=r"clamp_.*\(3,\).*\(2, 3\)"):
        y.clamp_(min=af.ones(2, 1))
    i = af.tensor([1, 2, 3])
    with pytest.raises(af.DTypeError, match=r"clamp_.*float32.*int64"):
        i.clamp_(min=af.tensor([1.5]))
    np.testing.assert_array_equal(i.numpy(), [1, 2, 3])  # left as it was
    np.testing.assert_array_equal(y.numpy(), [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="at least one of 'min' or 'max'"):
        af.clamp(y)
    with pytest.raises(
        TypeError,
        match=r"clamp\(\): argument 'min' must be a Tensor or a "
        r"number, not str",
    ):
        af.clamp(y, min="0")


@pytest.mark.parametrize("which", ["both", "min", "max"])
def test_clamp_tensor_gradients_match_torch_at_ties_and_crossed_bounds(torch, which):
    """x gets the gradient where min <= x <= max (ties included), min where x < min < max,
    max where x > max or max < min; broadcast bounds get theirs summed, as in PyTorch."""
    x = np.array([[-2.0, 0.0, 0.5, 1.0], [1.0, 1.5, 0.0, 3.0], [0.25, 2.0, -1.0, 1.0]])
    lo, hi = LO, HI
    w = np.random.default_rng(0).standard_normal(x.shape)
    ax, alo, ahi = (af.tensor(v, requires_grad=True) for v in (x, lo, hi))
    tx, tlo, thi = (t_of(torch, v).requires_grad_() for v in (x, lo, hi))
    kw = {"both": {}, "min": {"max": None}, "max": {"min": None}}[which]
    a_args = {"min": alo, "max": ahi, **kw}
    t_args = {"min": tlo, "max": thi, **kw}
    (af.clamp(ax, **a_args) * af.tensor(w)).sum().backward()
    (torch.clamp(tx, **t_args) * t_of(torch, w)).sum().backward()
    for a, t in ((ax, tx), (alo, tlo), (ahi, thi)):
        if t.grad is None:
            assert a.grad is None
        else:
            np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), rtol=1e-12)


def test_clamp_number_bounds_gradient_is_zero_outside_even_for_inf_gradients(torch):
    x = af.tensor([-1.0, 0.5, 2.0], requires_grad=True)
    af.clamp(x, 0.0, 1.0).backward(af.tensor([np.inf, 1.0, np.inf]))
    tx = torch.tensor([-1.0, 0.5, 2.0], dtype=torch.float32, requires_grad=True)
    torch.clamp(tx, 0.0, 1.0).backward(torch.tensor([np.inf, 1.0, np.inf]))
    np.testing.assert_array_equal(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_array_equal(x.grad.numpy(), [0.0, 1.0, 0.0])


# -- add / sub with alpha ----------------------------------------------------------------------

A = np.array([[1.0, -2.0, 3.5], [0.25, 4.0, -1.5]])
B = np.array([2.0, -0.5, 1.0])


@pytest.mark.parametrize("name", ["add", "sub"])
@pytest.mark.parametrize("alpha", [2, -3, 0.5, 1, 0])
def test_alpha_matches_torch_for_tensors_and_numbers(torch, name, alpha):
    fa, ft = getattr(af, name), getattr(torch, name)
    a32, b32 = A.astype(np.float32), B.astype(np.float32)
    same(
        fa(af.tensor(a32), af.tensor(b32), alpha=alpha),
        ft(t_of(torch, a32), t_of(torch, b32), alpha=alpha),
    )
    same(fa(af.tensor(a32), 3, alpha=alpha), ft(t_of(torch, a32), 3, alpha=alpha))
    same(
        fa(af.tensor(a32), af.tensor(B), alpha=alpha),  # float32 with float64
        ft(t_of(torch, a32), t_of(torch, B), alpha=alpha),
    )
    same(
        getattr(af.tensor(a32), name)(af.tensor(b32), alpha=alpha),
        getattr(t_of(torch, a32), name)(t_of(torch, b32), alpha=alpha),
    )
    if type(alpha) is int:
        i, j = np.array([5, -7, 9], np.int64), np.array([2, 3, -4], np.int32)
        same(
            fa(af.tensor(i), af.tensor(j), alpha=alpha),
            ft(t_of(torch, i), t_of(torch, j), alpha=alpha),
        )
        same(fa(af.tensor(j), 4, alpha=alpha), ft(t_of(torch, j), 4, alpha=alpha))
        same(fa(af.tensor(j), 2.5, alpha=alpha), ft(t_of(torch, j), 2.5, alpha=alpha))
    if name == "add":  # a number first: 2 + alpha * x
        same(af.add(2, af.tensor(a32), alpha=alpha), torch.add(2, t_of(torch, a32), alpha=alpha))


@pytest.mark.parametrize("name", ["add_", "sub_"])
def test_alpha_in_place_matches_torch(torch, name):
    x, tx = af.tensor(A), t_of(torch, A)
    assert getattr(x, name)(af.tensor(B), alpha=-2.5) is x
    getattr(tx, name)(t_of(torch, B), alpha=-2.5)
    same(x, tx)
    getattr(af, name)(x, 1.5, alpha=2)
    getattr(tx, name)(1.5, alpha=2)
    same(x, tx)
    i = af.tensor([1, 2, 3])
    with pytest.raises(af.DTypeError, match=rf"{name}\(\).*alpha must not be a floating"):
        getattr(i, name)(af.tensor([1, 1, 1]), alpha=0.5)
    np.testing.assert_array_equal(i.numpy(), [1, 2, 3])


def test_alpha_on_bool_results_is_a_bool_as_in_torch(torch):
    a, b = np.array([True, False, False]), np.array([False, False, True])
    for alpha in (True, 2, 0):
        same(
            af.add(af.tensor(a), af.tensor(b), alpha=alpha),
            torch.add(t_of(torch, a), t_of(torch, b), alpha=alpha),
        )


@pytest.mark.parametrize(
    "call, message",
    [
        (
            lambda: af.add(af.tensor([1, 2]), af.tensor([1, 2]), alpha=1.5),
            r"add\(\): for integral input tensors, argument alpha must not be a floating point",
        ),
        (
            lambda: af.sub(af.tensor([1.0]), af.tensor([1.0]), alpha=True),
            r"sub\(\): a bool alpha is only supported for bool results",
        ),
        (
            lambda: af.add(af.tensor([1.0]), 1.0, alpha=af.tensor(2.0)),
            r"add\(\): argument 'alpha' must be a number, not Tensor; pass alpha=t.item\(\)",
        ),
        (
            lambda: af.add(af.tensor([1.0]), 1.0, alpha="2"),
            r"add\(\): argument 'alpha' must be a number, not str",
        ),
    ],
)
def test_alpha_refused_as_torch_refuses_it(call, message):
    with pytest.raises(TypeError, match=message):
        call()
    assert (af.tensor([1.0]) + 1).numpy().tolist() == [2.0]  # the runtime keeps working


def test_alpha_gradients_match_torch(torch):
    x, y = af.tensor(A, requires_grad=True), af.tensor(B, requires_grad=True)
    tx, ty = t_of(torch, A).requires_grad_(), t_of(torch, B).requires_grad_()
    (af.sub(x, y, alpha=-1.5) * af.tensor(A)).sum().backward()
    (torch.sub(tx, ty, alpha=-1.5) * t_of(torch, A)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
    np.testing.assert_allclose(y.grad.numpy(), ty.grad.numpy())


# -- nonzero(as_tuple=True), where(condition) --------------------------------------------------


@pytest.mark.parametrize(
    "values", [[[1, 0, 2], [0, 0, 3]], [0, 4, 0, 5], 7, 0, np.zeros((2, 0)), [[[0, 1]], [[1, 1]]]]
)
def test_nonzero_as_tuple_and_where_condition_match_torch(torch, values):
    a = np.array(values)
    want = torch.nonzero(t_of(torch, a), as_tuple=True)
    for got in (
        af.nonzero(af.tensor(a), as_tuple=True),
        af.tensor(a).nonzero(as_tuple=True),
        af.where(af.tensor(a) != 0),
    ):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            same(g, w)
    same(af.nonzero(af.tensor(a), as_tuple=False), torch.nonzero(t_of(torch, a)))


def test_nonzero_as_tuple_indexes_like_a_mask():
    x = af.tensor([[1.0, -2.0, 3.0], [-4.0, 5.0, -6.0]])
    rows, cols = af.nonzero(x > 0, as_tuple=True)
    np.testing.assert_array_equal(x[rows, cols].numpy(), [1.0, 3.0, 5.0])


def test_where_needs_both_values_or_neither():
    c = af.tensor([True, False])
    with pytest.raises(TypeError, match=r"where\(\): missing the 'other' argument"):
        af.where(c, af.tensor([1.0, 2.0]))


# -- cat skips 1-dim empty tensors -------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        "first",
        "last, dim 1",
        "between, dim -1",
        "int64 empty",
        "float64 empty",
        "all empty",
        "all empty, dim 1",
        "1-dim",
    ],
)
def test_cat_skips_1d_empty_tensors_as_torch(torch, case):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    e = np.zeros((0,), np.float32)
    dim = 0
    if case == "first":
        parts = [e, x]
    elif case == "last, dim 1":
        parts, dim = [x, x, e], 1
    elif case == "between, dim -1":
        parts, dim = [x, e, x], -1
    elif case == "int64 empty":
        parts = [x, np.zeros((0,), np.int64)]
    elif case == "float64 empty":
        parts = [np.zeros((0,), np.float64), x]  # its dtype still counts
    elif case == "all empty":
        parts = [e, np.zeros((0,), np.int32)]
    elif case == "all empty, dim 1":
        parts, dim = [e, e], 1
    else:
        parts = [e, np.arange(3.0, dtype=np.float32)]
    want = torch.cat([t_of(torch, p) for p in parts], dim=dim)
    same(af.cat([af.tensor(p) for p in parts], dim=dim), want)


def test_cat_still_refuses_other_mismatches_naming_them():
    x = af.ones(2, 3)
    with pytest.raises(af.ShapeError, match="zero-dimensional tensor \\(at position 1\\)"):
        af.cat([af.tensor([], dtype=af.float32), af.tensor(1.0), x])
    with pytest.raises(af.ShapeError, match="sizes of tensors must match"):
        af.cat([af.ones(2, 0), x])
    with pytest.raises(IndexError, match="dimension out of range"):
        af.cat([af.tensor([]), x], dim=2)


def test_cat_skipping_keeps_gradients_of_the_others():
    x = af.tensor([[1.0, 2.0]], requires_grad=True)
    e = af.tensor([], requires_grad=True)
    (af.cat([e, x, x]) * 2.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [[4.0, 4.0]])


# -- subtraction with a bool operand -----------------------------------------------------------

TWO_BOOLS = "with two bool tensors is not supported; use the `\\^` operator"
ONE_BOOL = (
    "with a bool tensor is not supported .*to invert a mask use the `~` operator or "
    "logical_not\\(\\)"
)


@pytest.mark.parametrize(
    "expr, message",
    [
        ("b - b", TWO_BOOLS),
        ("b - True", TWO_BOOLS),
        ("False - b", TWO_BOOLS),
        ("af.sub(b, b)", TWO_BOOLS),
        ("b.sub_(b)", TWO_BOOLS),
        ("b - i", ONE_BOOL),
        ("i - b", ONE_BOOL),
        ("b - 1", ONE_BOOL),
        ("1 - b", ONE_BOOL),
        ("b - 1.5", ONE_BOOL),
        ("f - b", ONE_BOOL),
        ("i - True", ONE_BOOL),
        ("af.sub(b, i)", ONE_BOOL),
        ("af.sub(2.0, b)", ONE_BOOL),
        ("b.sub(1)", ONE_BOOL),
        ("i.sub_(b)", ONE_BOOL),
        ("f.sub_(b)", ONE_BOOL),
        ("af.sub(f, b, alpha=2)", ONE_BOOL),
    ],
)
def test_subtraction_with_a_bool_operand_is_refused_as_in_torch(torch, expr, message):
    env = {
        "af": af,
        "b": af.tensor([True, False]),
        "i": af.tensor([1, 2]),
        "f": af.tensor([1.0, 2.0]),
    }
    with pytest.raises(af.DTypeError, match="sub: subtraction, the `-` operator, " + message):
        eval(expr, env)
    tenv = {
        "af": torch,
        "b": torch.tensor([True, False]),
        "i": torch.tensor([1, 2]),
        "f": torch.tensor([1.0, 2.0]),
    }
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with"):
        eval(expr, tenv)
    np.testing.assert_array_equal(env["i"].numpy(), [1, 2])  # nothing was written
    np.testing.assert_array_equal(env["f"].numpy(), [1.0, 2.0])
    assert (env["i"] - 1).numpy().tolist() == [0, 1]


# -- div(rounding_mode=) -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["trunc", "floor", None])
@pytest.mark.parametrize("dtype", ["int64", "int32", "float32", "float64"])
def test_div_rounding_mode_matches_torch(torch, mode, dtype):
    a = np.array([7, -7, 7, -7, 0, 9], dtype)
    b = np.array([2, 2, -2, -2, 3, 4], dtype)
    ta, tb = t_of(torch, a), t_of(torch, b)
    same(
        af.div(af.tensor(a), af.tensor(b), rounding_mode=mode),
        torch.div(ta, tb, rounding_mode=mode),
    )
    same(af.div(af.tensor(a), 3, rounding_mode=mode), torch.div(ta, 3, rounding_mode=mode))
    same(af.div(af.tensor(a), -2.5, rounding_mode=mode), torch.div(ta, -2.5, rounding_mode=mode))
    same(af.div(-20, af.tensor(b), rounding_mode=mode), torch.div(-20, tb, rounding_mode=mode))
    same(af.tensor(a).div(af.tensor(b), rounding_mode=mode), ta.div(tb, rounding_mode=mode))
    if mode is not None or dtype.startswith("float"):
        x, tx = af.tensor(a), t_of(torch, a)
        assert x.div_(af.tensor(b), rounding_mode=mode) is x
        tx.div_(tb, rounding_mode=mode)
        same(x, tx)


def test_div_trunc_of_floats_keeps_inf_and_signed_zero(torch):
    a = np.array([7.0, -7.0, np.inf, 1.0, -0.5])
    for d in (2.0, 0.0, 1.0):
        same(
            af.div(af.tensor(a), d, rounding_mode="trunc"),
            torch.div(t_of(torch, a), d, rounding_mode="trunc"),
        )
    got = af.div(af.tensor([-0.5]), 1.0, rounding_mode="trunc").numpy()
    assert np.signbit(got[0])


def test_div_rounding_mode_errors_name_the_mode_and_the_zero():
    x = af.tensor([4, 5])
    with pytest.raises(
        ValueError,
        match=r"div\(\): expected rounding_mode to be one of None, "
        r"'trunc', or 'floor' but found 'round'",
    ):
        af.div(x, 2, rounding_mode="round")
    with pytest.raises(ZeroDivisionError, match="trunc_divide: integer division by zero"):
        af.div(x, 0, rounding_mode="trunc")
    with pytest.raises(ZeroDivisionError, match="trunc_divide: integer division by zero"):
        af.div(x, af.tensor([1, 0]), rounding_mode="trunc").numpy()
    np.testing.assert_array_equal(af.div(x, 2, rounding_mode="trunc").numpy(), [2, 2])


# -- out= refused, by name ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        "af.add(x, x, out=o)",
        "af.sub(x, 1, out=o)",
        "af.mul(x, x, out=o)",
        "af.div(x, 2, out=o)",
        "af.pow(x, 2, out=o)",
        "af.exp(x, out=o)",
        "af.relu(x, out=o)",
        "af.eq(x, x, out=o)",
        "af.clamp(x, 0, 1, out=o)",
        "af.where(x > 0, x, 0.0, out=o)",
        "af.matmul(x, x, out=o)",
        "af.sum(x, out=o)",
        "af.mean(x, 0, out=o)",
        "af.max(x, 0, out=o)",
        "af.amax(x, out=o)",
        "af.argmax(x, out=o)",
        "af.softmax(x, 0, out=o)",
        "af.cat([x, x], out=o)",
        "af.stack([x, x], out=o)",
        "af.nonzero(x, out=o)",
    ],
)
def test_out_is_refused_with_a_message_that_names_it(call):
    x, o = af.tensor([1.0, 2.0]), af.zeros(2)
    with pytest.raises(
        TypeError,
        match=r"\w+\(\): out= is not supported \(got Tensor\); "
        r"actorflow ops return a new tensor",
    ):
        eval(call, globals(), {"x": x, "o": o})
    np.testing.assert_array_equal(o.numpy(), [0.0, 0.0])


# -- PyTorch's keyword spellings ---------------------------------------------------------------


def test_torch_keyword_spellings_are_taken(torch):
    a = np.array([[3.0, -1.0, 2.0], [0.5, 4.0, -2.0]], np.float32)
    x, tx = af.tensor(a), t_of(torch, a)
    y, ty = af.tensor(a[::-1].copy()), t_of(torch, a[::-1].copy())
    same(af.max(x, other=y), torch.max(tx, other=ty))
    same(x.min(other=y), tx.min(other=ty))
    same(af.pow(x, exponent=2), torch.pow(tx, exponent=2))
    same(x.pow(exponent=y), tx.pow(exponent=ty))
    same(af.softmax(x, 1, af.float64), torch.softmax(tx, 1, torch.float64))
    same(x.log_softmax(0, dtype=af.float64), tx.log_softmax(0, dtype=torch.float64))
    same(af.sum(x, axis=1, keepdims=True), torch.sum(tx, axis=1, keepdims=True))
    same(x.mean(axis=0), tx.mean(axis=0))
    same(af.amax(x, axis=(0, 1)), torch.amax(tx, axis=(0, 1)))
    same(af.argmin(x, axis=1, keepdims=True), torch.argmin(tx, axis=1, keepdims=True))
    same(af.max(x, axis=1).values, torch.max(tx, axis=1).values)
    same(af.cat([x, y], axis=1), torch.cat([tx, ty], axis=1))
    same(af.stack([x, y], axis=2), torch.stack([tx, ty], axis=2))
    same(af.softmax(x, axis=0), torch.softmax(tx, axis=0))
    same(x.reshape(shape=(3, 2)), tx.reshape(shape=(3, 2)))
    z = af.zeros(2, 3)
    z.copy_(other=x, non_blocking=True)
    same(z, tx)
    assert isinstance(x.numpy(force=True), np.ndarray)


def test_keyword_aliases_given_twice_are_refused():
    x = af.ones(2, 3)
    with pytest.raises(TypeError, match=r"sum\(\): got dim=0 and its alias axis=1; pass one"):
        af.sum(x, dim=0, axis=1)
    with pytest.raises(TypeError, match=r"max\(\): got dim=0 and other="):
        af.max(x, 0, other=x)
    with pytest.raises(TypeError, match=r"min\(\): argument 'other' must be a Tensor"):
        af.min(x, other=1.0)
    with pytest.raises(
        TypeError,
        match=r"reshape\(\): got the shape \(3, 2\) and "
        r"shape=\(3, 2\); pass one",
    ):
        x.reshape(3, 2, shape=(3, 2))


def test_to_copy_non_blocking_tensor_and_memory_format(torch):
    x = af.tensor([1.0, 2.0])
    assert x.to(af.float32) is x
    c = x.to(af.float32, copy=True)
    assert c is not x and c.numpy().tolist() == [1.0, 2.0]
    assert x.to("cpu", af.float64, False, True).dtype == af.float64
    assert x.to(af.float32, False, True) is not x
    assert x.to(tensor=af.tensor([1], dtype=af.int32)).dtype == af.int32
    assert x.to(device="cpu", non_blocking=True) is x
    assert x.to(memory_format=torch.preserve_format) is x
    assert x.contiguous(memory_format=torch.contiguous_format) is x
    assert af.clone(x, memory_format=torch.contiguous_format).numpy().tolist() == [1.0, 2.0]
    with pytest.raises(
        ValueError,
        match=r"clone\(\): memory_format=torch.channels_last is "
        r"not supported; actorflow tensors are row-major",
    ):
        af.clone(x, memory_format=torch.channels_last)
