"""The functional forms of the layers and losses (``actorflow.nn.functional``), built on
actorflow's ops, so autograd differentiates them through its rules."""

from __future__ import annotations

import numbers

from .. import functional as F
from ..creation import arange, rand
from ..errors import ShapeError
from ..indexing import class_targets, take
from ..ops.index import Bounds
from ..tensor.tensor import Tensor

relu = F.relu
tanh = F.tanh
sigmoid = F.sigmoid
gelu = F.gelu
softmax = F.softmax
log_softmax = F.log_softmax
conv2d = F.conv2d
conv_transpose2d = F.conv_transpose2d
max_pool2d = F.max_pool2d
avg_pool2d = F.avg_pool2d
adaptive_avg_pool2d = F.adaptive_avg_pool2d
unfold = F.unfold
fold = F.fold


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


_EMBEDDING_FIX = (" (num_embeddings, the weight's first dim; negative indices do not count "
                  "from the end)")


def embedding(input, weight, padding_idx=None):
    """Rows of ``weight`` (num_embeddings, embedding_dim) picked by the integer tensor
    ``input``; the ``padding_idx`` row (negative counts from the end) gets no gradient, its
    values are read as they are.

    Raises: TypeError for indices that are not integers; ValueError for a padding_idx
    outside the weight's rows; IndexOutOfBoundsError (a KernelError at the next sync point:
    the indices' values are known only then) for an index outside [0, num_embeddings), a
    negative one included, as in PyTorch."""
    _tensor("embedding", input)
    _tensor("embedding", weight, "weight")
    if input.dtype.is_floating_point or input.dtype.name == "bool":
        raise TypeError(f"embedding: indices must be an integer tensor (int64 or int32), got "
                        f"{input.dtype}; convert them with .long()")
    if weight.ndim != 2:
        raise ShapeError(f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got "
                         f"shape {weight.shape}")
    n = weight.shape[0]
    out = take(weight, input, Bounds(n, "embedding: index", _EMBEDDING_FIX))
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise ValueError(f"embedding: padding_idx {padding_idx} is outside the {n} "
                             f"embeddings (weight shape {weight.shape}); it must be in "
                             f"[-{n}, {n})")
        keep = F.ne(input, padding_idx % n).unsqueeze(-1)
        out = F.where(keep, out, out.detach())     # the same values, no gradient there
    return out


def _reduce(loss, reduction: str, name: str):
    if reduction == "mean":
        return F.mean(loss)
    if reduction == "sum":
        return F.sum(loss)
    if reduction == "none":
        return loss
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _weighted_mean(loss, w):
    """sum(loss) / sum(w); NaN when every weight is 0 (all targets ignored), with a zero
    gradient then, as in PyTorch, not a NaN one."""
    total = F.sum(w)
    some = F.gt(total, 0)
    return F.where(some, F.div(F.sum(loss), F.where(some, total, 1.0)), float("nan"))


def _class_last(input, target, name: str):
    """Input (N, C, d1, ...) and index target (N, d1, ...) as (M, C) and (M,), and the
    shape a per-element loss has: PyTorch's K-dimensional losses."""
    if input.ndim == 1:                             # one sample: (C,) and a 0-d target
        return input.unsqueeze(0), target.reshape(1), ()
    if target.shape != input.shape[:1] + input.shape[2:]:
        raise ShapeError(f"{name}: expected input (N, C, ...) and target (N, ...) with the "
                         f"same extra dims, got input {input.shape} and target {target.shape}")
    if input.ndim == 2:
        return input, target, target.shape
    c = input.shape[1]
    order = (0,) + tuple(range(2, input.ndim)) + (1,)
    return input.permute(*order).reshape(-1, c), target.reshape(-1), target.shape


def _check_targets(name: str, input, target, weight, ignore_index, reduction: str) -> None:
    """Refuses an input with no class dim, class-index targets of a dtype that holds no
    class indices, an ignore_index that is not an int, a weight not of the classes' count
    and an unknown reduction (the targets' values are checked when the kernel runs: see
    ``indexing.class_targets``)."""
    if input.ndim == 0:
        raise ShapeError(f"{name}: expected input (C,) or (N, C, ...) with a class dim, got a "
                         f"0-d input")
    classes = input.shape[1 if input.ndim >= 2 else 0]
    if target.dtype.is_floating_point or target.dtype.name == "bool":
        raise TypeError(f"{name}: target must hold class indices (an integer tensor), got "
                        f"{target.dtype}"
                        + ("; for probabilities use cross_entropy" if name == "nll_loss"
                           else ""))
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{name}: ignore_index must be an int, got {ignore_index!r}")
    if weight is not None and tuple(weight.shape) != (classes,):
        raise ShapeError(f"{name}: weight must hold one value per class: shape ({classes},) "
                         f"for an input of {classes} classes, got shape {weight.shape}")
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got "
                         f"{reduction!r}")


def _nll(input, target, weight, ignore_index: int, reduction: str, name: str):
    """The loss of ``input`` (M, C) log-probabilities against ``target`` (M,) class
    indices, reduced (unreduced: shape (M,)), and the targets' keep weights (1, or 0 where
    ignored). A target outside [0, C) that is not ignore_index fails the ``class_index``
    kernel, so everything computed from it raises that one error, naming ``name``."""
    n, c = input.shape
    safe, keep = class_targets(target, c, int(ignore_index), input.dtype, name)
    picked = input[arange(n, device=input.device), safe]
    w = keep if weight is None else F.mul(keep, weight[safe])
    loss = F.neg(F.mul(picked, w))
    if reduction == "mean":
        return _weighted_mean(loss, w), keep
    if reduction == "sum":
        return F.sum(loss), keep
    return loss, keep


def nll_loss(input, target, weight=None, ignore_index: int = -100, reduction: str = "mean"):
    """Negative log-likelihood of class indices ``target`` (N,) under log-probabilities
    ``input`` (N, C) (or (N, C, d...) and (N, d...)): ``-input[n, target[n]]``, weighted,
    ignoring ``ignore_index``.

    Raises: TypeError, ShapeError or ValueError for arguments that do not fit (see
    ``_check_targets``); IndexOutOfBoundsError (a KernelError at the next sync point: the
    targets' values are known only then) for a target outside [0, C) that is not
    ignore_index, a negative one included, as in PyTorch."""
    _tensor("nll_loss", input)
    _tensor("nll_loss", target, "target")
    _check_targets("nll_loss", input, target, weight, ignore_index, reduction)
    input, target, shape = _class_last(input, target, "nll_loss")
    loss = _nll(input, target, weight, ignore_index, reduction, "nll_loss")[0]
    return loss.reshape(shape) if reduction == "none" else loss


def cross_entropy(input, target, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0):
    """Cross-entropy of logits ``input`` (N, C) (or (N, C, d...)) against class indices
    (N,) (or (N, d...)) or class probabilities of the input's shape: ``log_softmax`` over
    the class dim, then ``nll_loss``.

    Raises: as ``nll_loss`` for class-index targets (IndexOutOfBoundsError, as a
    KernelError at the next sync point, for a target outside [0, C) that is not
    ignore_index); ShapeError for probability targets not of the input's shape."""
    _tensor("cross_entropy", input)
    _tensor("cross_entropy", target, "target")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got "
                         f"{label_smoothing}")
    cdim = 1 if input.ndim >= 2 else 0
    if target.dtype.is_floating_point:              # probabilities
        if target.shape != input.shape:
            raise ShapeError(f"cross_entropy: probability targets must have the input's "
                             f"shape {input.shape}, got {target.shape}")
        logp = F.log_softmax(input, dim=cdim)
        if label_smoothing:
            target = F.add(F.mul(target, 1.0 - label_smoothing),
                           label_smoothing / input.shape[cdim])
        if weight is not None:
            shape = [1] * input.ndim
            shape[cdim] = input.shape[cdim]
            target = F.mul(target, weight.reshape(tuple(shape)))
        per = F.neg(F.sum(F.mul(logp, target), dim=cdim))
        return _reduce(per, reduction, "cross_entropy")
    _check_targets("cross_entropy", input, target, weight, ignore_index, reduction)
    if label_smoothing and weight is not None:
        raise NotImplementedError("cross_entropy: label_smoothing with class weights is not "
                                  "supported yet")
    logp = F.log_softmax(input, dim=cdim)
    flat, flat_t, shape = _class_last(logp, target, "cross_entropy")
    loss, keep = _nll(flat, flat_t, weight, ignore_index, reduction, "cross_entropy")
    if reduction == "none":
        loss = loss.reshape(shape)
    if not label_smoothing:
        return loss
    smooth = F.mul(F.neg(F.mean(flat, dim=1)), keep)
    if reduction == "mean":
        smooth = _weighted_mean(smooth, keep)
    elif reduction == "none":
        smooth = smooth.reshape(shape)
    else:
        smooth = _reduce(smooth, reduction, "cross_entropy")
    return F.add(F.mul(loss, 1.0 - label_smoothing), F.mul(smooth, label_smoothing))


def mse_loss(input, target, reduction: str = "mean"):
    """Mean (or sum) of squared differences; the shapes broadcast."""
    _tensor("mse_loss", input)
    d = F.sub(input, target)
    return _reduce(F.mul(d, d), reduction, "mse_loss")
