"""Convolution and pooling functors with PyTorch's arguments: conv2d, conv_transpose2d,
max_pool2d, avg_pool2d, adaptive_avg_pool2d, unfold, fold. Inputs are NCHW, batched
(N, C, H, W) or unbatched (C, H, W) as in PyTorch; sizes are an int or an (h, w) pair.
The arguments are checked and normalised here (``ops/conv.py`` takes pairs and
(top, bottom, left, right) padding)."""

from __future__ import annotations

import numbers
from typing import Literal, TypeAlias, overload

from ..eager.interpreter import apply
from ..errors import ShapeError
from ..tensor.tensor import Tensor, wrap
from .common import op_def, tensor_arg
from .elementwise import add
from .joining import clone

# a size of the two spatial dims: an int for both, or (h, w)
_Pair: TypeAlias = int | tuple[int, ...] | list[int]

_CONV, _CONV_T = op_def("conv2d"), op_def("conv_transpose2d")
_MAX, _AVG, _ADAPTIVE = op_def("max_pool2d"), op_def("avg_pool2d"), op_def("adaptive_avg_pool2d")
_UNFOLD, _FOLD = op_def("unfold"), op_def("fold")


def _pair(op: str, arg: str, v, low: int = 1) -> tuple:
    """An int or a sequence of two ints, each >= ``low``, as a pair."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        p = (int(v), int(v))
    elif isinstance(v, (tuple, list)) and len(v) == 1 and isinstance(v[0], numbers.Integral):
        p = (int(v[0]), int(v[0]))
    elif (
        isinstance(v, (tuple, list))
        and len(v) == 2
        and all(isinstance(e, numbers.Integral) and not isinstance(e, bool) for e in v)
    ):
        p = (int(v[0]), int(v[1]))
    else:
        raise TypeError(f"{op}(): {arg} must be an int or a pair of ints (h, w), got {v!r}")
    if min(p) < low:
        raise ValueError(f"{op}(): {arg} must be >= {low}, got {v!r}")
    return p


def _batched(op: str, input, ndims=(3, 4), what="(N, C, H, W) or unbatched (C, H, W)"):
    """``input`` as a 4-D (or 3-D for fold) batch, and whether it was unbatched."""
    tensor_arg(op, input)
    nd = len(input.shape)
    if nd not in ndims:
        raise ShapeError(
            f"{op}: expected a {'-D or '.join(str(n) for n in ndims)}-D input "
            f"{what}, got shape {input.shape}"
        )
    if nd == ndims[0]:
        return input.unsqueeze(0), True
    return input, False


def _unbatched(out, was: bool):
    return out.squeeze(0) if was else out


def _bias(op: str, out, bias, channels: int):
    if bias is None:
        return out
    tensor_arg(op, bias, "bias")
    if tuple(bias.shape) != (channels,):
        raise ShapeError(
            f"{op}: bias must have shape ({channels},), one value per output "
            f"channel, got {bias.shape}"
        )
    if not bias.is_contiguous():
        bias = clone(bias)
    return add(out, bias.view(channels, 1, 1))


def _same_padding(kernel, dilation) -> tuple:
    """'same' as PyTorch pads it: total d*(k-1) per dim, the odd one at the bottom/right."""
    pads = []
    for k, d in zip(kernel, dilation, strict=True):
        total = d * (k - 1)
        pads += [total // 2, total - total // 2]
    return pads[0], pads[1], pads[2], pads[3]


def _conv_padding(op, padding, kernel, stride, dilation) -> tuple:
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding == "same":
            if stride != (1, 1):
                raise ValueError(
                    f"{op}(): padding='same' is not supported for strided "
                    f"convolutions (stride {stride}); pass the padding as ints"
                )
            return _same_padding(kernel, dilation)
        raise ValueError(
            f"{op}(): padding must be 'valid', 'same', an int or a pair, got {padding!r}"
        )
    ph, pw = _pair(op, "padding", padding, 0)
    return ph, ph, pw, pw


def _groups(op, groups) -> int:
    if isinstance(groups, bool) or not isinstance(groups, numbers.Integral) or groups < 1:
        raise ValueError(f"{op}(): groups must be an int >= 1, got {groups!r}")
    return int(groups)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Pair = 1,
    padding: _Pair | str = 0,
    dilation: _Pair = 1,
    groups: int = 1,
) -> Tensor:
    """A 2-D convolution (cross-correlation, as PyTorch's) of ``input`` (N, C, H, W) or
    (C, H, W) with ``weight`` (O, C/groups, kh, kw), plus ``bias`` (O,).

    Args:
        stride, dilation: an int or (h, w), >= 1.
        padding: an int or (h, w) of zeros on both sides, or 'valid' (none) or 'same' (the
            output as large as the input; stride 1 only; an odd total puts the extra row and
            column at the bottom and right, as PyTorch).
        groups: the channels split into this many groups, each convolved with its own
            O/groups filters.

    Raises:
        ShapeError: a wrong ndim, channels that do not match weight.shape[1] * groups, or a
            kernel larger than the padded input (each names the shapes).
        DTypeError: a non-floating input, or the weight of another dtype."""
    x, was = _batched("conv2d", input)
    tensor_arg("conv2d", weight, "weight")
    if len(weight.shape) != 4:
        raise ShapeError(
            f"conv2d: expected a 4-D weight (out_channels, in_channels/groups, "
            f"kh, kw), got shape {weight.shape}"
        )
    stride, dilation = _pair("conv2d", "stride", stride), _pair("conv2d", "dilation", dilation)
    pads = _conv_padding("conv2d", padding, weight.shape[2:], stride, dilation)
    attrs = {
        "stride": stride,
        "padding": pads,
        "dilation": dilation,
        "groups": _groups("conv2d", groups),
    }
    out = wrap(apply(_CONV, [x._impl, weight._impl], attrs)[0])
    return _unbatched(_bias("conv2d", out, bias, weight.shape[0]), was)


def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: _Pair = 1,
    padding: _Pair = 0,
    output_padding: _Pair = 0,
    groups: int = 1,
    dilation: _Pair = 1,
) -> Tensor:
    """The transpose of conv2d (its gradient with respect to its input), with ``weight``
    (C_in, C_out/groups, kh, kw) as PyTorch's: the output is
    (H-1)*stride - 2*padding + dilation*(k-1) + output_padding + 1 per dim.

    Raises:
        ShapeError: a wrong ndim or channels that do not match weight.shape[0], an empty
            output, or output_padding not smaller than stride or dilation.
        DTypeError: a non-floating input, or the weight of another dtype."""
    x, was = _batched("conv_transpose2d", input)
    tensor_arg("conv_transpose2d", weight, "weight")
    if len(weight.shape) != 4:
        raise ShapeError(
            f"conv_transpose2d: expected a 4-D weight (in_channels, "
            f"out_channels/groups, kh, kw), got shape {weight.shape}"
        )
    op = "conv_transpose2d"
    stride, dilation = _pair(op, "stride", stride), _pair(op, "dilation", dilation)
    ph, pw = _pair(op, "padding", padding, 0)
    oph, opw = _pair(op, "output_padding", output_padding, 0)
    for o, s, d, name in ((oph, stride[0], dilation[0], "h"), (opw, stride[1], dilation[1], "w")):
        if o >= s and o >= d:
            raise ValueError(
                f"{op}(): output_padding ({oph}, {opw}) must be smaller than "
                f"stride {stride} or dilation {dilation} (dim {name})"
            )
    kh, kw = weight.shape[2:]
    h, w = x.shape[2:]
    size = (
        (h - 1) * stride[0] - 2 * ph + dilation[0] * (kh - 1) + oph + 1,
        (w - 1) * stride[1] - 2 * pw + dilation[1] * (kw - 1) + opw + 1,
    )
    g = _groups(op, groups)
    attrs = {
        "stride": stride,
        "padding": (ph, ph, pw, pw),
        "dilation": dilation,
        "groups": g,
        "output_size": size,
    }
    out = wrap(apply(_CONV_T, [x._impl, weight._impl], attrs)[0])
    return _unbatched(_bias(op, out, bias, weight.shape[1] * g), was)


def _pool_attrs(op, kernel_size, stride, padding, dilation, ceil_mode) -> dict:
    kernel = _pair(op, "kernel_size", kernel_size)
    stride = (
        kernel
        if stride is None or (isinstance(stride, (tuple, list)) and not stride)
        else _pair(op, "stride", stride)
    )
    return {
        "kernel": kernel,
        "stride": stride,
        "padding": _pair(op, "padding", padding, 0),
        "dilation": _pair(op, "dilation", dilation),
        "ceil_mode": bool(ceil_mode),
    }


@overload
def max_pool2d(
    input: Tensor,
    kernel_size: _Pair,
    stride: _Pair | None = None,
    padding: _Pair = 0,
    dilation: _Pair = 1,
    ceil_mode: bool = False,
    return_indices: Literal[False] = False,
) -> Tensor: ...
@overload
def max_pool2d(
    input: Tensor,
    kernel_size: _Pair,
    stride: _Pair | None = None,
    padding: _Pair = 0,
    dilation: _Pair = 1,
    ceil_mode: bool = False,
    *,
    return_indices: Literal[True],
) -> tuple[Tensor, Tensor]: ...
@overload
def max_pool2d(
    input: Tensor,
    kernel_size: _Pair,
    stride: _Pair | None = None,
    padding: _Pair = 0,
    dilation: _Pair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]: ...


def max_pool2d(
    input: Tensor,
    kernel_size: _Pair,
    stride: _Pair | None = None,
    padding: _Pair = 0,
    dilation: _Pair = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """The maximum of each window (padding counts as -inf); with ``return_indices`` also
    where it was, as flat indices into each input plane (h * W + w), PyTorch's. ``stride``
    defaults to ``kernel_size``.

    Raises:
        ShapeError: a wrong ndim, padding over half the kernel, or a kernel larger than the
            padded input.
        DTypeError: a non-floating input."""
    x, was = _batched("max_pool2d", input)
    attrs = _pool_attrs("max_pool2d", kernel_size, stride, padding, dilation, ceil_mode)
    vals, idx = apply(_MAX, [x._impl], attrs)
    vals, idx = _unbatched(wrap(vals), was), _unbatched(wrap(idx), was)
    return (vals, idx) if return_indices else vals


def max_pool2d_values(
    input: Tensor,
    kernel_size: _Pair,
    stride: _Pair | None = (),
    padding: _Pair = 0,
    dilation: _Pair = 1,
    ceil_mode: bool = False,
) -> Tensor:
    """``torch.max_pool2d``: ``max_pool2d`` without indices (its stride default is ())."""
    return max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode)


def avg_pool2d(
    input: Tensor,
    kernel_size: _Pair,
    stride: _Pair | None = None,
    padding: _Pair = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
) -> Tensor:
    """The mean of each window: the sum over the window divided by its size with the
    padding (``count_include_pad``), without it, or by ``divisor_override``, as PyTorch's.

    Raises:
        ShapeError: a wrong ndim, padding over half the kernel, or a kernel larger than the
            padded input.
        DTypeError: a non-floating input."""
    x, was = _batched("avg_pool2d", input)
    attrs = _pool_attrs("avg_pool2d", kernel_size, stride, padding, 1, ceil_mode)
    if divisor_override is not None and (
        isinstance(divisor_override, bool)
        or not isinstance(divisor_override, numbers.Integral)
        or divisor_override == 0
    ):
        raise ValueError(
            f"avg_pool2d(): divisor_override must be a non-zero int, got {divisor_override!r}"
        )
    attrs.update(
        count_include_pad=bool(count_include_pad),
        divisor_override=None if divisor_override is None else int(divisor_override),
    )
    return _unbatched(wrap(apply(_AVG, [x._impl], attrs)[0]), was)


def adaptive_avg_pool2d(
    input: Tensor, output_size: int | tuple[int | None, ...] | list[int | None]
) -> Tensor:
    """The mean over PyTorch's adaptive windows: output row i averages input rows
    [floor(i*H/oh), ceil((i+1)*H/oh)), the same for columns; ``output_size`` an int, a
    pair, or a pair with None (that dim keeps the input's size)."""
    x, was = _batched("adaptive_avg_pool2d", input)
    if isinstance(output_size, (tuple, list)) and len(output_size) == 2:
        output_size = tuple(x.shape[2 + i] if s is None else s for i, s in enumerate(output_size))
    size = _pair("adaptive_avg_pool2d", "output_size", output_size, 0)
    return _unbatched(wrap(apply(_ADAPTIVE, [x._impl], {"output_size": size})[0]), was)


def _fold_attrs(op, kernel_size, dilation, padding, stride) -> dict:
    ph, pw = _pair(op, "padding", padding, 0)
    return {
        "kernel": _pair(op, "kernel_size", kernel_size),
        "stride": _pair(op, "stride", stride),
        "padding": (ph, ph, pw, pw),
        "dilation": _pair(op, "dilation", dilation),
    }


def unfold(
    input: Tensor, kernel_size: _Pair, dilation: _Pair = 1, padding: _Pair = 0, stride: _Pair = 1
) -> Tensor:
    """The sliding blocks of ``input`` (N, C, H, W) or (C, H, W) as columns:
    (N, C*kh*kw, L), L the count of blocks (im2col, conv2d's own)."""
    x, was = _batched("unfold", input)
    attrs = _fold_attrs("unfold", kernel_size, dilation, padding, stride)
    return _unbatched(wrap(apply(_UNFOLD, [x._impl], attrs)[0]), was)


def fold(
    input: Tensor,
    output_size: _Pair,
    kernel_size: _Pair,
    dilation: _Pair = 1,
    padding: _Pair = 0,
    stride: _Pair = 1,
) -> Tensor:
    """The adjoint of unfold: the columns of ``input`` (N, C*kh*kw, L) or (C*kh*kw, L)
    added back at their blocks' places in an (N, C, *output_size) tensor (col2im)."""
    x, was = _batched("fold", input, (2, 3), "(N, C*kh*kw, L) or unbatched (C*kh*kw, L)")
    attrs = _fold_attrs("fold", kernel_size, dilation, padding, stride)
    attrs["output_size"] = _pair("fold", "output_size", output_size)
    return _unbatched(wrap(apply(_FOLD, [x._impl], attrs)[0]), was)


__all__ = [
    "conv2d",
    "conv_transpose2d",
    "max_pool2d",
    "max_pool2d_values",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "unfold",
    "fold",
]
