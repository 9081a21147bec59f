"""Elementwise functors: unary, binary (and the prebuilt operator functions), in-place,
fill/zero/copy, clamp, where and matmul."""

from __future__ import annotations

import numpy as np

from .. import ops
from ..eager.interpreter import apply
from ..errors import DTypeError, ShapeError
from ..tensor.tensor import Tensor, wrap
from .common import (COPY, NO_ATTRS, NUMBER, no_data, number, op_def, resolved, tensor_arg,
                     tensor_like)


# -- unary -----------------------------------------------------------------------------

def _unary(name: str):
    op = op_def(name)

    def fn(input, inplace: bool = False):
        # (_tensor only for its TypeError: a call fewer on the hot path)
        impl = input._impl if isinstance(input, Tensor) else tensor_arg(name, input)._impl
        if inplace:
            _check_inplace(name, op, [impl], NO_ATTRS, impl)
            apply(op, [impl], NO_ATTRS, outs=[impl])
            return input
        return wrap(apply(op, [impl], NO_ATTRS)[0])
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Elementwise {name} of a tensor; ``inplace=True`` writes the input.\n\n"
                  f"Example: ``af.{name}(af.tensor([1., -1.]))``")
    return fn


neg = _unary("neg")
abs = _unary("abs")  # noqa: A001 - the op is called abs, as in numpy and PyTorch
exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
tanh = _unary("tanh")
relu = _unary("relu")
sigmoid = _unary("sigmoid")
logical_not = _unary("logical_not")
bitwise_not = _unary("bitwise_not")
_GELU = op_def("gelu")


def gelu(input, approximate: str = "none"):
    """GELU: x * Phi(x) with the exact erf ('none') or the tanh approximation ('tanh')."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    impl = tensor_arg("gelu", input)._impl
    return wrap(apply(_GELU, [impl], {"approximate": approximate})[0])


# -- binary ----------------------------------------------------------------------------

_BIN = {name: (op_def(name), op_def(name + "_scalar"), op_def("r" + name + "_scalar"))
        for name in ops.elementwise.BINARY}


def binary(name: str, a, b):
    op, sop, rop = _BIN[name]
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            return wrap(apply(op, [a._impl, b._impl], NO_ATTRS)[0])
        if isinstance(b, np.ndarray) and b.ndim:
            return binary(name, a, tensor_like(b, a))
        s = b if type(b) in NUMBER else number(name, b)
        return wrap(apply(sop, [a._impl], {"scalar": s})[0])
    if isinstance(b, Tensor):
        if isinstance(a, np.ndarray) and a.ndim:
            return binary(name, tensor_like(a, b), b)
        return wrap(apply(rop, [b._impl], {"scalar": number(name, a, "input")})[0])
    raise TypeError(f"{name}(): expected at least one Tensor argument, got "
                    f"{type(a).__name__} and {type(b).__name__}")


def prebuilt_operator(name: str, method: str, reflected: bool = False):
    """Tensor's ``method`` for op ``name`` (``reflected``: ``self`` is the right operand).
    Tensor binds it as the method itself, with the op defs bound here, so ``a * b`` costs
    one Python call before the interpreter instead of two; operands other than tensors and
    Python numbers go through ``_binary``."""
    op, sop, rop = _BIN[name]
    if reflected:
        def fn(self, other):
            if type(other) in NUMBER:
                return wrap(apply(rop, [self._impl], {"scalar": other})[0])
            return binary(name, other, self)
    else:
        def fn(self, other):
            if isinstance(other, Tensor):
                return wrap(apply(op, [self._impl, other._impl], NO_ATTRS)[0])
            if type(other) in NUMBER:
                return wrap(apply(sop, [self._impl], {"scalar": other})[0])
            return binary(name, self, other)
    fn.__name__ = method
    fn.__qualname__ = "Tensor." + method
    return fn


def _check_inplace(name, op, impls, attrs, target):
    """Shape and dtype of an in-place result must fit the tensor written."""
    shape, dtype = op.infer([resolved(i) for i in impls], attrs)[0]
    m = target.meta
    if shape != m.shape:
        raise ShapeError(f"{name}_: output with shape {m.shape} doesn't match the broadcast "
                         f"shape {shape}; in-place ops cannot change the shape of the tensor "
                         f"written")
    if dtype.category > m.dtype.category:
        raise DTypeError(f"{name}_: result type {dtype} can't be cast to the desired output "
                         f"type {m.dtype}; use the out-of-place {name}() instead")


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


def _check_pow(a, b):
    if (isinstance(a, Tensor) and a.dtype.category == 1 and type(b) is int and b < 0):
        raise DTypeError(f"pow: integers to negative integer powers are not allowed "
                         f"({a.dtype} tensor ** {b}); convert with .float() first")


def _binary_fn(name: str):
    def fn(input, other):
        if name == "pow":
            _check_pow(input, other)
        return binary(name, input, other)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = (f"Elementwise {name} with broadcasting; either argument may be a Python "
                  f"number.\n\nExample: ``af.{name}(af.ones(2, 3), af.ones(3))``")
    return fn


add, sub, mul, div, pow = (_binary_fn(n) for n in ("add", "sub", "mul", "div", "pow"))  # noqa: A001
floor_divide, remainder = _binary_fn("floor_divide"), _binary_fn("remainder")
bitwise_and, bitwise_or = _binary_fn("bitwise_and"), _binary_fn("bitwise_or")
bitwise_xor = _binary_fn("bitwise_xor")
maximum, minimum = _binary_fn("maximum"), _binary_fn("minimum")
eq, ne, lt, le, gt, ge = (_binary_fn(n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
logical_and, logical_or = _binary_fn("logical_and"), _binary_fn("logical_or")
true_divide = divide = div
multiply, subtract = mul, sub


def add_(input, other):
    return _binary_inplace("add", input, other)


def sub_(input, other):
    return _binary_inplace("sub", input, other)


def mul_(input, other):
    return _binary_inplace("mul", input, other)


def div_(input, other):
    return _binary_inplace("div", input, other)


def floor_divide_(input, other):
    return _binary_inplace("floor_divide", input, other)


def remainder_(input, other):
    return _binary_inplace("remainder", input, other)


_FULL = op_def("full")


def fill_(input, value):
    """Writes ``value`` to every element of ``input`` (a view writes through)."""
    t = tensor_arg("fill_", input)._impl
    m = resolved(t)
    apply(_FULL, [], {"shape": m.shape, "dtype": m.dtype, "device": m.device,
                      "value": number("fill_", value, "value")}, device=m.device, outs=[t])
    return input


def zero_(input):
    return fill_(input, 0)


def copy_(input, src):
    """Copies ``src`` (broadcast to ``input``'s shape, any dtype, cpu or null) into ``input``."""
    dst = tensor_arg("copy_", input)._impl
    s = tensor_arg("copy_", src, "src")._impl
    resolved(dst), resolved(s)
    if not s.blob.backend.has_data and dst.blob.backend.has_data:
        raise no_data("copy_", s.meta.device)
    try:
        np.broadcast_shapes(s.meta.shape, dst.meta.shape)
        ok = np.broadcast_shapes(s.meta.shape, dst.meta.shape) == dst.meta.shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"copy_: source of shape {s.meta.shape} cannot be broadcast to the "
                         f"destination's shape {dst.meta.shape}")
    apply(COPY, [s], NO_ATTRS, device=dst.meta.device, outs=[dst])
    return input


_CLAMP = op_def("clamp")


def clamp(input, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """Limits every element to [min, max] (either bound may be None, not both).

    Example: ``af.clamp(x, min=0.0)``"""
    impl = tensor_arg("clamp", input)._impl
    if min is None and max is None:
        raise ValueError("clamp(): at least one of 'min' or 'max' must not be None")
    lo = None if min is None else number("clamp", min, "min")
    hi = None if max is None else number("clamp", max, "max")
    return wrap(apply(_CLAMP, [impl], {"min": lo, "max": hi})[0])


# -- where, matmul ---------------------------------------------------------------------

_WHERE = op_def("where")


def where(condition, input, other):
    """Elementwise ``input if condition else other``; either value may be a number."""
    cond = tensor_arg("where", condition, "condition")
    impls, attrs = [cond._impl], {}
    for key, v in (("x", input), ("y", other)):
        if isinstance(v, Tensor):
            impls.append(v._impl)
        else:
            attrs[key] = number("where", v, "input" if key == "x" else "other")
    return wrap(apply(_WHERE, impls, attrs)[0])


_MATMUL = op_def("matmul")


def matmul(input, other):
    """Matrix product with batching and broadcasting of leading dims (numpy's rules)."""
    a, b = tensor_arg("matmul", input), tensor_arg("matmul", other, "other")
    return wrap(apply(_MATMUL, [a._impl, b._impl], NO_ATTRS)[0])
