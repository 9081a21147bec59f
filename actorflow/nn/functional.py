"""The functional forms of the layers and losses (``actorflow.nn.functional``), built on
actorflow's ops, so autograd differentiates them through its rules."""

from __future__ import annotations

from .. import functional as F
from ..creation import arange, rand
from ..errors import ShapeError
from ..tensor.tensor import Tensor

relu = F.relu
tanh = F.tanh
sigmoid = F.sigmoid
gelu = F.gelu
softmax = F.softmax
log_softmax = F.log_softmax


def _tensor(name, x, arg="input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' must be a Tensor, not {type(x).__name__}")
    return x


def linear(input, weight, bias=None):
    """``input @ weight.T + bias``; weight is (out_features, in_features), as PyTorch's."""
    _tensor("linear", input)
    if input.shape[-1:] != weight.shape[1:]:
        raise ShapeError(f"linear: the input's last dim is {input.shape[-1] if input.shape else '-'}"
                         f" (shape {input.shape}) but the weight takes in_features="
                         f"{weight.shape[1]} (weight shape {weight.shape})")
    out = F.matmul(input, weight.T)
    return out if bias is None else F.add(out, bias)


def dropout(input, p: float = 0.5, training: bool = True, inplace: bool = False):
    """Zeroes each element with probability ``p`` and scales the rest by 1/(1-p) while
    training; the identity otherwise. Seeded by ``af.manual_seed``."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return F.mul(input, 0.0)
    keep = F.cast(F.ge(rand(input.shape, dtype=input.dtype, device=input.device), p),
                  input.dtype)
    return F.mul(input, F.mul(keep, 1.0 / (1.0 - p)))


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5):
    """Normalizes over the last ``len(normalized_shape)`` dims (biased variance), then
    scales by ``weight`` and shifts by ``bias``."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if tuple(input.shape[len(input.shape) - len(shape):]) != shape:
        raise ShapeError(f"layer_norm: normalized_shape {shape} must be the last dims of the "
                         f"input, whose shape is {input.shape}")
    dims = tuple(range(len(input.shape) - len(shape), len(input.shape)))
    mu = F.mean(input, dim=dims, keepdim=True)
    xc = F.sub(input, mu)
    var = F.mean(F.mul(xc, xc), dim=dims, keepdim=True)
    y = F.mul(xc, F.pow(F.add(var, eps), -0.5))
    if weight is not None:
        y = F.mul(y, weight)
    if bias is not None:
        y = F.add(y, bias)
    return y


def embedding(input, weight, padding_idx=None):
    """Rows of ``weight`` picked by the integer tensor ``input``; the ``padding_idx`` row
    gets no gradient."""
    _tensor("embedding", input)
    if input.dtype.is_floating_point:
        raise TypeError(f"embedding: indices must be an integer tensor, got {input.dtype}")
    out = weight[input]
    if padding_idx is not None:
        keep = F.cast(F.ne(input, padding_idx), weight.dtype)
        out = F.mul(out, keep.unsqueeze(-1))
    return out


def _reduce(loss, reduction: str, name: str, total=None):
    if reduction == "mean":
        return F.mean(loss) if total is None else F.div(F.sum(loss), total)
    if reduction == "sum":
        return F.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def nll_loss(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """Negative log-likelihood of class indices ``target`` (N,) under log-probabilities
    ``input`` (N, C): ``-input[n, target[n]]``, weighted, ignoring ``ignore_index``."""
    _tensor("nll_loss", input)
    _tensor("nll_loss", target, "target")
    if target.dtype.is_floating_point:
        raise TypeError(f"nll_loss: target must hold class indices (an integer tensor), got "
                        f"{target.dtype}; for probabilities use cross_entropy")
    if input.ndim == 1:
        input, target = input.unsqueeze(0), target.reshape(1)
    if input.ndim != 2 or target.shape != input.shape[:1]:
        raise ShapeError(f"nll_loss: expected input (N, C) and target (N,), got input "
                         f"{input.shape} and target {target.shape}")
    n, c = input.shape
    keep = F.ne(target, ignore_index)
    safe = F.where(keep, target, 0)
    picked = input[arange(n, device=input.device), safe]
    w = F.cast(keep, input.dtype)
    if weight is not None:
        w = F.mul(w, weight[safe])
    loss = F.neg(F.mul(picked, w))
    if reduction == "mean":
        return F.div(F.sum(loss), F.sum(w))
    return _reduce(loss, reduction, "nll_loss")


def cross_entropy(input, target, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0):
    """Cross-entropy of logits ``input`` (N, C) against class indices (N,) or class
    probabilities (N, C); ``log_softmax`` then ``nll_loss``."""
    _tensor("cross_entropy", input)
    _tensor("cross_entropy", target, "target")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got "
                         f"{label_smoothing}")
    logp = F.log_softmax(input, dim=-1)
    if target.dtype.is_floating_point:              # probabilities
        if target.shape != input.shape:
            raise ShapeError(f"cross_entropy: probability targets must have the input's "
                             f"shape {input.shape}, got {target.shape}")
        if label_smoothing:
            target = F.add(F.mul(target, 1.0 - label_smoothing),
                           label_smoothing / input.shape[-1])
        per = F.neg(F.sum(F.mul(logp, target if weight is None else F.mul(target, weight)),
                          dim=-1))
        return _reduce(per, reduction, "cross_entropy")
    loss = nll_loss(logp, target, weight, ignore_index, reduction)
    if not label_smoothing:
        return loss
    if weight is not None:
        raise NotImplementedError("cross_entropy: label_smoothing with class weights is not "
                                  "supported yet")
    smooth = F.neg(F.mean(logp, dim=-1))
    keep = F.cast(F.ne(target, ignore_index), input.dtype)
    smooth = F.mul(smooth, keep)
    if reduction == "mean":
        smooth = F.div(F.sum(smooth), F.sum(keep))
    else:
        smooth = _reduce(smooth, reduction, "cross_entropy")
    return F.add(F.mul(loss, 1.0 - label_smoothing), F.mul(smooth, label_smoothing))


def mse_loss(input, target, reduction: str = "mean"):
    """Mean (or sum) of squared differences; the shapes broadcast."""
    _tensor("mse_loss", input)
    d = F.sub(input, target)
    return _reduce(F.mul(d, d), reduction, "mse_loss")
