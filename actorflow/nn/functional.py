"""The functional forms of the layers and losses (``actorflow.nn.functional``), built on
actorflow's ops, so autograd differentiates them through its rules."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

from .. import functional as F
from ..autograd import no_grad
from ..creation import ones, rand
from ..dtype import bool_
from ..eager.interpreter import apply
from ..errors import DTypeError, ShapeError
from ..functional.common import broadcasts_to
from ..indexing import class_targets, take
from ..ops import get as op_def
from ..ops.index import Bounds
from ..tensor.tensor import Tensor, wrap

relu = F.relu
tanh = F.tanh
sigmoid = F.sigmoid
gelu = F.gelu
silu = F.silu
softmax = F.softmax
log_softmax = F.log_softmax
pad = F.pad
conv2d = F.conv2d
conv_transpose2d = F.conv_transpose2d
max_pool2d = F.max_pool2d
avg_pool2d = F.avg_pool2d
adaptive_avg_pool2d = F.adaptive_avg_pool2d
unfold = F.unfold
fold = F.fold


# the functions of torch.nn.functional's that this module has (its own, and the ops it
# re-exports); the rest of its names are what it imports to build them
__all__ = [
    "adaptive_avg_pool2d",
    "attention_weights",
    "avg_pool2d",
    "batch_norm",
    "conv2d",
    "conv_transpose2d",
    "cross_entropy",
    "dropout",
    "embedding",
    "fold",
    "gelu",
    "group_norm",
    "layer_norm",
    "linear",
    "log_softmax",
    "max_pool2d",
    "mse_loss",
    "nll_loss",
    "pad",
    "relu",
    "scaled_dot_product_attention",
    "sigmoid",
    "silu",
    "softmax",
    "tanh",
    "unfold",
]


def _tensor(name, x, arg="input") -> Tensor:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}(): argument '{arg}' must be a Tensor, not {type(x).__name__}")
    return x


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias``; weight is (out_features, in_features), as PyTorch's."""
    _tensor("linear", input)
    if input.shape[-1:] != weight.shape[1:]:
        raise ShapeError(
            f"linear: the input's last dim is {input.shape[-1] if input.shape else '-'}"
            f" (shape {input.shape}) but the weight takes in_features="
            f"{weight.shape[1]} (weight shape {weight.shape})"
        )
    lead = None
    if input.ndim > 2 and input.is_contiguous():
        # (..., in) as one (n, in) matrix: one product instead of one per leading index
        # (numpy's matmul loops over them), forward and for the weight's gradient
        lead = input.shape[:-1]
        input = input.reshape(-1, input.shape[-1])
    out = F.matmul(input, weight.T)
    if bias is not None:
        out = F.add(out, bias)
    return out if lead is None else out.reshape(*lead, out.shape[-1])


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Zeroes each element with probability ``p`` and scales the rest by 1/(1-p) while
    training; the identity otherwise. Seeded by ``af.manual_seed``; inside ``nn.Graph``
    drawn anew every step from the graph's own counter-based generator (``nn.graph``)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: p must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return input
    if p == 1.0:
        return F.mul(input, 0.0)
    keep = F.cast(F.ge(rand(input.shape, dtype=input.dtype, device=input.device), p), input.dtype)
    return F.mul(input, F.mul(keep, 1.0 / (1.0 - p)))


_LAYER_NORM = op_def("layer_norm")


def layer_norm(
    input: Tensor,
    normalized_shape: int | Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalizes over the last ``len(normalized_shape)`` dims (biased variance), then
    scales by ``weight`` and shifts by ``bias`` (each of ``normalized_shape``): one op
    (``layer_norm``) with its own backward.

    Raises: ShapeError for a normalized_shape that is not the input's last dims, or a
    weight or bias not of that shape; DTypeError for an integer input, or a weight or bias
    of another dtype than the input's."""
    _tensor("layer_norm", input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(shape) > input.ndim or tuple(input.shape[input.ndim - len(shape) :]) != shape:
        raise ShapeError(
            f"layer_norm: normalized_shape {shape} must be the last dims of the "
            f"input, whose shape is {input.shape}"
        )
    ins = [input._impl] + [t._impl for t in (weight, bias) if t is not None]
    return wrap(
        apply(
            _LAYER_NORM,
            ins,
            {
                "eps": float(eps),
                "dims": len(shape),
                "affine": (weight is not None, bias is not None),
            },
        )[0]
    )


# -- attention -------------------------------------------------------------------------------
# A composition of matmul, where/add, softmax and dropout, not one op with a backward of its
# own: autograd differentiates it through their rules, nn.Graph traces it and the cuda
# device runs it, with nothing new, and it is the faster of the two here. Measured forward +
# backward, causal, float32, batch 32, 4 heads, context 64 (2 shared cores, best of 3x30):
# head dim 16: this 6.6-7.0 ms, the same math as one numpy function (what a single op's
# kernel and backward would run) 10-20 ms, PyTorch's CPU kernel 1.5 ms; head dim 32: 7.9-8.3,
# 13-17 and 2.0-2.4 ms. The composition wins over one op because the VM cuts the
# (B, H, L, S) elementwise steps into slices for its workers; PyTorch's lead is its fused,
# vectorised kernel. Nearly half the time was softmax (numpy's max and sum over rows of 64),
# before its last-dim fast path and one-op backward (ops/nn.py: ~3x less for both).


def attention_weights(
    query: Tensor,
    key: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    is_causal: bool = False,
    name: str = "attention",
) -> Tensor:
    """softmax(query @ key^T * scale + mask) over the last dim, shape (..., L, S): the
    weights ``scaled_dot_product_attention`` and ``MultiheadAttention`` multiply the values
    by. ``mask``: None, bool (True: attend) or float (added), broadcast to (..., L, S).
    A row that may attend to nothing gets weights 0 (PyTorch's safe softmax), never NaN,
    in the values and in the gradients.

    Raises: ShapeError naming the shapes for a mask that does not broadcast."""
    L, S = query.shape[-2], key.shape[-2]
    scores = F.matmul(
        F.mul(query, 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale),
        key.transpose(-2, -1),
    )
    if is_causal and mask is None:
        mask = ones(L, S, dtype=bool_, device=query.device).tril()
    if mask is None:
        return F.softmax(scores, dim=-1)
    if not broadcasts_to(mask.shape, scores.shape):
        raise ShapeError(
            f"{name}: the mask's shape {tuple(mask.shape)} does not broadcast to "
            f"the attention weights' shape {tuple(scores.shape)} (batch..., L, "
            f"S) for query {tuple(query.shape)} and key {tuple(key.shape)}; give "
            f"a mask of shape (L, S) = ({L}, {S}) or one with the batch dims"
        )
    if is_causal:  # a causal row always keeps its first key
        # added as 0 / -inf (the (L, S) mask made once): the add's gradient is the scores'
        # as it is (softmax's is 0 where masked), where a where's is one more select
        if mask.dtype is bool_:
            mask = F.where(mask, 0.0, -math.inf)
        if mask.dtype is not scores.dtype:
            mask = F.cast(mask, scores.dtype)
        return F.softmax(F.add(scores, mask), dim=-1)
    if mask.dtype is bool_:
        # a row with nothing to attend to attends to everything here, then is zeroed: no
        # -inf row reaches softmax (its NaN would reach the gradients too); the test is on
        # the mask's own (small) shape
        dead = F.logical_not(F.gt(F.amax(F.cast(mask, scores.dtype), dim=-1, keepdim=True), 0))
        w = F.softmax(F.where(F.logical_or(mask, dead), scores, -math.inf), dim=-1)
    else:
        if mask.dtype is not scores.dtype:
            mask = F.cast(mask, scores.dtype)
        dead = F.eq(F.amax(mask, dim=-1, keepdim=True), -math.inf)
        w = F.softmax(F.add(scores, F.where(dead, 0.0, mask)), dim=-1)
    return F.where(dead, 0.0, w)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:
    """``softmax(query @ key^T * scale + mask) @ value``, as PyTorch's: query (..., L, E),
    key (..., S, E), value (..., S, Ev) -> (..., L, Ev), the leading (batch, head) dims
    broadcast. ``attn_mask``: bool (True: may attend) or float (added to the scores),
    broadcast to (..., L, S); ``is_causal``: position i attends to keys 0..i (no attn_mask
    then); ``scale``: 1/sqrt(E) when None; ``dropout_p``: dropout on the weights (always
    applied when > 0, as PyTorch's: pass 0.0 in eval), seeded by ``af.manual_seed``. A
    query row that may attend to nothing gives zeros.

    Raises: ShapeError for shapes that do not fit (naming them); ValueError for
    is_causal with an attn_mask, or a dropout_p outside [0, 1]; NotImplementedError for
    enable_gqa=True."""
    name = "scaled_dot_product_attention"
    for arg, t in (("query", query), ("key", key), ("value", value)):
        _tensor(name, t, arg)
        if t.ndim < 2:
            raise ShapeError(
                f"{name}: {arg} needs at least 2 dims (..., seq, features), got "
                f"shape {tuple(t.shape)}"
            )
    if enable_gqa:
        raise NotImplementedError(
            f"{name}: enable_gqa=True (grouped query attention) is not "
            f"supported; repeat the key and value heads to the query's"
        )
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise ShapeError(
            f"{name}: query (..., L, E), key (..., S, E) and value (..., S, Ev) "
            f"must agree on E and S, got query {tuple(query.shape)}, key "
            f"{tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if is_causal and attn_mask is not None:
        raise ValueError(
            f"{name}: give either attn_mask or is_causal=True, not both (a "
            f"causal mask is made from is_causal)"
        )
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"{name}: dropout_p must be in [0, 1], got {dropout_p}")
    if attn_mask is not None:
        _tensor(name, attn_mask, "attn_mask")
        if attn_mask.dtype is not bool_ and not attn_mask.dtype.is_floating_point:
            raise DTypeError(
                f"{name}: attn_mask must be bool (True: attend) or floating "
                f"point (added to the scores), got {attn_mask.dtype}"
            )
    w = attention_weights(query, key, attn_mask, scale, is_causal, name)
    if dropout_p > 0.0:
        w = dropout(w, dropout_p)
    return F.matmul(w, value)


_EMBEDDING_FIX = (
    " (num_embeddings, the weight's first dim; negative indices do not count from the end)"
)


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
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
        raise TypeError(
            f"embedding: indices must be an integer tensor (int64 or int32), got "
            f"{input.dtype}; convert them with .long()"
        )
    if weight.ndim != 2:
        raise ShapeError(
            f"embedding: weight must be 2-D (num_embeddings, embedding_dim), got "
            f"shape {weight.shape}"
        )
    n = weight.shape[0]
    out = take(weight, input, Bounds(n, "embedding: index", _EMBEDDING_FIX))
    if padding_idx is not None:
        if not -n <= padding_idx < n:
            raise ValueError(
                f"embedding: padding_idx {padding_idx} is outside the {n} "
                f"embeddings (weight shape {weight.shape}); it must be in "
                f"[-{n}, {n})"
            )
        keep = F.ne(input, padding_idx % n).unsqueeze(-1)
        out = F.where(keep, out, out.detach())  # the same values, no gradient there
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
    if input.ndim == 1:  # one sample: (C,) and a 0-d target
        return input.unsqueeze(0), target.reshape(1), ()
    if target.shape != input.shape[:1] + input.shape[2:]:
        raise ShapeError(
            f"{name}: expected input (N, C, ...) and target (N, ...) with the "
            f"same extra dims, got input {input.shape} and target {target.shape}"
        )
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
        raise ShapeError(
            f"{name}: expected input (C,) or (N, C, ...) with a class dim, got a 0-d input"
        )
    classes = input.shape[1 if input.ndim >= 2 else 0]
    if target.dtype.is_floating_point or target.dtype.name == "bool":
        raise TypeError(
            f"{name}: target must hold class indices (an integer tensor), got "
            f"{target.dtype}"
            + ("; for probabilities use cross_entropy" if name == "nll_loss" else "")
        )
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{name}: ignore_index must be an int, got {ignore_index!r}")
    if weight is not None and tuple(weight.shape) != (classes,):
        raise ShapeError(
            f"{name}: weight must hold one value per class: shape ({classes},) "
            f"for an input of {classes} classes, got shape {weight.shape}"
        )
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _nll(input, target, weight, ignore_index: int, reduction: str, name: str):
    """The loss of ``input`` (M, C) log-probabilities against ``target`` (M,) class
    indices, reduced (unreduced: shape (M,)), and the targets' keep weights (1, or 0 where
    ignored). A target outside [0, C) that is not ignore_index fails the ``class_index``
    kernel, so everything computed from it raises that one error, naming ``name``."""
    n, c = input.shape
    safe, keep = class_targets(target, c, int(ignore_index), input.dtype, name)
    # each row's target class, picked along dim 1 (a gather: row by row, so a batch split
    # over ranks picks on each rank without moving a row)
    picked = F.gather(input, 1, safe.reshape(n, 1)).reshape(n)
    w = keep if weight is None else F.mul(keep, weight[safe])
    loss = F.neg(F.mul(picked, w))
    if reduction == "mean":
        return _weighted_mean(loss, w), keep
    if reduction == "sum":
        return F.sum(loss), keep
    return loss, keep


def nll_loss(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> Tensor:
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


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross-entropy of logits ``input`` (N, C) (or (N, C, d...)) against class indices
    (N,) (or (N, d...)) or class probabilities of the input's shape: ``log_softmax`` over
    the class dim, then ``nll_loss``.

    Raises: as ``nll_loss`` for class-index targets (IndexOutOfBoundsError, as a
    KernelError at the next sync point, for a target outside [0, C) that is not
    ignore_index); ShapeError for probability targets not of the input's shape."""
    _tensor("cross_entropy", input)
    _tensor("cross_entropy", target, "target")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    cdim = 1 if input.ndim >= 2 else 0
    if target.dtype.is_floating_point:  # probabilities
        if target.shape != input.shape:
            raise ShapeError(
                f"cross_entropy: probability targets must have the input's "
                f"shape {input.shape}, got {target.shape}"
            )
        logp = F.log_softmax(input, dim=cdim)
        if label_smoothing:
            target = F.add(
                F.mul(target, 1.0 - label_smoothing), label_smoothing / input.shape[cdim]
            )
        if weight is not None:
            shape = [1] * input.ndim
            shape[cdim] = input.shape[cdim]
            target = F.mul(target, weight.reshape(tuple(shape)))
        per = F.neg(F.sum(F.mul(logp, target), dim=cdim))
        return _reduce(per, reduction, "cross_entropy")
    _check_targets("cross_entropy", input, target, weight, ignore_index, reduction)
    if label_smoothing and weight is not None:
        raise NotImplementedError(
            "cross_entropy: label_smoothing with class weights is not supported yet"
        )
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


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Mean (or sum) of squared differences; the shapes broadcast."""
    _tensor("mse_loss", input)
    d = F.sub(input, target)
    return _reduce(F.mul(d, d), reduction, "mse_loss")


# -- normalization -----------------------------------------------------------------------------

_BATCH_NORM = op_def("batch_norm")


def _channels(name: str, input) -> int:
    if input.ndim < 2:
        raise ShapeError(
            f"{name}: expected an input (N, C) or (N, C, ...) with the channels "
            f"in dim 1, got shape {input.shape}"
        )
    return input.shape[1]


def _check_per_channel(name: str, arg: str, t, input, c: int) -> None:
    if t is not None and tuple(t.shape) != (c,):
        raise ShapeError(
            f"{name}: the input has {c} channels (shape {input.shape}, channels "
            f"in dim 1) but {arg} has shape {tuple(t.shape)}: one value per "
            f"channel, shape ({c},), is expected; make the layer with "
            f"num_features={c} or feed it inputs of {t.shape[0] if t.ndim else 1} "
            f"channels"
        )


def _per_channel(t, ndim: int):
    """A (C,) tensor shaped to broadcast over (N, C, ...)."""
    return t.reshape((1, t.shape[0]) + (1,) * (ndim - 2))


def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Normalizes each channel (dim 1) of ``input`` (N, C, ...), then scales by ``weight``
    and shifts by ``bias``, as PyTorch. Training (or with no running statistics): by the
    batch's mean and biased variance over every dim but the channels', and the running
    ones (when given) are updated in place: ``running = (1 - momentum) * running +
    momentum * batch``, the unbiased variance into ``running_var``. Otherwise: by
    ``running_mean`` and ``running_var``.

    Raises:
        ShapeError: an input with no channel dim, or statistics, weight or bias not of one
            value per channel (the message names both shapes).
        ValueError: training on one value per channel (a batch of one, nothing spatial),
            whose variance is undefined, as PyTorch refuses."""
    _tensor("batch_norm", input)
    if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
        raise TypeError(
            f"batch_norm: momentum must be a float, got {momentum!r} (None, the "
            f"cumulative average, is the BatchNorm layers' own)"
        )
    return _batch_norm_with(
        input, running_mean, running_var, weight, bias, training, float(momentum), eps
    )


def _batch_norm_with(
    input, running_mean, running_var, weight, bias, training: bool, factor, eps: float
):
    """``batch_norm`` whose momentum ``factor`` may be a 0-d tensor (the layers'
    cumulative average: 1 / num_batches_tracked, a value a traced step reads as state)."""
    c = _channels("batch_norm", input)
    for arg, t in (
        ("running_mean", running_mean),
        ("running_var", running_var),
        ("weight", weight),
        ("bias", bias),
    ):
        _check_per_channel("batch_norm", arg, t, input, c)
    if (running_mean is None) != (running_var is None):
        raise ValueError("batch_norm: pass both running_mean and running_var, or neither")
    if not training and running_mean is not None:
        scale = F.rsqrt(F.add(running_var, eps))
        if weight is not None:
            scale = F.mul(scale, weight)
        shift = F.neg(F.mul(running_mean, scale))
        if bias is not None:
            shift = F.add(shift, bias)
        return F.add(F.mul(input, _per_channel(scale, input.ndim)), _per_channel(shift, input.ndim))
    n = input.numel() // c if c else 0
    if training and n <= 1:
        raise ValueError(
            f"batch_norm: expected more than 1 value per channel when training, "
            f"got input of shape {input.shape} ({n} per channel); use a batch "
            f"of 2 or more, or eval() mode"
        )
    ins = [input._impl] + [t._impl for t in (weight, bias) if t is not None]
    y, mean, var = apply(
        _BATCH_NORM, ins, {"eps": float(eps), "affine": (weight is not None, bias is not None)}
    )
    if training and running_mean is not None:
        with no_grad():
            mean, var = wrap(mean), F.mul(wrap(var), n / (n - 1))
            keep = F.sub(1.0, factor) if isinstance(factor, Tensor) else 1.0 - factor
            for run, batch in ((running_mean, mean), (running_var, var)):
                new = F.add(F.mul(run, keep), F.mul(batch, factor))
                F.copy_(run, new)
    return wrap(y)


def group_norm(
    input: Tensor,
    num_groups: int,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Normalizes each group of ``num_groups`` consecutive channels of ``input`` (N, C, ...)
    by its mean and biased variance (per sample), then scales by ``weight`` and shifts by
    ``bias`` (per channel), as PyTorch.

    Raises: ShapeError for a channel count ``num_groups`` does not divide or a weight or
    bias not of one value per channel."""
    _tensor("group_norm", input)
    c = _channels("group_norm", input)
    if (
        isinstance(num_groups, bool)
        or not isinstance(num_groups, int)
        or num_groups <= 0
        or c % num_groups
    ):
        raise ShapeError(
            f"group_norm: num_groups={num_groups!r} must be an int > 0 that "
            f"divides the {c} channels (input shape {input.shape})"
        )
    for arg, t in (("weight", weight), ("bias", bias)):
        _check_per_channel("group_norm", arg, t, input, c)
    shape = input.shape
    dtype = input.dtype
    low = dtype.name in ("float16", "bfloat16")  # statistics in float32, as PyTorch
    x = (F.cast(input, "float32") if low else input).reshape(shape[0], num_groups, -1)
    mu = F.mean(x, dim=2, keepdim=True)
    xc = F.sub(x, mu)
    var = F.mean(F.mul(xc, xc), dim=2, keepdim=True)
    y = F.mul(xc, F.rsqrt(F.add(var, eps))).reshape(shape)
    if weight is not None:
        y = F.mul(y, _per_channel(F.cast(weight, "float32") if low else weight, len(shape)))
    if bias is not None:
        y = F.add(y, _per_channel(F.cast(bias, "float32") if low else bias, len(shape)))
    return F.cast(y, dtype) if low else y
