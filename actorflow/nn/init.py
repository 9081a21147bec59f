"""Parameter initialisation in place (under no_grad), drawing from ``af.manual_seed``'s
generator: uniform_, normal_, zeros_, ones_, constant_, kaiming_uniform_, xavier_uniform_."""

from __future__ import annotations

import math

from .. import functional as F
from ..autograd import no_grad
from ..creation import rand, randn
from ..tensor.tensor import Tensor


def _fans(t):
    shape = t.shape
    if len(shape) < 2:
        raise ValueError(
            f"fan in and fan out need a tensor with at least 2 dims, got shape {shape}"
        )
    receptive = 1
    for s in shape[2:]:
        receptive *= s
    return shape[1] * receptive, shape[0] * receptive


@no_grad()
def uniform_(t: Tensor, a: float = 0.0, b: float = 1.0) -> Tensor:
    F.copy_(t, F.add(F.mul(rand(t.shape, dtype=t.dtype, device=t.device), b - a), a))
    return t


@no_grad()
def normal_(t: Tensor, mean: float = 0.0, std: float = 1.0) -> Tensor:
    F.copy_(t, F.add(F.mul(randn(t.shape, dtype=t.dtype, device=t.device), std), mean))
    return t


@no_grad()
def constant_(t: Tensor, value: float) -> Tensor:
    F.fill_(t, value)
    return t


def zeros_(t: Tensor) -> Tensor:
    return constant_(t, 0.0)


def ones_(t: Tensor) -> Tensor:
    return constant_(t, 1.0)


def kaiming_uniform_(
    t: Tensor, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Tensor:
    fan_in, fan_out = _fans(t)
    fan = fan_in if mode == "fan_in" else fan_out
    gain = (
        math.sqrt(2.0 / (1 + a * a))
        if nonlinearity == "leaky_relu"
        else (math.sqrt(2.0) if nonlinearity == "relu" else 1.0)
    )
    bound = math.sqrt(3.0) * gain / math.sqrt(fan) if fan else 0.0
    return uniform_(t, -bound, bound)


def xavier_uniform_(t: Tensor, gain: float = 1.0) -> Tensor:
    fan_in, fan_out = _fans(t)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(t, -bound, bound)
