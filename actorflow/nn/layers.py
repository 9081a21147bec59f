"""The layers: Linear, the activations, Softmax/LogSoftmax, Sequential, Dropout,
LayerNorm, BatchNorm1d/2d, GroupNorm, Embedding, Identity, Flatten (PyTorch's parameter
layouts, buffers and default inits)."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import (
    ItemsView,
    Iterable,
    Iterator,
    KeysView,
    Mapping,
    Sequence,
    ValuesView,
)
from typing import Any, NoReturn

from .. import functional as F
from ..autograd import no_grad
from ..creation import empty, ones, tensor, zeros
from ..device import Device
from ..dtype import DType, int64
from ..tensor.tensor import Tensor
from . import functional as NF
from . import init
from .module import Module, Parameter


class Linear(Module):
    """``y = x @ weight.T + bias``; weight (out_features, in_features) and bias drawn from
    U(-1/sqrt(in_features), 1/sqrt(in_features)), as PyTorch's default."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        dtype: DType | str | None = None,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        for name, v in (("in_features", in_features), ("out_features", out_features)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"Linear: {name} must be an int >= 0, got {v!r}")
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(empty(out_features, in_features, dtype=dtype, device=device))
        self.bias = Parameter(empty(out_features, dtype=dtype, device=device)) if bias else None
        if not bias:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features) if self.in_features else 0.0
            init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return NF.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Tanh(Module):
    """Elementwise tanh."""

    def forward(self, x: Tensor) -> Tensor:
        return F.tanh(x)


class Sigmoid(Module):
    """Elementwise logistic sigmoid."""

    def forward(self, x: Tensor) -> Tensor:
        return F.sigmoid(x)


class Identity(Module):
    """Returns its input."""

    def forward(self, x: Tensor) -> Tensor:
        return x


class _InPlaceActivation(Module):
    """An elementwise activation that may write its input (``inplace=True``)."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(_InPlaceActivation):
    """max(x, 0) elementwise; ``inplace=True`` writes the input."""

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(x, inplace=self.inplace)


class SiLU(_InPlaceActivation):
    """x * sigmoid(x) elementwise; ``inplace=True`` writes the input."""

    def forward(self, x: Tensor) -> Tensor:
        return NF.silu(x, inplace=self.inplace)


class GELU(Module):
    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softmax(Module):
    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmax(x, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LogSoftmax(Softmax):
    def forward(self, x: Tensor) -> Tensor:
        return F.log_softmax(x, dim=self.dim)


class Flatten(Module):
    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Tensor) -> Tensor:
        return x.flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Dropout(Module):
    """Zeroes elements with probability ``p`` while training (scaling the rest)."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p, self.inplace = p, inplace

    def forward(self, x: Tensor) -> Tensor:
        return NF.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"


def _affine(module, affine: bool, bias: bool, shape, dtype, device) -> None:
    """A norm layer's ``weight`` (ones) and ``bias`` (zeros) of ``shape``, registered as
    None where ``affine`` (or ``bias``) is off, as PyTorch's."""
    if affine:
        module.weight = Parameter(ones(shape, dtype=dtype, device=device))
        if bias:
            module.bias = Parameter(zeros(shape, dtype=dtype, device=device))
            return
    else:
        module.register_parameter("weight", None)
    module.register_parameter("bias", None)


class LayerNorm(Module):
    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        dtype: DType | str | None = None,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        shape = (
            (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        )
        self.normalized_shape, self.eps = shape, eps
        self.elementwise_affine = elementwise_affine
        _affine(self, elementwise_affine, bias, shape, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        return NF.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        )


class _BatchNorm(Module):
    """Batch norm over the channels (dim 1), as PyTorch's: parameters ``weight`` (ones) and
    ``bias`` (zeros, unless ``bias=False``) when ``affine``; buffers ``running_mean``
    (zeros), ``running_var`` (ones) and ``num_batches_tracked`` (an int64 count) when
    ``track_running_stats``.
    Training normalizes by the batch's statistics and updates the running ones (by
    ``momentum``, or a cumulative average when it is None); eval() uses the running ones
    (or the batch's, without them)."""

    _dims: tuple = ()

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        device: Device | str | None = None,
        dtype: DType | str | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(
                f"{type(self).__name__}: num_features must be an int > 0, got {num_features!r}"
            )
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _affine(self, affine, bias, num_features, dtype, device)
        if track_running_stats:
            self.register_buffer("running_mean", zeros(num_features, dtype=dtype, device=device))
            self.register_buffer("running_var", ones(num_features, dtype=dtype, device=device))
            self.register_buffer("num_batches_tracked", tensor(0, dtype=int64, device=device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with no_grad():
                F.zero_(self.running_mean)
                F.fill_(self.running_var, 1)
                F.zero_(self.num_batches_tracked)

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            with no_grad():
                F.fill_(self.weight, 1)
                if self.bias is not None:
                    F.zero_(self.bias)

    def _check_input_dim(self, x) -> None:
        if x.ndim not in self._dims:
            dims = " or ".join(f"{d}D" for d in self._dims)
            raise ValueError(
                f"{type(self).__name__}: expected {dims} input (got {x.ndim}D "
                f"input of shape {x.shape}); {self._layout}"
            )

    def forward(self, x: Tensor) -> Tensor:
        self._check_input_dim(x)
        factor: float | Tensor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            with no_grad():
                F.add_(self.num_batches_tracked, 1)
            if self.momentum is None:  # cumulative: 1 / batches seen, read as state
                factor = F.div(1.0, F.cast(self.num_batches_tracked, self.running_mean.dtype))
        use_batch = self.training or self.running_mean is None
        track = not self.training or self.track_running_stats
        return NF._batch_norm_with(
            x,
            self.running_mean if track else None,
            self.running_var if track else None,
            self.weight,
            self.bias,
            use_batch,
            factor,
            self.eps,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
            f"affine={self.affine}, bias={self.bias is not None}, "
            f"track_running_stats={self.track_running_stats}"
        )


class BatchNorm1d(_BatchNorm):
    __doc__ = (_BatchNorm.__doc__ or "") + " Input (N, C) or (N, C, L)."
    _dims = (2, 3)
    _layout = "BatchNorm1d takes (N, C) or (N, C, L)"


class BatchNorm2d(_BatchNorm):
    __doc__ = (_BatchNorm.__doc__ or "") + " Input (N, C, H, W)."
    _dims = (4,)
    _layout = "BatchNorm2d takes (N, C, H, W)"


class GroupNorm(Module):
    """Normalizes groups of ``num_channels // num_groups`` channels per sample; ``weight``
    (ones) and ``bias`` (zeros, unless ``bias=False``) per channel when ``affine``, as
    PyTorch's."""

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        device: Device | str | None = None,
        dtype: DType | str | None = None,
        *,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(num_groups, int) or num_groups <= 0 or num_channels % num_groups:
            raise ValueError(
                f"GroupNorm: num_channels ({num_channels}) must be divisible by "
                f"num_groups ({num_groups})"
            )
        self.num_groups, self.num_channels, self.eps, self.affine = (
            num_groups,
            num_channels,
            eps,
            affine,
        )
        _affine(self, affine, bias, num_channels, dtype, device)

    def forward(self, x: Tensor) -> Tensor:
        return NF.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return (
            f"{self.num_groups}, {self.num_channels}, eps={self.eps}, "
            f"affine={self.affine}, bias={self.bias is not None}"
        )


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of ``embedding_dim``, drawn from N(0, 1); the
    ``padding_idx`` row starts at zero and gets no gradient."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        dtype: DType | str | None = None,
        device: Device | str | None = None,
    ) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise ValueError(
                    f"Embedding: padding_idx {padding_idx} is outside the "
                    f"{num_embeddings} embeddings"
                )
            padding_idx %= num_embeddings
        self.padding_idx = padding_idx
        self.weight = Parameter(empty(num_embeddings, embedding_dim, dtype=dtype, device=device))
        init.normal_(self.weight)
        if padding_idx is not None:
            from ..autograd import no_grad

            with no_grad():
                F.zero_(self.weight[padding_idx])

    def forward(self, idx: Tensor) -> Tensor:
        return NF.embedding(idx, self.weight, self.padding_idx)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


class Sequential(Module):
    """Modules called in order; indexable (``seq[0]``, ``seq[1:]``), iterable, ``len``."""

    def __init__(self, *modules: Module | OrderedDict[str, Module]) -> None:
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], OrderedDict):
            for name, entry in modules[0].items():
                self.add_module(name, entry)
        else:
            for i, m in enumerate(modules):
                if not isinstance(m, Module):
                    raise TypeError(f"Sequential: entry {i} is a {type(m).__name__}, not a Module")
                self.add_module(str(i), m)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i: int | slice) -> Module:
        mods = list(self._modules.items())
        if isinstance(i, slice):
            return Sequential(OrderedDict(mods[i]))
        if not -len(mods) <= i < len(mods):
            raise IndexError(f"Sequential index {i} out of range for {len(mods)} modules")
        return mods[i][1]

    def __setitem__(self, i: int, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(
                f"Sequential: entry {i} would be a {type(module).__name__}, not a Module"
            )
        self._modules[list(self._modules)[i]] = module

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def append(self, module: Module) -> Sequential:
        self.add_module(str(len(self._modules)), module)
        return self


class ModuleList(Module):
    """Modules held in a list: registered (their parameters are the list's), indexable,
    iterable, ``append`` / ``extend`` / ``insert``; it has no forward of its own."""

    def __init__(self, modules: Iterable[Module] = ()) -> None:
        super().__init__()
        for m in modules:
            self.append(m)

    def _check(self, m: Any, where: str) -> Module:
        if not isinstance(m, Module):
            raise TypeError(f"ModuleList: {where} is a {type(m).__name__}, not a Module")
        return m

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), self._check(module, "the entry"))
        return self

    def extend(self, modules: Iterable[Module]) -> ModuleList:
        for m in modules:
            self.append(m)
        return self

    def insert(self, index: int, module: Module) -> None:
        mods = list(self._modules.values())
        mods.insert(index, self._check(module, "the entry"))
        self._modules.clear()
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __getitem__(self, i: int | slice) -> Module:
        mods = list(self._modules.values())
        if isinstance(i, slice):
            return ModuleList(mods[i])
        return mods[i]

    def __setitem__(self, i: int, module: Module) -> None:
        key = list(self._modules)[i]
        self._modules[key] = self._check(module, f"entry {i}")

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def forward(self, *args: Any) -> NoReturn:
        raise NotImplementedError("ModuleList has no forward(); iterate over it in yours")


class ModuleDict(Module):
    """Modules held by name: registered, ``d[name]``, ``keys()``, ``items()``..."""

    def __init__(
        self, modules: Mapping[str, Module] | Iterable[tuple[str, Module]] | None = None
    ) -> None:
        super().__init__()
        for name, m in dict(modules or {}).items():
            self[name] = m

    def __getitem__(self, name: str) -> Module:
        return self._modules[name]

    def __setitem__(self, name: str, module: Module) -> None:
        if not isinstance(module, Module):
            raise TypeError(f"ModuleDict: {name!r} is a {type(module).__name__}, not a Module")
        self.add_module(name, module)

    def __contains__(self, name: object) -> bool:
        return name in self._modules

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def keys(self) -> KeysView[str]:
        return self._modules.keys()

    def values(self) -> ValuesView[Module]:
        return self._modules.values()

    def items(self) -> ItemsView[str, Module]:
        return self._modules.items()

    def forward(self, *args: Any) -> NoReturn:
        raise NotImplementedError("ModuleDict has no forward(); pick modules from it in yours")
