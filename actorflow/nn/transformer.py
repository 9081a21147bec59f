"""Attention layers: MultiheadAttention, TransformerEncoderLayer and TransformerEncoder, with
PyTorch's parameter names, shapes, inits, mask conventions and state_dict keys, so weights
load from PyTorch through numpy. Built on ``nn.functional``'s attention (a composition of
ops: autograd, nn.Graph and every device take it as it is)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from .. import functional as F
from ..creation import empty, ones
from ..device import Device
from ..dtype import DType, bool_
from ..errors import ShapeError
from ..tensor.tensor import Tensor
from . import functional as NF
from . import init
from .layers import Dropout, LayerNorm, Linear, ModuleList
from .module import Module, Parameter


def _mask_to_float(mask, dtype):
    """A bool mask (True: masked out) as the float one PyTorch makes of it: -inf there."""
    if mask.dtype is bool_:
        return F.cast(F.where(mask, float("-inf"), 0.0), dtype)
    return mask if mask.dtype is dtype else F.cast(mask, dtype)


def _merged_mask(attn_mask, key_padding_mask, dtype):
    """One mask for ``NF.attention_weights`` from MultiheadAttention's two (True: masked
    out, or float: added): bool when both are bool (True: attend), float otherwise."""
    masks = [m for m in (attn_mask, key_padding_mask) if m is not None]
    if not masks:
        return None
    if all(m.dtype is bool_ for m in masks):
        out = masks[0] if len(masks) == 1 else F.logical_or(*masks)
        return F.logical_not(out)
    floats = [_mask_to_float(m, dtype) for m in masks]
    return floats[0] if len(floats) == 1 else F.add(*floats)


class MultiheadAttention(Module):
    """Attention over ``num_heads`` heads of ``embed_dim // num_heads`` features, as
    PyTorch's: ``in_proj_weight`` (3*embed_dim, embed_dim) (Xavier uniform) and
    ``in_proj_bias`` (zeros) project query, key and value; ``out_proj`` (a Linear, its bias
    zero) the heads' concatenation. Inputs (L, N, E), or (N, L, E) with batch_first, or
    unbatched (L, E).

    Raises: ValueError for an embed_dim not divisible by num_heads; NotImplementedError for
    kdim/vdim other than embed_dim, add_bias_kv or add_zero_attn."""

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Device | str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        super().__init__()
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(
                f"MultiheadAttention: embed_dim and num_heads must be > 0, got "
                f"embed_dim={embed_dim} and num_heads={num_heads}"
            )
        if embed_dim % num_heads:
            raise ValueError(
                f"MultiheadAttention: embed_dim ({embed_dim}) must be divisible "
                f"by num_heads ({num_heads}); each head takes embed_dim // "
                f"num_heads features"
            )
        for name, d in (("kdim", kdim), ("vdim", vdim)):
            if d is not None and d != embed_dim:
                raise NotImplementedError(
                    f"MultiheadAttention: {name}={d} differs from "
                    f"embed_dim={embed_dim}; only keys and values of "
                    f"embed_dim features are supported (project them "
                    f"with a Linear first)"
                )
        if add_bias_kv or add_zero_attn:
            raise NotImplementedError(
                "MultiheadAttention: add_bias_kv and add_zero_attn are not supported"
            )
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"MultiheadAttention: dropout must be in [0, 1], got {dropout}")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kdim = self.vdim = embed_dim
        self._qkv_same_embed_dim = True
        self.bias_k = self.bias_v = None  # (add_bias_kv's, as PyTorch's)
        self.add_zero_attn = False
        self.dropout, self.batch_first = dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = Parameter(empty(3 * embed_dim, embed_dim, dtype=dtype, device=device))
        if bias:
            self.in_proj_bias = Parameter(empty(3 * embed_dim, dtype=dtype, device=device))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype, device=device)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        init.xavier_uniform_(self.in_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)

    def _heads(self, x, k: int):
        """Projection ``k`` (0: query, 1: key, 2: value) of ``x`` split into heads:
        (N, H, L, D), or (H, L, D) unbatched."""
        e = self.embed_dim
        w = self.in_proj_weight[k * e : (k + 1) * e]
        b = None if self.in_proj_bias is None else self.in_proj_bias[k * e : (k + 1) * e]
        y = NF.linear(x, w, b)
        if y.ndim == 2:  # (L, E)
            return y.reshape(y.shape[0], self.num_heads, self.head_dim).permute(1, 0, 2)
        y = y.reshape(y.shape[0], y.shape[1], self.num_heads, self.head_dim)
        return y.permute(0, 2, 1, 3) if self.batch_first else y.permute(1, 2, 0, 3)

    def _self_heads(self, x):
        """Query, key and value of self-attention (all ``x``) split into heads: three
        products with slices of in_proj_weight. (One product with the whole weight, split
        after, is ~5% faster forward but its split's gradient is three scatters into zeros
        of the whole product, summed: measured ~4% slower per training step, transformer
        of width 128, batch 32x64.)"""
        return self._heads(x, 0), self._heads(x, 1), self._heads(x, 2)

    def _check(self, query, key, value, key_padding_mask, attn_mask):
        name = "MultiheadAttention"
        if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
            raise ShapeError(
                f"{name}: query, key and value must all be 3-D (batched) or all "
                f"2-D (unbatched), got {tuple(query.shape)}, {tuple(key.shape)}, "
                f"{tuple(value.shape)}"
            )
        for arg, t in (("query", query), ("key", key), ("value", value)):
            if t.shape[-1] != self.embed_dim:
                raise ShapeError(
                    f"{name}: {arg} must have embed_dim={self.embed_dim} "
                    f"features in its last dim, got shape {tuple(t.shape)}"
                )
        if key.shape[:-1] != value.shape[:-1]:
            raise ShapeError(
                f"{name}: key {tuple(key.shape)} and value {tuple(value.shape)} "
                f"must have the same sequence and batch dims"
            )
        batched = query.ndim == 3
        seq = 1 if self.batch_first and batched else 0
        L, S = query.shape[seq], key.shape[seq]
        N = query.shape[1 - seq] if batched else None
        if batched and key.shape[1 - seq] != N:
            raise ShapeError(
                f"{name}: query {tuple(query.shape)} and key {tuple(key.shape)} "
                f"have different batch sizes"
            )
        if key_padding_mask is not None:
            want = (N, S) if batched else (S,)
            if tuple(key_padding_mask.shape) != want:
                raise ShapeError(
                    f"{name}: key_padding_mask must have shape {want} (batch, "
                    f"source length), got {tuple(key_padding_mask.shape)}"
                )
        if attn_mask is not None:
            wants = [(L, S), ((N if batched else 1) * self.num_heads, L, S)]
            if tuple(attn_mask.shape) not in wants:
                raise ShapeError(
                    f"{name}: attn_mask must have shape {wants[0]} (target "
                    f"length, source length) or {wants[1]} (batch * num_heads, "
                    f"L, S), got {tuple(attn_mask.shape)}"
                )
        return batched, N

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """(output, weights): output of the query's shape; weights (N, L, S) averaged over
        the heads (``average_attn_weights``) or (N, H, L, S), or None when not
        ``need_weights``. Masks: ``key_padding_mask`` (N, S) and ``attn_mask`` (L, S) or
        (N*H, L, S), bool (True: not attended) or float (added). ``is_causal``: the mask is
        the causal one (with no key_padding_mask, computed from the hint; with no attn_mask
        it is made).

        Raises: ShapeError naming the shapes for inputs or masks that do not fit."""
        batched, n = self._check(query, key, value, key_padding_mask, attn_mask)
        if query is key and key is value:
            q, k, v = self._self_heads(query)
        else:
            q, k, v = self._heads(query, 0), self._heads(key, 1), self._heads(value, 2)
        causal = is_causal and key_padding_mask is None
        if causal:
            mask = None
        else:
            if is_causal and attn_mask is None:  # True: not attended
                attn_mask = ones(q.shape[-2], k.shape[-2], dtype=bool_, device=q.device).triu(1)
            if attn_mask is not None and attn_mask.ndim == 3 and batched:
                attn_mask = attn_mask.reshape(n, self.num_heads, *attn_mask.shape[1:])
            if key_padding_mask is not None:  # (N, 1, 1, S) / (S,)
                kp = key_padding_mask
                key_padding_mask = kp.reshape(kp.shape[0], 1, 1, kp.shape[1]) if batched else kp
            mask = _merged_mask(attn_mask, key_padding_mask, q.dtype)
        w = NF.attention_weights(q, k, mask, None, causal, "MultiheadAttention")
        if self.training and self.dropout > 0.0:
            w = NF.dropout(w, self.dropout)
        o = F.matmul(w, v)  # (N, H, L, D)
        if not batched:
            o = o.permute(1, 0, 2).reshape(o.shape[1], self.embed_dim)
        elif self.batch_first:
            o = o.permute(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], self.embed_dim)
        else:
            o = o.permute(2, 0, 1, 3).reshape(o.shape[2], o.shape[0], self.embed_dim)
        out = self.out_proj(o)
        if not need_weights:
            return out, None
        return out, (F.mean(w, dim=-3) if average_attn_weights else w)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"dropout={self.dropout}, batch_first={self.batch_first}"
        )


def _activation_fn(activation):
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if callable(activation):
        return activation
    raise ValueError(
        f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a "
        f"callable, got {activation!r}"
    )


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block (linear1, activation, dropout, linear2),
    each with a residual and a LayerNorm, as PyTorch's: the norm after the residual, or
    before the block with ``norm_first``; submodules ``self_attn``, ``linear1``,
    ``dropout``, ``linear2``, ``norm1``, ``norm2``, ``dropout1``, ``dropout2``."""

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable[[Tensor], Tensor] = "relu",
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Device | str | None = None,
        dtype: DType | str | None = None,
    ) -> None:
        super().__init__()
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **kw
        )
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **kw)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **kw)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **kw)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation_fn(activation)

    def forward(
        self,
        src: Tensor,
        src_mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        """``src`` (L, N, E), (N, L, E) with batch_first, or (L, E); the masks as
        MultiheadAttention's ``attn_mask`` and ``key_padding_mask``."""
        x = src
        if self.norm_first:
            x = F.add(x, self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal))
            return F.add(x, self._ff_block(self.norm2(x)))
        x = self.norm1(F.add(x, self._sa_block(x, src_mask, src_key_padding_mask, is_causal)))
        return self.norm2(F.add(x, self._ff_block(x)))

    def _sa_block(self, x, attn_mask, key_padding_mask, is_causal):
        x = self.self_attn(
            x,
            x,
            x,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout1(x)

    def _ff_block(self, x):
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))


class TransformerEncoder(Module):
    """``num_layers`` deep copies of ``encoder_layer`` applied in turn (``layers.0``...),
    then ``norm`` if given, as PyTorch's."""

    def __init__(
        self,
        encoder_layer: Module,
        num_layers: int,
        norm: Module | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(encoder_layer, Module):
            raise TypeError(
                f"TransformerEncoder: encoder_layer must be a Module, got "
                f"{type(encoder_layer).__name__}"
            )
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(
                f"TransformerEncoder: num_layers must be an int >= 1, got {num_layers!r}"
            )
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        src: Tensor,
        mask: Tensor | None = None,
        src_key_padding_mask: Tensor | None = None,
        is_causal: bool | None = None,
    ) -> Tensor:
        """Each layer on the previous one's output, with the same masks; ``is_causal`` a
        hint that ``mask`` is the causal one (None: no hint)."""
        x = src
        for layer in self.layers:
            x = layer(
                x,
                src_mask=mask,
                src_key_padding_mask=src_key_padding_mask,
                is_causal=bool(is_causal),
            )
        return x if self.norm is None else self.norm(x)
