"""Elementwise functors: unary, binary (and the prebuilt operator functions), in-place,
fill/zero/copy, clamp, where, masked_fill, triu/tril and matmul."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, overload

import numpy as np

from .. import ops
from ..dtype import FLOAT, _Number, bool_
from ..eager.interpreter import apply, apply1, attrs_key
from ..errors import DTypeError, ShapeError
from ..ops.elementwise import binary_dtype
from ..tensor.tensor import Tensor, wrap
from .common import (
    CAST,
    COPY,
    NO_ATTRS,
    NUMBER,
    _Operand,
    broadcasts_to,
    no_data,
    number,
    op_def,
    readable_on,
    refuse_out,
    resolved,
    tensor_arg,
    tensor_like,
)
from .joining import cast, nonzero


class _UnaryFn(Protocol):
    def __call__(self, input: Tensor, inplace: bool = False, *, out: None = None) -> Tensor: ...


class _BinaryFn(Protocol):
    def __call__(self, input: _Operand, other: _Operand, *, out: None = None) -> Tensor: ...


class _TriangleFn(Protocol):
    def __call__(self, input: Tensor, diagonal: int = 0, *, out: None = None) -> Tensor: ...


# -- unary -----------------------------------------------------------------------------


def _unary(name: str) -> _UnaryFn:
    op = op_def(name)

    def fn(input: Tensor, inplace: bool = False, *, out: None = None) -> Tensor:
        # (_tensor only for its TypeError: a call fewer on the hot path)
        impl = input._impl if isinstance(input, Tensor) else tensor_arg(name, input)._impl
        if inplace or out is not None:
            if out is not None:
                refuse_out(name, out)
            _check_inplace(name, op, [impl], NO_ATTRS, impl)
            apply(op, [impl], NO_ATTRS, outs=[impl])
            return input
        t = _new(Tensor)  # (wrap, inline)
        t._impl = apply1(op, impl, None, NO_ATTRS, ())
        return t

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"Elementwise {name} of a tensor; ``inplace=True`` writes the input "
        f"(``out=`` is refused).\n\nExample: ``af.{name}(af.tensor([1., -1.]))``"
    )
    return fn


neg = _unary("neg")
abs = _unary("abs")  # noqa: A001 - the op is called abs, as in numpy and PyTorch
exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
tanh = _unary("tanh")
sin = _unary("sin")
cos = _unary("cos")
rsqrt = _unary("rsqrt")
erf = _unary("erf")
relu = _unary("relu")
sigmoid = _unary("sigmoid")
silu = _unary("silu")
logical_not = _unary("logical_not")
bitwise_not = _unary("bitwise_not")
_GELU = op_def("gelu")


def gelu(input: Tensor, approximate: str = "none") -> Tensor:
    """GELU: x * Phi(x) with the exact erf ('none') or the tanh approximation ('tanh')."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    impl = tensor_arg("gelu", input)._impl
    return wrap(apply(_GELU, [impl], {"approximate": approximate})[0])


# -- binary ----------------------------------------------------------------------------

_new = Tensor.__new__

_BIN = {
    name: (op_def(name), op_def(name + "_scalar"), op_def("r" + name + "_scalar"))
    for name in ops.elementwise.BINARY
}


def binary(name: str, a: _Operand, b: _Operand) -> Tensor:
    op, sop, rop = _BIN[name]
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            return wrap(apply1(op, a._impl, b._impl, NO_ATTRS, ()))
        if isinstance(b, np.ndarray) and b.ndim:
            return binary(name, a, tensor_like(b, a))
        s = b if type(b) in NUMBER else number(name, b)
        return wrap(apply(sop, [a._impl], {"scalar": s})[0])
    if isinstance(b, Tensor):
        if isinstance(a, np.ndarray) and a.ndim:
            return binary(name, tensor_like(a, b), b)
        return wrap(apply(rop, [b._impl], {"scalar": number(name, a, "input")})[0])
    raise TypeError(
        f"{name}(): expected at least one Tensor argument, got "
        f"{type(a).__name__} and {type(b).__name__}"
    )


def prebuilt_operator(
    name: str, method: str, reflected: bool = False
) -> Callable[[Tensor, _Operand], Tensor]:
    """Tensor's ``method`` for op ``name`` (``reflected``: ``self`` is the right operand).
    Tensor binds it as the method itself, with the op defs bound here, so ``a * b`` costs
    one Python call before the interpreter instead of two; operands other than tensors and
    Python numbers go through ``_binary``."""
    op, sop, rop = _BIN[name]
    # the signature's attrs part: the scalar's type where that alone decides (see attrs_key)
    rtyped, styped = bool(rop.typed_attrs), bool(sop.typed_attrs)
    if reflected:

        def fn(self: Tensor, other: _Operand) -> Tensor:
            k = type(other)
            if k in NUMBER:
                t = _new(Tensor)  # (wrap, inline)
                t._impl = apply1(
                    rop,
                    self._impl,
                    None,
                    {"scalar": other},
                    k if rtyped else attrs_key(rop, {"scalar": other}),
                )
                return t
            return binary(name, other, self)
    else:

        def fn(self: Tensor, other: _Operand) -> Tensor:
            k = type(other)
            if k in NUMBER:
                t = _new(Tensor)
                t._impl = apply1(
                    sop,
                    self._impl,
                    None,
                    {"scalar": other},
                    k if styped else attrs_key(sop, {"scalar": other}),
                )
                return t
            if isinstance(other, Tensor):
                t = _new(Tensor)
                t._impl = apply1(op, self._impl, other._impl, NO_ATTRS, ())
                return t
            return binary(name, self, other)

    fn.__name__ = method
    fn.__qualname__ = "Tensor." + method
    return fn


def _check_inplace(name, op, impls, attrs, target):
    """Shape and dtype of an in-place result must fit the tensor written."""
    shape, dtype = op.infer([resolved(i) for i in impls], attrs)[0]
    m = target.meta
    if shape != m.shape:
        raise ShapeError(
            f"{name}_: output with shape {m.shape} doesn't match the broadcast "
            f"shape {shape}; in-place ops cannot change the shape of the tensor "
            f"written"
        )
    if dtype.category > m.dtype.category:
        raise DTypeError(
            f"{name}_: result type {dtype} can't be cast to the desired output "
            f"type {m.dtype}; use the out-of-place {name}() instead"
        )


def _binary_inplace(name: str, x, other):
    op, sop, _ = _BIN[name]
    target = tensor_arg(name + "_", x, "self")._impl
    if isinstance(other, Tensor):
        impls, attrs, o = [target, other._impl], NO_ATTRS, op
    else:
        impls, attrs, o = [target], {"scalar": number(name + "_", other)}, sop
    _check_inplace(name, o, impls, attrs, target)
    apply(o, impls, attrs, outs=[target])
    return x


def _binary_fn(name: str) -> _BinaryFn:
    def fn(input: _Operand, other: _Operand, *, out: None = None) -> Tensor:
        if out is not None:
            refuse_out(name, out)
        return binary(name, input, other)

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (
        f"Elementwise {name} with broadcasting; either argument may be a Python "
        f"number (``out=`` is refused).\n\n"
        f"Example: ``af.{name}(af.ones(2, 3), af.ones(3))``"
    )
    return fn


mul = _binary_fn("mul")
floor_divide, remainder = _binary_fn("floor_divide"), _binary_fn("remainder")
bitwise_and, bitwise_or = _binary_fn("bitwise_and"), _binary_fn("bitwise_or")
bitwise_xor = _binary_fn("bitwise_xor")
maximum, minimum = _binary_fn("maximum"), _binary_fn("minimum")
eq, ne, lt, le, gt, ge = (_binary_fn(n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
logical_and, logical_or = _binary_fn("logical_and"), _binary_fn("logical_or")


def pow(  # noqa: A001 - PyTorch's name
    input: _Operand, exponent: _Operand, *, out: None = None
) -> Tensor:
    """``input ** exponent`` elementwise with broadcasting; either may be a Python number.
    Integers to negative integer powers are refused, as in PyTorch."""
    if out is not None:
        refuse_out("pow", out)
    if (
        isinstance(input, Tensor)
        and input.dtype.category == 1
        and type(exponent) is int
        and exponent < 0
    ):
        raise DTypeError(
            f"pow: integers to negative integer powers are not allowed "
            f"({input.dtype} tensor ** {exponent}); convert with .float() first"
        )
    return binary("pow", input, exponent)


# -- add and sub (with alpha), div (with rounding_mode) --------------------------------

_ONE = 1  # alpha's default; CPython keeps one object per small int, so the test of an
#           alpha of 1 is an identity test, the cheapest. Any other alpha (1.0, True...)
#           takes the checked path, which gives the same result for a 1.


def add(input: _Operand, other: _Operand, *, alpha: _Number = 1, out: None = None) -> Tensor:
    """``input + alpha * other`` elementwise with broadcasting; either of ``input`` and
    ``other`` may be a Python number. ``alpha`` follows PyTorch: a float only for a floating
    point result, a bool only for a bool one; another ``alpha`` than 1 costs one more op.

    Example: ``af.add(x, y, alpha=0.5)``"""
    if out is not None or alpha is not _ONE:
        return _scaled("add", input, other, alpha, out)
    return binary("add", input, other)


def sub(input: _Operand, other: _Operand, *, alpha: _Number = 1, out: None = None) -> Tensor:
    """``input - alpha * other`` elementwise (see ``add``); a bool operand is refused, as in
    PyTorch."""
    if out is not None or alpha is not _ONE:
        return _scaled("sub", input, other, alpha, out)
    return binary("sub", input, other)


def _scaled(name, input, other, alpha, out):
    if out is not None:
        refuse_out(name, out)
    return binary(name, input, _times_alpha(name, input, other, alpha))


def _operand(name, x, arg):
    """A TensorMeta, or a Python number, for dtype rules."""
    if isinstance(x, Tensor):
        return x._meta
    return x if type(x) in NUMBER else number(name, x, arg)


def _times_alpha(name, input, other, alpha):
    """``alpha * other``, computed in the dtype of ``input op other``, with PyTorch's
    checks of ``alpha``; ``other`` itself when ``alpha`` is 1."""
    if type(alpha) not in NUMBER and not isinstance(alpha, np.generic):
        hint = "; pass alpha=t.item()" if isinstance(alpha, Tensor) else ""
        raise TypeError(
            f"{name}(): argument 'alpha' must be a number, not {type(alpha).__name__}{hint}"
        )
    a = number(name, alpha, "alpha")
    if isinstance(other, np.ndarray) and other.ndim and isinstance(input, Tensor):
        other = tensor_like(other, input)
    like = input if isinstance(input, Tensor) else other
    x = tensor_like(input, like) if isinstance(input, np.ndarray) and input.ndim else input
    x, y = _operand(name, x, "input"), _operand(name, other, "other")
    op = name.rstrip("_")
    dtype = (
        binary_dtype(op, "arith", x, y)
        if isinstance(input, Tensor)
        else binary_dtype(op, "arith", y, x)
    )
    if type(a) is bool and dtype is not bool_:
        raise DTypeError(
            f"{name}(): a bool alpha is only supported for bool results (got "
            f"alpha={a} for a {dtype} result); pass alpha as an int or float"
        )
    if type(a) is float and dtype.category != FLOAT:
        raise DTypeError(
            f"{name}(): for integral input tensors, argument alpha must not be "
            f"a floating point number (got alpha={a} for a {dtype} result); "
            f"pass an int alpha, or convert the inputs with .float() first"
        )
    if dtype is bool_:
        a = bool(a)
    if not isinstance(other, Tensor):
        return (y and a) if dtype is bool_ else y * a
    if a == 1:
        return other
    if other.dtype is not dtype:
        other = wrap(apply(CAST, [other._impl], {"dtype": dtype})[0])
    return binary("mul", other, a)


def div(
    input: _Operand, other: _Operand, *, rounding_mode: str | None = None, out: None = None
) -> Tensor:
    """``input / other`` elementwise with broadcasting: true division (a floating point
    result), or rounded toward zero (``rounding_mode="trunc"``) or down (``"floor"``, as
    ``floor_divide``), which keep integer dtypes, as in PyTorch."""
    if out is not None:
        refuse_out("div", out)
    if rounding_mode is None:
        return binary("div", input, other)
    return binary(_rounded("div", rounding_mode), input, other)


def _rounded(name, rounding_mode) -> str:
    if rounding_mode == "trunc":
        return "trunc_divide"
    if rounding_mode == "floor":
        return "floor_divide"
    raise ValueError(
        f"{name}(): expected rounding_mode to be one of None, 'trunc', or "
        f"'floor' but found {rounding_mode!r}"
    )


true_divide = divide = div
multiply, subtract = mul, sub


def add_(input: Tensor, other: _Operand, *, alpha: _Number = 1) -> Tensor:
    """``input += alpha * other`` in place (see ``add``)."""
    if alpha is not _ONE:
        other = _times_alpha("add_", input, other, alpha)
    return _binary_inplace("add", input, other)


def sub_(input: Tensor, other: _Operand, *, alpha: _Number = 1) -> Tensor:
    """``input -= alpha * other`` in place (see ``sub``)."""
    if alpha is not _ONE:
        other = _times_alpha("sub_", input, other, alpha)
    return _binary_inplace("sub", input, other)


def mul_(input: Tensor, other: _Operand) -> Tensor:
    return _binary_inplace("mul", input, other)


def div_(input: Tensor, other: _Operand, *, rounding_mode: str | None = None) -> Tensor:
    """``input /= other`` in place; ``rounding_mode`` as in ``div``."""
    if rounding_mode is None:
        return _binary_inplace("div", input, other)
    return _binary_inplace(_rounded("div_", rounding_mode), input, other)


def floor_divide_(input: Tensor, other: _Operand) -> Tensor:
    return _binary_inplace("floor_divide", input, other)


def remainder_(input: Tensor, other: _Operand) -> Tensor:
    return _binary_inplace("remainder", input, other)


_FULL = op_def("full")


def fill_(input: Tensor, value: _Number) -> Tensor:
    """Writes ``value`` to every element of ``input`` (a view writes through)."""
    t = tensor_arg("fill_", input)._impl
    m = resolved(t)
    apply(
        _FULL,
        [],
        {
            "shape": m.shape,
            "dtype": m.dtype,
            "device": m.device,
            "value": number("fill_", value, "value"),
        },
        device=m.device,
        outs=[t],
    )
    return input


def zero_(input: Tensor) -> Tensor:
    return fill_(input, 0)


def copy_(input: Tensor, other: Tensor, non_blocking: bool = False) -> Tensor:
    """Copies ``other`` (broadcast to ``input``'s shape, any dtype, any device: from
    across the host boundary, cuda to cpu or cpu to cuda, through the transfer ``.to()``
    makes, ``readable_on``) into ``input``. ``non_blocking`` is accepted for PyTorch's
    signature: every copy is queued and ordered like any other op.

    Raises:
        DeviceError: ``other`` is on a device without data (null) and ``input`` is not, or
            both are on devices with their own memory (the message says how to go
            through the host)."""
    dst = tensor_arg("copy_", input)._impl
    s = tensor_arg("copy_", other, "other")._impl
    dm, sm = resolved(dst), resolved(s)  # (their metas, shapes known)
    if not s.blob.backend.has_data and dst.blob.backend.has_data:
        raise no_data("copy_", sm.device)
    try:
        np.broadcast_shapes(sm.shape, dm.shape)
        ok = np.broadcast_shapes(sm.shape, dm.shape) == dm.shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(
            f"copy_: source of shape {sm.shape} cannot be broadcast to the "
            f"destination's shape {dm.shape}"
        )
    s = readable_on("copy_", s, dm.device)
    apply(COPY, [s], NO_ATTRS, device=dm.device, outs=[dst])
    return input


_CLAMP, _CLAMP_TENSOR = op_def("clamp"), op_def("clamp_tensor")


def _clamp_call(name, input, min, max):  # noqa: A002
    """(op, input impls, attrs) of a clamp: numbers as attrs, or tensor bounds (a number
    beside a tensor bound becomes a 0-dim tensor) as inputs that broadcast with ``input``."""
    impl = tensor_arg(name, input)._impl
    if (min is None or type(min) in NUMBER) and (max is None or type(max) in NUMBER):
        if min is None and max is None:
            raise ValueError(f"{name}(): at least one of 'min' or 'max' must not be None")
        return _CLAMP, [impl], {"min": min, "max": max}
    if not (_has_dims(min) or _has_dims(max)):  # numpy scalars, 0-dim arrays
        lo = None if min is None else number(name, min, "min")
        hi = None if max is None else number(name, max, "max")
        return _CLAMP, [impl], {"min": lo, "max": hi}
    impls = [impl]
    for k, v in (("min", min), ("max", max)):
        if v is not None:
            if not isinstance(v, Tensor):
                v = tensor_like(v if isinstance(v, np.ndarray) else number(name, v, k), input)
            impls.append(v._impl)
    which = "both" if len(impls) == 3 else ("min" if max is None else "max")
    return _CLAMP_TENSOR, impls, {"bounds": which}


def _has_dims(v) -> bool:
    """A tensor, or an array with dims: a bound given as an input, not an attr."""
    return isinstance(v, Tensor) or (isinstance(v, np.ndarray) and v.ndim > 0)


def clamp(
    input: Tensor,
    min: _Operand | None = None,  # noqa: A002 - PyTorch's argument names
    max: _Operand | None = None,  # noqa: A002
    *,
    out: None = None,
) -> Tensor:
    """Limits every element to [min, max] (either bound may be None, not both). A bound may
    be a number or a tensor that broadcasts with ``input``; where min > max, the result is
    max, as in PyTorch. ``out=`` is refused.

    Example: ``af.clamp(x, min=0.0)``, ``af.clamp(x, min=lo, max=hi)``"""
    if out is not None:
        refuse_out("clamp", out)
    op, impls, attrs = _clamp_call("clamp", input, min, max)
    return wrap(apply(op, impls, attrs)[0])


def clamp_(
    input: Tensor,
    min: _Operand | None = None,  # noqa: A002
    max: _Operand | None = None,  # noqa: A002
) -> Tensor:
    """``clamp`` written into ``input`` (the bounds must not change its shape or dtype)."""
    op, impls, attrs = _clamp_call("clamp_", input, min, max)
    _check_inplace("clamp", op, impls, attrs, impls[0])
    apply(op, impls, attrs, outs=[impls[0]])
    return input


clip, clip_ = clamp, clamp_


# -- where, matmul ---------------------------------------------------------------------

_WHERE = op_def("where")


@overload
def where(
    condition: Tensor, input: None = None, other: None = None, *, out: None = None
) -> tuple[Tensor, ...]: ...
@overload
def where(condition: Tensor, input: _Operand, other: _Operand, *, out: None = None) -> Tensor: ...


def where(
    condition: Tensor,
    input: _Operand | None = None,
    other: _Operand | None = None,
    *,
    out: None = None,
) -> Tensor | tuple[Tensor, ...]:
    """Elementwise ``input if condition else other``; either value may be a number.
    ``where(condition)`` alone is ``nonzero(condition, as_tuple=True)``, as in PyTorch."""
    if out is not None:
        refuse_out("where", out)
    if input is None and other is None:
        return nonzero(condition, as_tuple=True)
    if input is None or other is None:
        missing = "input" if input is None else "other"
        raise TypeError(
            f"where(): missing the '{missing}' argument; pass both input and "
            f"other, or neither (where(condition) gives the indices)"
        )
    cond = tensor_arg("where", condition, "condition")
    impls, attrs = [cond._impl], {}
    for key, v in (("x", input), ("y", other)):
        if isinstance(v, Tensor):
            impls.append(v._impl)
        else:
            attrs[key] = number("where", v, "input" if key == "x" else "other")
    return wrap(apply(_WHERE, impls, attrs)[0])


def masked_fill(input: Tensor, mask: Tensor, value: _Number | Tensor) -> Tensor:
    """``value`` where the bool ``mask`` is True, ``input`` elsewhere (the mask broadcasts
    to the input's shape); ``value`` is a number or a 0-d tensor, as in PyTorch.

    Raises: DTypeError for a mask that is not bool; ShapeError for a mask that does not
    broadcast to the input, or a value tensor that is not 0-d."""
    x = tensor_arg("masked_fill", input)
    m = tensor_arg("masked_fill", mask, "mask")
    if m.dtype is not bool_:
        raise DTypeError(
            f"masked_fill: mask must be a bool tensor, got {m.dtype}; compare "
            f"first, e.g. x.masked_fill(x > 0, 0.0)"
        )
    if not broadcasts_to(m.shape, x.shape):
        raise ShapeError(
            f"masked_fill: the mask's shape {m.shape} does not broadcast to the "
            f"input's shape {x.shape}"
        )
    if isinstance(value, Tensor):
        if value.ndim != 0:
            raise ShapeError(
                f"masked_fill: value must be a number or a 0-d tensor, got a "
                f"tensor of shape {value.shape}"
            )
        if value.dtype is not x.dtype:
            value = cast(value, x.dtype)  # the input's dtype, as PyTorch's
    elif x.dtype is bool_:  # a number: cast to the input's dtype too
        value = bool(value)
    elif not x.dtype.is_floating_point and isinstance(value, (float, np.floating)):
        if not np.isfinite(value):
            raise ValueError(
                f"masked_fill: value {value} cannot be converted to the input's "
                f"{x.dtype.name}; fill a float tensor (x.float()) instead"
            )
        value = int(value)  # toward zero, as PyTorch
    return where(m, value, x)


def _triangle(name: str, doc: str) -> _TriangleFn:
    op = op_def(name)

    def triangle(input: Tensor, diagonal: int = 0, *, out: None = None) -> Tensor:
        if out is not None:
            refuse_out(name, out)
        x = tensor_arg(name, input)
        if isinstance(diagonal, bool) or not isinstance(diagonal, (int, np.integer)):
            raise TypeError(f"{name}(): diagonal must be an int, got {diagonal!r}")
        return wrap(apply(op, [x._impl], {"diagonal": int(diagonal)})[0])

    triangle.__name__ = triangle.__qualname__ = name
    triangle.__doc__ = doc
    return triangle


triu = _triangle(
    "triu",
    """The upper triangle of the last two dims (a batch of matrices
    before them): the entries on and above ``diagonal`` (0: the main diagonal, > 0 above,
    < 0 below) kept, the rest zero.

    Raises: ShapeError for a tensor of fewer than 2 dims.""",
)
tril = _triangle(
    "tril",
    """The lower triangle of the last two dims: the entries on and
    below ``diagonal`` kept, the rest zero.

    Raises: ShapeError for a tensor of fewer than 2 dims.""",
)


_MATMUL = op_def("matmul")


def matmul(input: Tensor, other: Tensor, *, out: None = None) -> Tensor:
    """Matrix product with batching and broadcasting of leading dims (numpy's rules)."""
    if out is not None:
        refuse_out("matmul", out)
    a, b = tensor_arg("matmul", input), tensor_arg("matmul", other, "other")
    return wrap(apply(_MATMUL, [a._impl, b._impl], NO_ATTRS)[0])
