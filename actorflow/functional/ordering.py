"""Gathers and scatters along a dim (gather, scatter_add), the cumulative sum, sorting
(sort, argsort, topk) and pad: PyTorch's arguments, checked with messages that name the op,
the shapes or values and the fix. An index tensor's values are checked by the kernel, before
it writes anything (``IndexOutOfBoundsError`` naming the value and the dim's size)."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence

from ..dtype import _DTypeLike, _Number, as_dtype
from ..eager.interpreter import apply
from ..ops.common import normalize_dim
from ..tensor.tensor import Tensor, wrap
from .common import dim_alias, number, op_def, refuse_out, resolved, tensor_arg

# PyTorch's torch.return_types: a named tuple (values, indices)
# (named as PyTorch's, which its repr shows: sort(values=..., indices=...))
Sort = namedtuple("sort", ["values", "indices"])  # type: ignore[name-match]
TopK = namedtuple("topk", ["values", "indices"])  # type: ignore[name-match]

_GATHER, _SCATTER_ADD, _CUMSUM = op_def("gather"), op_def("scatter_add"), op_def("cumsum")
_SORT, _TOPK, _PAD = op_def("sort"), op_def("topk"), op_def("pad")


def _dim(name, impl, dim, axis=None, default=None) -> int:
    """``dim`` (or its alias ``axis``) normalized for the tensor ``impl``; a TypeError
    when neither is given to a function that needs one."""
    dim = dim_alias(name, dim, axis, default)
    if dim is None:
        raise TypeError(f"{name}(): missing the 'dim' argument (the dim to work along)")
    return normalize_dim(name, dim, len(resolved(impl).shape))


def _required(name, value, arg):
    if value is None:
        raise TypeError(f"{name}(): missing the '{arg}' argument")
    return tensor_arg(name, value, arg)._impl


def gather(
    input: Tensor,
    dim: int | None = None,
    index: Tensor | None = None,
    *,
    sparse_grad: bool = False,
    out: None = None,
    axis: int | None = None,
) -> Tensor:
    """``out[i][j] = input[index[i][j]][j]`` (dim 0; likewise along any dim): ``index`` has
    the input's number of dims, is int64 and no larger than the input in the other dims; its
    values must be in [0, input.shape[dim]). ``sparse_grad`` is taken and ignored (the
    gradient is dense)."""
    if out is not None:
        refuse_out("gather", out)
    x = tensor_arg("gather", input)._impl
    i = _required("gather", index, "index")
    return wrap(apply(_GATHER, [x, i], {"dim": _dim("gather", x, dim, axis)})[0])


def _scatter_args(name, input, dim, index, src, axis):
    x = tensor_arg(name, input)._impl
    i = _required(name, index, "index")
    s = _required(name, src, "src")
    return [x, i, s], {"dim": _dim(name, x, dim, axis)}


def scatter_add(
    input: Tensor,
    dim: int | None = None,
    index: Tensor | None = None,
    src: Tensor | None = None,
    *,
    out: None = None,
    axis: int | None = None,
) -> Tensor:
    """A copy of ``input`` with ``src[i][j]`` added at ``[index[i][j]][j]`` (dim 0; likewise
    along any dim), repeated indices summed. ``index``: int64, the input's number of dims, no
    larger than ``src`` in any dim nor than the input in the dims but ``dim``; its values in
    [0, input.shape[dim])."""
    if out is not None:
        refuse_out("scatter_add", out)
    impls, attrs = _scatter_args("scatter_add", input, dim, index, src, axis)
    return wrap(apply(_SCATTER_ADD, impls, attrs)[0])


def scatter_add_(
    input: Tensor,
    dim: int | None = None,
    index: Tensor | None = None,
    src: Tensor | None = None,
    *,
    axis: int | None = None,
) -> Tensor:
    """``scatter_add`` written into ``input``."""
    impls, attrs = _scatter_args("scatter_add_", input, dim, index, src, axis)
    apply(_SCATTER_ADD, impls, attrs, outs=[impls[0]])
    return input


def cumsum(
    input: Tensor,
    dim: int | None = None,
    *,
    dtype: _DTypeLike | None = None,
    out: None = None,
    axis: int | None = None,
) -> Tensor:
    """The cumulative sum along ``dim``; bools and ints sum to int64 unless ``dtype`` says
    otherwise (the input is then summed in it, as in PyTorch)."""
    if out is not None:
        refuse_out("cumsum", out)
    x = tensor_arg("cumsum", input)._impl
    attrs = {
        "dim": _dim("cumsum", x, dim, axis),
        "reverse": False,
        "dtype": None if dtype is None else as_dtype(dtype),
    }
    return wrap(apply(_CUMSUM, [x], attrs)[0])


def _sorting(name, op, input, dim, axis, descending, k=None):
    x = tensor_arg(name, input)._impl
    attrs = {"dim": _dim(name, x, dim, axis, -1), "descending": bool(descending)}
    if k is not None:
        attrs["k"] = k
    vals, idx = apply(op, [x], attrs)
    return wrap(vals), wrap(idx)


def sort(
    input: Tensor,
    dim: int = -1,
    descending: bool = False,
    *,
    stable: bool = False,
    out: None = None,
    axis: int | None = None,
) -> Sort:
    """``(values, indices)`` of ``input`` sorted along ``dim``. The sort is always stable
    (equal values keep their order, descending too; ``stable`` is taken for PyTorch's
    signature); NaN sorts above every number, as in PyTorch."""
    if out is not None:
        refuse_out("sort", out)
    return Sort(*_sorting("sort", _SORT, input, dim, axis, descending))


def argsort(
    input: Tensor,
    dim: int = -1,
    descending: bool = False,
    *,
    stable: bool = False,
    out: None = None,
    axis: int | None = None,
) -> Tensor:
    """The indices of ``sort(input, dim, descending)`` (stable, as there)."""
    if out is not None:
        refuse_out("argsort", out)
    return _sorting("argsort", _SORT, input, dim, axis, descending)[1]


def topk(
    input: Tensor,
    k: int,
    dim: int = -1,
    largest: bool = True,
    sorted: bool = True,  # noqa: A002 - PyTorch's argument name
    *,
    out: None = None,
    axis: int | None = None,
) -> TopK:
    """``(values, indices)`` of the ``k`` largest (``largest=False``: smallest) elements
    along ``dim``, sorted; among equal values the first ones come first (``sorted=False``
    gives the same order, one PyTorch allows).

    Raises:
        ShapeError: k outside [0, size of dim]."""
    if out is not None:
        refuse_out("topk", out)
    if isinstance(k, bool) or not isinstance(k, int):
        k = int(number("topk", k, "k"))
    return TopK(*_sorting("topk", _TOPK, input, dim, axis, largest, k))


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def _check_pad_mode(mode, d, n, b, a):
    """PyTorch's limits on a non-constant mode's (before, after) amounts for dim ``d`` of
    size ``n`` (negative amounts crop): reflect pads less than ``n`` on each side,
    replicate any amount, both leaving at least one element; circular wraps the part left
    after cropping around at most once."""
    m = n + b + a
    if mode == "circular" and m >= 0:
        kept = n - max(-b, 0) - max(-a, 0)
        if max(b, a, 0) <= kept:
            return
        raise ValueError(
            f"pad: circular padding ({b}, {a}) of dim {d} (size {n}) wraps the "
            f"{max(kept, 0)} elements left after cropping more than once; each "
            f"positive amount must be at most {max(kept, 0)}"
        )
    if mode == "reflect" and max(b, a) >= n:
        raise ValueError(
            f"pad: reflect padding ({b}, {a}) of dim {d} (size {n}) must be less "
            f"than the dim's size on each side"
        )
    least = 0 if mode == "circular" else 1
    if m < least:
        raise ValueError(
            f"pad: {mode} padding ({b}, {a}) of dim {d} (size {n}) leaves {m} "
            f"elements; mode {mode!r} must leave at least {least}"
        )


def pad(
    input: Tensor, pad: Sequence[int], mode: str = "constant", value: _Number | None = None
) -> Tensor:
    """``input`` padded: ``pad`` = (left, right) of the last dim, then (top, bottom) of the
    one before, and so on (at most the input's number of dims pairs); negative amounts crop.
    ``mode``: "constant" (``value``, default 0) on any dims; "reflect", "replicate" and
    "circular" on the last 1-3 dims of a batched input of 2-5 dims (unbatched: 1-4), as in
    PyTorch.

    Raises:
        ValueError: an odd-length ``pad``, more pairs than dims, an unknown mode, a value
            with a non-constant mode, or amounts past a mode's limits (reflect: less than the
            dim's size; circular: at most what cropping leaves; reflect and replicate
            leave at least one element)."""
    x = tensor_arg("pad", input)._impl
    shape = resolved(x).shape
    amounts = [int(p) for p in pad]
    if len(amounts) % 2:
        raise ValueError(
            f"pad: the padding length must be even (pairs of left, right), got "
            f"{len(amounts)}: {tuple(pad)}"
        )
    npairs = len(amounts) // 2
    if npairs > len(shape):
        raise ValueError(
            f"pad: {npairs} (left, right) pairs for an input of {len(shape)} "
            f"dims (shape {shape}); pass at most one pair per dim"
        )
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: unknown mode {mode!r}; use one of {', '.join(_PAD_MODES)}")
    pads = tuple(
        [(0, 0)] * (len(shape) - npairs)
        + [(amounts[2 * k], amounts[2 * k + 1]) for k in reversed(range(npairs))]
    )
    if mode == "constant":
        v = 0.0 if value is None else number("pad", value, "value")
        return wrap(apply(_PAD, [x], {"pads": pads, "mode": mode, "value": v})[0])
    if value is not None and value != 0:
        raise ValueError(
            f"pad: value={value} is for mode='constant'; mode={mode!r} pads with "
            f"the input's own elements"
        )
    if not 1 <= npairs <= 3 or not npairs + 1 <= len(shape) <= npairs + 2:
        raise ValueError(
            f"pad: mode {mode!r} pads the last 1-3 dims of a (batch,) channel, "
            f"... input: {npairs} pairs need {npairs + 1} or {npairs + 2} dims, "
            f"got shape {shape}"
        )
    first = len(shape) - npairs - 1  # the channel dim
    if mode != "circular" and 0 in shape[first:]:
        raise ValueError(
            f"pad: mode {mode!r} needs non-empty channel and padded dims, got "
            f"shape {shape} (only a batch dim may be 0)"
        )
    for d, (b, a) in enumerate(pads):
        if b or a:
            _check_pad_mode(mode, d, shape[d], b, a)
    return wrap(apply(_PAD, [x], {"pads": pads, "mode": mode, "value": 0.0})[0])


__all__ = [
    "Sort",
    "TopK",
    "argsort",
    "cumsum",
    "gather",
    "pad",
    "scatter_add",
    "scatter_add_",
    "sort",
    "topk",
]
