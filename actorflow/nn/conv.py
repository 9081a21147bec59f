"""The convolution and pooling layers: Conv2d, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d
(PyTorch's arguments, attributes, parameter layouts and default init, so a state_dict
moves between the two through numpy)."""

from __future__ import annotations

import math

from ..creation import empty
from ..device import Device
from ..dtype import DType
from ..tensor.tensor import Tensor
from . import functional as NF
from . import init
from .module import Module, Parameter


def _pair(v: int | tuple[int, ...] | list[int]) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (tuple, list)) else (v, v)


class Conv2d(Module):
    """A 2-D convolution over (N, C, H, W) or (C, H, W): weight (out_channels,
    in_channels/groups, kh, kw) from kaiming_uniform(a=sqrt(5)) and bias (out_channels,)
    from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = in_channels/groups*kh*kw, as
    PyTorch's.

    Raises:
        ValueError: channels not divisible by groups, an unknown padding string, or
            padding='same' with a stride.
        NotImplementedError: a padding_mode other than 'zeros'."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        device: Device | str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        super().__init__()
        if groups <= 0:
            raise ValueError(f"Conv2d: groups must be a positive integer, got {groups}")
        if in_channels % groups:
            raise ValueError(
                f"Conv2d: in_channels ({in_channels}) must be divisible by groups ({groups})"
            )
        if out_channels % groups:
            raise ValueError(
                f"Conv2d: out_channels ({out_channels}) must be divisible by groups ({groups})"
            )
        if padding_mode not in ("zeros", "reflect", "replicate", "circular"):
            raise ValueError(
                f"Conv2d: padding_mode must be one of 'zeros', 'reflect', "
                f"'replicate' or 'circular', got {padding_mode!r}"
            )
        if padding_mode != "zeros":
            raise NotImplementedError(
                f"Conv2d: padding_mode={padding_mode!r} is not supported "
                f"yet; only 'zeros' is (pad the input yourself and pass "
                f"padding=0)"
            )
        if isinstance(padding, str):
            if padding not in ("valid", "same"):
                raise ValueError(
                    f"Conv2d: padding must be 'valid', 'same', an int or a pair, got {padding!r}"
                )
            if padding == "same" and _pair(stride) != (1, 1):
                raise ValueError("Conv2d: padding='same' is not supported for strided convolutions")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = _pair(kernel_size), _pair(stride)
        self.padding = padding if isinstance(padding, str) else _pair(padding)
        self.dilation, self.groups = _pair(dilation), groups
        self.padding_mode = padding_mode
        self.output_padding, self.transposed = (0, 0), False
        self.weight = Parameter(
            empty(
                out_channels, in_channels // groups, *self.kernel_size, dtype=dtype, device=device
            )
        )
        if bias:
            self.bias = Parameter(empty(out_channels, dtype=dtype, device=device))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_channels // self.groups * self.kernel_size[0] * self.kernel_size[1]
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return NF.conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )

    def extra_repr(self) -> str:
        s = (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}"
        )
        if self.padding != (0, 0):
            s += f", padding={self.padding}"
        if self.dilation != (1, 1):
            s += f", dilation={self.dilation}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        return s


class MaxPool2d(Module):
    """The maximum of each window; ``return_indices`` also gives where it was (flat per
    plane, PyTorch's indices). ``stride`` defaults to ``kernel_size``."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        return_indices: bool = False,
        ceil_mode: bool = False,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        return NF.max_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            ceil_mode=self.ceil_mode,
            return_indices=self.return_indices,
        )

    def extra_repr(self) -> str:
        return (
            f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
            f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"
        )


class AvgPool2d(Module):
    """The mean of each window (``count_include_pad``, ``divisor_override`` as PyTorch's);
    ``stride`` defaults to ``kernel_size``."""

    def __init__(
        self,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] | None = None,
        padding: int | tuple[int, int] = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
    ) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride if stride is not None else kernel_size
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x: Tensor) -> Tensor:
        return NF.avg_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """The mean over windows that cut the input into ``output_size`` (an int, a pair, or a
    pair with None: that dim keeps the input's size)."""

    def __init__(self, output_size: int | tuple[int | None, int | None]) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Tensor) -> Tensor:
        return NF.adaptive_avg_pool2d(x, self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
