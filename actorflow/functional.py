"""The functions users call (``af.relu``, ``af.add``...): argument checks with messages
that name the op, the values and the fix, then dispatch to the interpreter.

Every function takes tensors and returns new tensors unless it ends in ``_`` or takes
``inplace=True``, which write the first argument and return it.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

from . import ops
from .backends import get_backend
from .device import device as as_device
from .dtype import FLOAT, as_dtype
from .eager.interpreter import apply, resolve
from .errors import DeviceError, DTypeError, ShapeError
from .ops.common import normalize_dim, normalize_dims
from .tensor.tensor import Tensor, wrap

_NO_ATTRS: dict = {}
_NUMBER = (bool, int, float)
MinMax = namedtuple("MinMax", ["values", "indices"])


def _op(name):
    return ops.get(name)


def _number(op: str, value, arg: str = "other"):
    """A Python scalar from a bool/int/float or a numpy scalar; TypeError otherwise."""
    if type(value) in _NUMBER:
        return value
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return value.item()
    raise TypeError(f"{op}(): argument '{arg}' must be a Tensor or a number, "
                    f"not {type(value).__name__}")


def _tensor(op: str, value, arg: str = "input") -> Tensor:
    if isinstance(value, Tensor):
        return value
    raise TypeError(f"{op}(): argument '{arg}' must be a Tensor, not {type(value).__name__}")


def _as_tensor_like(value, like: Tensor) -> Tensor:
    from .creation import tensor
    return tensor(value, device=like.device)


# -- unary -----------------------------------------------------------------------------

def _unary(name: str):
    op = _op(name)

    def fn(input, inplace: bool = False):
        # (_tensor only for its TypeError: a call fewer on the hot path)
        impl = input._impl if isinstance(input, Tensor) else _tensor(name, input)._impl
        if inplace:
            _check_inplace(name, op, [impl], _NO_ATTRS, impl)
            apply(op, [impl], _NO_ATTRS, outs=[impl])
            return input
        return wrap(apply(op, [impl], _NO_ATTRS)[0])
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
_GELU = _op("gelu")


def gelu(input, approximate: str = "none"):
    """GELU: x * Phi(x) with the exact erf ('none') or the tanh approximation ('tanh')."""
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    impl = _tensor("gelu", input)._impl
    return wrap(apply(_GELU, [impl], {"approximate": approximate})[0])


# -- binary ----------------------------------------------------------------------------

_BIN = {name: (_op(name), _op(name + "_scalar"), _op("r" + name + "_scalar"))
        for name in ops.elementwise.BINARY}


def _binary(name: str, a, b):
    op, sop, rop = _BIN[name]
    if isinstance(a, Tensor):
        if isinstance(b, Tensor):
            return wrap(apply(op, [a._impl, b._impl], _NO_ATTRS)[0])
        if isinstance(b, np.ndarray) and b.ndim:
            return _binary(name, a, _as_tensor_like(b, a))
        s = b if type(b) in _NUMBER else _number(name, b)
        return wrap(apply(sop, [a._impl], {"scalar": s})[0])
    if isinstance(b, Tensor):
        if isinstance(a, np.ndarray) and a.ndim:
            return _binary(name, _as_tensor_like(a, b), b)
        return wrap(apply(rop, [b._impl], {"scalar": _number(name, a, "input")})[0])
    raise TypeError(f"{name}(): expected at least one Tensor argument, got "
                    f"{type(a).__name__} and {type(b).__name__}")


def _operator(name: str, method: str, reflected: bool = False):
    """Tensor's ``method`` for op ``name`` (``reflected``: ``self`` is the right operand).
    Tensor binds it as the method itself, with the op defs bound here, so ``a * b`` costs
    one Python call before the interpreter instead of two; operands other than tensors and
    Python numbers go through ``_binary``."""
    op, sop, rop = _BIN[name]
    if reflected:
        def fn(self, other):
            if type(other) in _NUMBER:
                return wrap(apply(rop, [self._impl], {"scalar": other})[0])
            return _binary(name, other, self)
    else:
        def fn(self, other):
            if isinstance(other, Tensor):
                return wrap(apply(op, [self._impl, other._impl], _NO_ATTRS)[0])
            if type(other) in _NUMBER:
                return wrap(apply(sop, [self._impl], {"scalar": other})[0])
            return _binary(name, self, other)
    fn.__name__ = method
    fn.__qualname__ = "Tensor." + method
    return fn


def _resolved(impl):
    """The impl's meta, waiting for compute when its shape is known only after it."""
    if impl.meta.shape is None:
        resolve(impl)
    return impl.meta


def _check_inplace(name, op, impls, attrs, target):
    """Shape and dtype of an in-place result must fit the tensor written."""
    shape, dtype = op.infer([_resolved(i) for i in impls], attrs)[0]
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
    target = _tensor(name + "_", x, "self")._impl
    if isinstance(other, Tensor):
        impls, attrs, o = [target, other._impl], _NO_ATTRS, op
    else:
        impls, attrs, o = [target], {"scalar": _number(name + "_", other)}, sop
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
        return _binary(name, input, other)
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


_FULL = _op("full")
_COPY = _op("copy")
_CAST = _op("cast")


def fill_(input, value):
    """Writes ``value`` to every element of ``input`` (a view writes through)."""
    t = _tensor("fill_", input)._impl
    m = _resolved(t)
    apply(_FULL, [], {"shape": m.shape, "dtype": m.dtype, "device": m.device,
                      "value": _number("fill_", value, "value")}, device=m.device, outs=[t])
    return input


def zero_(input):
    return fill_(input, 0)


def copy_(input, src):
    """Copies ``src`` (broadcast to ``input``'s shape, any dtype, cpu or null) into ``input``."""
    dst = _tensor("copy_", input)._impl
    s = _tensor("copy_", src, "src")._impl
    _resolved(dst), _resolved(s)
    if not s.blob.backend.has_data and dst.blob.backend.has_data:
        raise _no_data("copy_", s.meta.device)
    try:
        np.broadcast_shapes(s.meta.shape, dst.meta.shape)
        ok = np.broadcast_shapes(s.meta.shape, dst.meta.shape) == dst.meta.shape
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"copy_: source of shape {s.meta.shape} cannot be broadcast to the "
                         f"destination's shape {dst.meta.shape}")
    apply(_COPY, [s], _NO_ATTRS, device=dst.meta.device, outs=[dst])
    return input


def _no_data(op, device):
    return DeviceError(f"{op}: the {device} device has no data to read; null tensors have only "
                       f"shapes, dtypes and bytes (use cpu for values)")


_CLAMP = _op("clamp")


def clamp(input, min=None, max=None):  # noqa: A002 - PyTorch's argument names
    """Limits every element to [min, max] (either bound may be None, not both).

    Example: ``af.clamp(x, min=0.0)``"""
    impl = _tensor("clamp", input)._impl
    if min is None and max is None:
        raise ValueError("clamp(): at least one of 'min' or 'max' must not be None")
    lo = None if min is None else _number("clamp", min, "min")
    hi = None if max is None else _number("clamp", max, "max")
    return wrap(apply(_CLAMP, [impl], {"min": lo, "max": hi})[0])


# -- where, matmul ---------------------------------------------------------------------

_WHERE = _op("where")


def where(condition, input, other):
    """Elementwise ``input if condition else other``; either value may be a number."""
    cond = _tensor("where", condition, "condition")
    impls, attrs = [cond._impl], {}
    for key, v in (("x", input), ("y", other)):
        if isinstance(v, Tensor):
            impls.append(v._impl)
        else:
            attrs[key] = _number("where", v, "input" if key == "x" else "other")
    return wrap(apply(_WHERE, impls, attrs)[0])


_MATMUL = _op("matmul")


def matmul(input, other):
    """Matrix product with batching and broadcasting of leading dims (numpy's rules)."""
    a, b = _tensor("matmul", input), _tensor("matmul", other, "other")
    return wrap(apply(_MATMUL, [a._impl, b._impl], _NO_ATTRS)[0])


# -- reductions ------------------------------------------------------------------------

_SUM, _MEAN, _AMAX, _AMIN = _op("sum"), _op("mean"), _op("amax"), _op("amin")
_ARGMAX, _ARGMIN, _MAXD, _MIND = _op("argmax"), _op("argmin"), _op("max_dim"), _op("min_dim")


def _reduce(op, name, input, dim, keepdim, dtype=None):
    impl = _tensor(name, input)._impl
    ndim = len(input.shape)
    dims = normalize_dims(name, dim, ndim)
    if ndim == 0:
        dims = None                     # a 0-dim tensor reduces over "all" of its no dims
    attrs = {"dims": dims, "keepdim": bool(keepdim)}
    if dtype is not None:
        attrs["dtype"] = as_dtype(dtype)
    return wrap(apply(op, [impl], attrs)[0])


def sum(input, dim=None, keepdim: bool = False, *, dtype=None):  # noqa: A001
    """Sum over ``dim`` (an int, a tuple, or None for all). Ints and bools sum to int64."""
    return _reduce(_SUM, "sum", input, dim, keepdim, dtype)


def mean(input, dim=None, keepdim: bool = False, *, dtype=None):
    """Mean over ``dim``; the input (or ``dtype``) must be floating point."""
    return _reduce(_MEAN, "mean", input, dim, keepdim, dtype)


def _minmax(name, amop, dimop, binop, input, dim, keepdim):
    if isinstance(dim, Tensor):
        return _binary(binop, input, dim)
    if dim is None:
        return _reduce(amop, name, input, None, keepdim)
    impl = _tensor(name, input)._impl
    ndim = len(input.shape)
    d = normalize_dim(name, dim, ndim)
    if ndim == 0:                       # along the only "dim" of a 0-dim tensor: itself, 0
        return MinMax(clone(input), _arg(_ARGMAX, name, input, None, False))
    vals, idx = apply(dimop, [impl], {"dim": d, "keepdim": bool(keepdim)})
    return MinMax(wrap(vals), wrap(idx))


def max(input, dim=None, keepdim: bool = False):  # noqa: A001
    """Largest element; with ``dim``, ``(values, indices)`` along it; with a tensor, maximum."""
    return _minmax("max", _AMAX, _MAXD, "maximum", input, dim, keepdim)


def min(input, dim=None, keepdim: bool = False):  # noqa: A001
    """Smallest element; with ``dim``, ``(values, indices)`` along it; with a tensor, minimum."""
    return _minmax("min", _AMIN, _MIND, "minimum", input, dim, keepdim)


def amax(input, dim=None, keepdim: bool = False):
    return _reduce(_AMAX, "amax", input, dim, keepdim)


def amin(input, dim=None, keepdim: bool = False):
    return _reduce(_AMIN, "amin", input, dim, keepdim)


def _arg(op, name, input, dim, keepdim):
    impl = _tensor(name, input)._impl
    ndim = len(input.shape)
    d = None if dim is None else normalize_dim(name, dim, ndim)
    if ndim == 0:
        d = None
    return wrap(apply(op, [impl], {"dim": d, "keepdim": bool(keepdim)})[0])


def argmax(input, dim=None, keepdim: bool = False):
    """Index of the largest element (of the flattened tensor when ``dim`` is None)."""
    return _arg(_ARGMAX, "argmax", input, dim, keepdim)


def argmin(input, dim=None, keepdim: bool = False):
    return _arg(_ARGMIN, "argmin", input, dim, keepdim)


# -- nn --------------------------------------------------------------------------------

_SOFTMAX, _LOG_SOFTMAX = _op("softmax"), _op("log_softmax")


def _softmax_like(op, name, input, dim):
    impl = _tensor(name, input)._impl
    if dim is None:
        raise TypeError(f"{name}(): missing the 'dim' argument; say which dim sums to 1, "
                        f"e.g. {name}(x, dim=-1)")
    d = normalize_dim(name, dim, len(_resolved(impl).shape))
    return wrap(apply(op, [impl], {"dim": d})[0])


def softmax(input, dim=None):
    """exp(x) / sum(exp(x)) along ``dim``, computed stably. Example: ``af.softmax(x, dim=1)``."""
    return _softmax_like(_SOFTMAX, "softmax", input, dim)


def log_softmax(input, dim=None):
    """log(softmax(x)) along ``dim``, computed stably."""
    return _softmax_like(_LOG_SOFTMAX, "log_softmax", input, dim)


# -- joining, casting, copying ---------------------------------------------------------

_CAT, _STACK = _op("cat"), _op("stack")


def _tensor_list(name, tensors):
    if isinstance(tensors, Tensor) or not hasattr(tensors, "__iter__"):
        raise TypeError(f"{name}(): expected a sequence of tensors, got {type(tensors).__name__}")
    ts = [_tensor(name, t, f"tensors[{i}]") for i, t in enumerate(tensors)]
    if not ts:
        raise ValueError(f"{name}(): expected a non-empty sequence of tensors")
    return ts


def cat(tensors, dim: int = 0):
    """Joins tensors along an existing dim. Example: ``af.cat([x, y], dim=1)``."""
    ts = _tensor_list("cat", tensors)
    d = normalize_dim("cat", dim, len(ts[0].shape))     # Tensor.shape resolves
    if not ts[0].shape:
        raise ShapeError("cat: zero-dimensional tensor (at position 0) cannot be concatenated; "
                         "use stack, or unsqueeze first")
    return wrap(apply(_CAT, [t._impl for t in ts], {"dim": d})[0])


def stack(tensors, dim: int = 0):
    """Joins equal-shaped tensors along a new dim."""
    ts = _tensor_list("stack", tensors)
    d = normalize_dim("stack", dim, len(ts[0].shape) + 1)
    return wrap(apply(_STACK, [t._impl for t in ts], {"dim": d})[0])


def cast(input, dtype):
    """A copy of ``input`` converted to ``dtype``."""
    impl = _tensor("cast", input)._impl
    dt = as_dtype(dtype)
    return wrap(apply(_CAST, [impl], {"dtype": dt})[0])


def to_device(input, device):
    """A copy of ``input`` on ``device`` (or ``input`` itself when it is there already)."""
    impl = _tensor("to", input)._impl
    dev = as_device(device)
    if dev is impl.meta.device:
        return input
    if not impl.blob.backend.has_data and get_backend(dev).has_data:
        raise _no_data("to", impl.meta.device)
    return wrap(apply(_COPY, [impl], _NO_ATTRS, device=dev)[0])


def clone(input):
    """A contiguous copy with its own storage."""
    impl = _tensor("clone", input)._impl
    return wrap(apply(_COPY, [impl], _NO_ATTRS)[0])


_NONZERO = _op("nonzero")


def nonzero(input):
    """Indices of the non-zero elements, shape (n, ndim), int64. Its shape is known only
    after compute: reading it (or using it in an op) waits for the kernel."""
    impl = _tensor("nonzero", input)._impl
    return wrap(apply(_NONZERO, [impl], _NO_ATTRS)[0])


def is_floating_point(input) -> bool:
    return _tensor("is_floating_point", input).dtype.category == FLOAT


__all__ = [n for n in dir() if not n.startswith("_") and n not in (
    "annotations", "namedtuple", "np", "ops", "apply", "resolve", "Tensor", "wrap", "FLOAT",
    "DeviceError", "DTypeError", "ShapeError", "normalize_dim", "normalize_dims", "MinMax",
    "get_backend", "as_device", "as_dtype")]
