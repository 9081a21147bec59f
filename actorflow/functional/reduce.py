"""Reductions (sum, mean, max/min, arg...) and softmax-like functors."""

from __future__ import annotations

from collections import namedtuple
from typing import overload

from ..dtype import _DTypeLike, as_dtype
from ..eager.interpreter import apply
from ..errors import DTypeError
from ..ops.common import normalize_dim, normalize_dims
from ..tensor.tensor import Tensor, wrap
from .common import _Dims, dim_alias, keepdim_alias, op_def, refuse_out, resolved, tensor_arg
from .elementwise import binary
from .joining import cast, clone

MinMax = namedtuple("MinMax", ["values", "indices"])


# -- reductions ------------------------------------------------------------------------

_SUM, _MEAN, _AMAX, _AMIN = op_def("sum"), op_def("mean"), op_def("amax"), op_def("amin")
_SQRT = op_def("sqrt")
_ARGMAX, _ARGMIN, _MAXD, _MIND = (
    op_def("argmax"),
    op_def("argmin"),
    op_def("max_dim"),
    op_def("min_dim"),
)


def _reduce(op, name, input, dim, keepdim, dtype=None):
    impl = tensor_arg(name, input)._impl
    ndim = len(input.shape)
    dims = normalize_dims(name, dim, ndim)
    if ndim == 0:
        dims = None  # a 0-dim tensor reduces over "all" of its no dims
    attrs = {"dims": dims, "keepdim": bool(keepdim)}
    if dtype is not None:
        attrs["dtype"] = as_dtype(dtype)
    return wrap(apply(op, [impl], attrs)[0])


# Every reduction takes PyTorch's keywords: ``dim`` and ``keepdim``, their numpy names
# ``axis`` and ``keepdims`` (as PyTorch does), and ``out``, refused.


def _aliased(name, dim, keepdim, out, axis, keepdims):
    if out is not None:
        refuse_out(name, out)
    return dim_alias(name, dim, axis), keepdim_alias(name, keepdim, keepdims)


def sum(  # noqa: A001
    input: Tensor,
    dim: _Dims | None = None,
    keepdim: bool = False,
    *,
    dtype: _DTypeLike | None = None,
    out: None = None,
    axis: _Dims | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Sum over ``dim`` (an int, a tuple, or None for all). Ints and bools sum to int64."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("sum", dim, keepdim, out, axis, keepdims)
    return _reduce(_SUM, "sum", input, dim, keepdim, dtype)


def mean(
    input: Tensor,
    dim: _Dims | None = None,
    keepdim: bool = False,
    *,
    dtype: _DTypeLike | None = None,
    out: None = None,
    axis: _Dims | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Mean over ``dim``; the input (or ``dtype``) must be floating point."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("mean", dim, keepdim, out, axis, keepdims)
    return _reduce(_MEAN, "mean", input, dim, keepdim, dtype)


def _correction(name, unbiased, correction) -> float:
    """PyTorch's two spellings of the variance's divisor: ``correction`` (N - correction),
    else the older ``unbiased`` (True, the default: 1; False: 0)."""
    if not isinstance(unbiased, bool):
        raise TypeError(f"{name}(): unbiased must be a bool, got {unbiased!r}")
    if correction is None:
        return 1 if unbiased else 0
    if not unbiased:
        raise TypeError(
            f"{name}(): got unbiased=False and correction={correction!r}; pass "
            f"one (unbiased=False is correction=0)"
        )
    if isinstance(correction, bool) or not isinstance(correction, (int, float)):
        raise TypeError(f"{name}(): correction must be a number, got {correction!r}")
    return correction


def _variance(name, input, dim, unbiased, keepdim, correction, out, axis, keepdims, root=False):
    """sum((x - mean)^2) / max(0, N - correction) over ``dim`` (its square root for
    ``root``): a composition of mean, sub, mul and sum, so autograd, graph mode and the cuda
    device take it as it is. float16 and bfloat16 inputs are computed in float32 and the
    result cast back, as PyTorch (their squares overflow past 256 in float16)."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased(name, dim, keepdim, out, axis, keepdims)
    if isinstance(dim, bool):  # var(x, True): the unbiased overload
        unbiased, dim = dim, None
    c = _correction(name, unbiased, correction)
    impl = tensor_arg(name, input)._impl
    meta = resolved(impl)
    if not meta.dtype.is_floating_point:
        raise DTypeError(
            f"{name}: needs a floating point tensor, got {meta.dtype.name}; convert "
            f"with .float() first"
        )
    ndim = len(meta.shape)
    dims = normalize_dims(name, dim, ndim) if ndim else None
    n = 1
    for d in range(ndim) if dims is None else dims:
        n *= meta.shape[d]
    low = meta.dtype.name in ("float16", "bfloat16")
    if low:
        input = cast(input, "float32")
    dof = n - c
    # N - correction <= 0: the value is inf (nan for 0 / 0), the gradient PyTorch's
    # 2 (x - mean) / (N - correction) (the mean's share, zero, is left out: inf - inf)
    mu = mean(input if dof > 0 else input.detach(), dim=dims, keepdim=True)
    d = binary("sub", input, mu)
    ss = sum(binary("mul", d, d), dim=dims, keepdim=bool(keepdim))
    v = binary("div", ss, float(dof))
    if dof < 0:
        v = binary("add", v, binary("sub", binary("div", ss, 0.0), v).detach())
    if root:
        v = wrap(apply(_SQRT, [v._impl], {})[0])
    return cast(v, meta.dtype) if low else v


def var(
    input: Tensor,
    dim: _Dims | bool | None = None,
    unbiased: bool = True,
    keepdim: bool = False,
    *,
    correction: float | None = None,
    out: None = None,
    axis: _Dims | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Variance over ``dim`` (an int, a tuple, or None for all) with ``correction``
    (N - correction divides; default 1, Bessel's) or PyTorch's older ``unbiased``
    (``var(x, True)``, ``var(x, dim, False)``). N - correction <= 0 gives inf (nan for
    0 / 0), as PyTorch."""
    return _variance("var", input, dim, unbiased, keepdim, correction, out, axis, keepdims)


def std(
    input: Tensor,
    dim: _Dims | bool | None = None,
    unbiased: bool = True,
    keepdim: bool = False,
    *,
    correction: float | None = None,
    out: None = None,
    axis: _Dims | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Standard deviation: sqrt of ``var`` with the same arguments."""
    return _variance(
        "std", input, dim, unbiased, keepdim, correction, out, axis, keepdims, root=True
    )


def _minmax(name, amop, dimop, binop, input, dim, keepdim, other):
    if other is not None:
        if dim is not None:
            raise TypeError(
                f"{name}(): got dim={dim!r} and other=; pass one ({name}(x, dim) "
                f"reduces, {name}(x, other) compares elementwise)"
            )
        dim = other
    if isinstance(dim, Tensor):
        return binary(binop, input, dim)
    if other is not None:
        raise TypeError(
            f"{name}(): argument 'other' must be a Tensor, not "
            f"{type(other).__name__}; use {binop}() or clamp() for numbers"
        )
    if dim is None:
        return _reduce(amop, name, input, None, keepdim)
    impl = tensor_arg(name, input)._impl
    ndim = len(input.shape)
    d = normalize_dim(name, dim, ndim)
    if ndim == 0:  # along the only "dim" of a 0-dim tensor: itself, 0
        return MinMax(clone(input), _arg(_ARGMAX, name, input, None, False))
    vals, idx = apply(dimop, [impl], {"dim": d, "keepdim": bool(keepdim)})
    return MinMax(wrap(vals), wrap(idx))


@overload
def max(
    input: Tensor,
    dim: None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    other: Tensor | None = None,
    axis: None = None,
    keepdims: bool | None = None,
) -> Tensor: ...
@overload
def max(
    input: Tensor,
    dim: int,
    keepdim: bool = False,
    *,
    out: None = None,
    other: None = None,
    axis: None = None,
    keepdims: bool | None = None,
) -> MinMax: ...
@overload
def max(
    input: Tensor,
    dim: None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    other: None = None,
    axis: int,
    keepdims: bool | None = None,
) -> MinMax: ...
@overload
def max(
    input: Tensor,
    dim: Tensor,
    keepdim: bool = False,
    *,
    out: None = None,
    other: None = None,
    axis: None = None,
    keepdims: bool | None = None,
) -> Tensor: ...


def max(  # noqa: A001
    input: Tensor,
    dim: int | Tensor | None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    other: Tensor | None = None,
    axis: int | None = None,
    keepdims: bool | None = None,
) -> Tensor | MinMax:
    """Largest element; with ``dim``, ``(values, indices)`` along it; with a tensor (in
    ``dim``'s place, or as ``other=``), maximum."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("max", dim, keepdim, out, axis, keepdims)
    return _minmax("max", _AMAX, _MAXD, "maximum", input, dim, keepdim, other)


@overload
def min(
    input: Tensor,
    dim: None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    other: Tensor | None = None,
    axis: None = None,
    keepdims: bool | None = None,
) -> Tensor: ...
@overload
def min(
    input: Tensor,
    dim: int,
    keepdim: bool = False,
    *,
    out: None = None,
    other: None = None,
    axis: None = None,
    keepdims: bool | None = None,
) -> MinMax: ...
@overload
def min(
    input: Tensor,
    dim: None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    other: None = None,
    axis: int,
    keepdims: bool | None = None,
) -> MinMax: ...
@overload
def min(
    input: Tensor,
    dim: Tensor,
    keepdim: bool = False,
    *,
    out: None = None,
    other: None = None,
    axis: None = None,
    keepdims: bool | None = None,
) -> Tensor: ...


def min(  # noqa: A001
    input: Tensor,
    dim: int | Tensor | None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    other: Tensor | None = None,
    axis: int | None = None,
    keepdims: bool | None = None,
) -> Tensor | MinMax:
    """Smallest element; with ``dim``, ``(values, indices)`` along it; with a tensor (in
    ``dim``'s place, or as ``other=``), minimum."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("min", dim, keepdim, out, axis, keepdims)
    return _minmax("min", _AMIN, _MIND, "minimum", input, dim, keepdim, other)


def amax(
    input: Tensor,
    dim: _Dims | None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    axis: _Dims | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Largest elements over ``dim`` (an int, a tuple, or None for all)."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("amax", dim, keepdim, out, axis, keepdims)
    return _reduce(_AMAX, "amax", input, dim, keepdim)


def amin(
    input: Tensor,
    dim: _Dims | None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    axis: _Dims | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Smallest elements over ``dim`` (an int, a tuple, or None for all)."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("amin", dim, keepdim, out, axis, keepdims)
    return _reduce(_AMIN, "amin", input, dim, keepdim)


def _arg(op, name, input, dim, keepdim):
    impl = tensor_arg(name, input)._impl
    ndim = len(input.shape)
    d = None if dim is None else normalize_dim(name, dim, ndim)
    if ndim == 0:
        d = None
    return wrap(apply(op, [impl], {"dim": d, "keepdim": bool(keepdim)})[0])


def argmax(
    input: Tensor,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    axis: int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Index of the largest element (of the flattened tensor when ``dim`` is None)."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("argmax", dim, keepdim, out, axis, keepdims)
    return _arg(_ARGMAX, "argmax", input, dim, keepdim)


def argmin(
    input: Tensor,
    dim: int | None = None,
    keepdim: bool = False,
    *,
    out: None = None,
    axis: int | None = None,
    keepdims: bool | None = None,
) -> Tensor:
    """Index of the smallest element (of the flattened tensor when ``dim`` is None)."""
    if out is not None or axis is not None or keepdims is not None:
        dim, keepdim = _aliased("argmin", dim, keepdim, out, axis, keepdims)
    return _arg(_ARGMIN, "argmin", input, dim, keepdim)


# -- nn --------------------------------------------------------------------------------

_SOFTMAX, _LOG_SOFTMAX = op_def("softmax"), op_def("log_softmax")


def _softmax_like(op, name, input, dim, dtype, out, axis):
    if out is not None:
        refuse_out(name, out)
    dim = dim_alias(name, dim, axis)
    impl = tensor_arg(name, input)._impl
    if dim is None:
        raise TypeError(
            f"{name}(): missing the 'dim' argument; say which dim sums to 1, e.g. {name}(x, dim=-1)"
        )
    d = normalize_dim(name, dim, len(resolved(impl).shape))
    if dtype is not None:  # the input is cast first, as in PyTorch
        impl = cast(input, dtype)._impl
    return wrap(apply(op, [impl], {"dim": d})[0])


def softmax(
    input: Tensor,
    dim: int | None = None,
    dtype: _DTypeLike | None = None,
    *,
    out: None = None,
    axis: int | None = None,
) -> Tensor:
    """exp(x) / sum(exp(x)) along ``dim``, computed stably (in ``dtype`` when given: the
    input is cast to it first). Example: ``af.softmax(x, dim=1)``."""
    return _softmax_like(_SOFTMAX, "softmax", input, dim, dtype, out, axis)


def log_softmax(
    input: Tensor,
    dim: int | None = None,
    dtype: _DTypeLike | None = None,
    *,
    out: None = None,
    axis: int | None = None,
) -> Tensor:
    """log(softmax(x)) along ``dim``, computed stably (in ``dtype`` when given)."""
    return _softmax_like(_LOG_SOFTMAX, "log_softmax", input, dim, dtype, out, axis)
