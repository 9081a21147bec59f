"""Module and Parameter, with PyTorch's habits: attributes that are Parameters or Modules
are registered, ``parameters()`` / ``named_parameters()`` walk the tree, ``state_dict()``
/ ``load_state_dict()`` carry the values, ``train()`` / ``eval()`` set the mode, and the
repr prints the tree.

``structure_version[0]`` counts the changes to any module's attributes, parameters, buffers,
children, hooks or mode (one count for the process): ``nn.Graph`` reads it per step and
looks at its modules again only when it moved."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

from .. import functional as F
from ..autograd import no_grad, zero_grad
from ..creation import tensor as _tensor
from ..device import Device
from ..dtype import DType, as_dtype, bfloat16, float16, float32, float64
from ..sbp import Placement, as_sbp, broadcast, layout
from ..tensor.tensor import Tensor


class Parameter(Tensor):
    """A tensor that is a module's parameter: it requires grad, and assigning it to a
    Module attribute registers it. ``Parameter(data)`` shares ``data``'s storage."""

    __slots__ = ()

    def __new__(cls, data: Any = None, requires_grad: bool = True) -> Parameter:
        if data is None:
            data = _tensor([])
        if not isinstance(data, Tensor):
            data = _tensor(data)
        p = Tensor.__new__(cls)
        impl = data._impl
        m = impl.meta
        p._impl = impl.view(m.shape, m.strides, m.offset) if impl.ag is not None else impl
        if requires_grad:
            p.requires_grad_(True)
        return p

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, proto):
        raise TypeError("a Parameter is not pickled; save a state_dict with af.save")

    def __deepcopy__(self, memo):
        """A Parameter holding a copy of the values (and gradient), as PyTorch's."""
        p = Parameter(F.clone(self.detach()), self.requires_grad)
        if self.grad is not None:
            p.grad = F.clone(self.grad)
        memo[id(self)] = p
        return p


structure_version = [0]  # bumped by every change below (see the module doc)


def changed() -> None:
    """Counts a change to what a module holds (see ``structure_version``)."""
    structure_version[0] += 1


class _Registry(OrderedDict):
    """A module's parameters, buffers or children by name: every change to it counts in
    ``structure_version`` (layers that set entries directly, ``Sequential[i] = m``, too)."""

    def __setitem__(self, key, value) -> None:
        OrderedDict.__setitem__(self, key, value)
        changed()

    def __delitem__(self, key) -> None:
        OrderedDict.__delitem__(self, key)
        changed()

    def pop(self, *args):
        changed()
        return OrderedDict.pop(self, *args)

    def popitem(self, last: bool = True):
        changed()
        return OrderedDict.popitem(self, last)

    def clear(self) -> None:
        OrderedDict.clear(self)
        changed()

    def setdefault(self, key, default=None):
        changed()
        return OrderedDict.setdefault(self, key, default)

    def move_to_end(self, key, last: bool = True) -> None:
        OrderedDict.move_to_end(self, key, last)
        changed()


class IncompatibleKeys(NamedTuple):
    missing_keys: list[str]
    unexpected_keys: list[str]


_DTYPE_NAMES = {"float16", "bfloat16", "float32", "float64", "float", "double", "half"}


class Module:
    """The base of every layer and model: subclass it, make the layers in ``__init__``
    (after ``super().__init__()``) and compute in ``forward``; call the module itself."""

    def __init__(self) -> None:
        object.__setattr__(self, "training", True)
        object.__setattr__(self, "_parameters", _Registry())
        object.__setattr__(self, "_buffers", _Registry())
        object.__setattr__(self, "_modules", _Registry())
        object.__setattr__(self, "_forward_hooks", [])
        object.__setattr__(self, "_forward_pre_hooks", [])

    # -- attributes ----------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() is called; "
                f"call super().__init__() first in {type(self).__name__}"
            )
        params, mods, bufs = self._parameters, self._modules, self._buffers
        if name in params and value is not None and not isinstance(value, Parameter):
            raise TypeError(
                f"cannot assign a {type(value).__name__} as parameter {name!r} of "
                f"{type(self).__name__} (a Parameter or None is expected); wrap "
                f"it: nn.Parameter(tensor)"
            )
        if name in mods and value is not None and not isinstance(value, Module):
            raise TypeError(
                f"cannot assign a {type(value).__name__} as child module {name!r} "
                f"of {type(self).__name__} (a Module or None is expected)"
            )
        if name in bufs and value is not None and not isinstance(value, Tensor):
            raise TypeError(
                f"cannot assign a {type(value).__name__} as buffer {name!r} of "
                f"{type(self).__name__} (a Tensor or None is expected)"
            )
        if isinstance(value, Parameter) or name in params:
            mods.pop(name, None)
            bufs.pop(name, None)
            params[name] = value  # (a name already there keeps its place)
        elif isinstance(value, Module) or name in mods:
            params.pop(name, None)
            bufs.pop(name, None)
            mods[name] = value
        elif name in bufs:
            bufs[name] = value
        else:
            object.__setattr__(self, name, value)
            changed()
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            if key in d and name in d[key]:
                return d[key][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                return
        object.__delattr__(self, name)
        changed()

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(
                f"register_parameter({name!r}): expected a Parameter or None, got "
                f"{type(param).__name__}"
            )
        self._parameters[name] = param

    def register_buffer(self, name: str, value: Tensor | None) -> None:
        """A tensor that is state but not a parameter (saved in the state_dict)."""
        self._buffers[name] = value

    def add_module(self, name: str, module: Module | None) -> None:
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"add_module({name!r}): expected a Module, got {type(module).__name__}")
        self._modules[name] = module

    # -- calling -------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} has no forward(); define "
            f"forward(self, ...) to say what it computes"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        for hook in self._forward_pre_hooks:
            r = hook(self, args)
            if r is not None:
                args = r if isinstance(r, tuple) else (r,)
        out = self.forward(*args, **kwargs)
        for hook in self._forward_hooks:
            r = hook(self, args, out)
            if r is not None:
                out = r
        return out

    def register_forward_hook(self, hook: Callable[[Module, tuple[Any, ...], Any], Any]) -> _Handle:
        """``hook(module, args, output)`` after each call (its result, if not None,
        replaces the output); returns a handle whose ``remove()`` takes it off."""
        return _Handle(self._forward_hooks, hook)

    def register_forward_pre_hook(self, hook: Callable[[Module, tuple[Any, ...]], Any]) -> _Handle:
        """``hook(module, args)`` before each call (a non-None result replaces args)."""
        return _Handle(self._forward_pre_hooks, hook)

    # -- walking the tree ----------------------------------------------------------------
    def named_modules(
        self, prefix: str = "", memo: set[int] | None = None
    ) -> Iterator[tuple[str, Module]]:
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def _every_module(self, prefix: str = ""):
        """``(name, module)`` for every name a module is reachable by (a shared module under
        each of its names, as PyTorch's state_dict has it)."""
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m._every_module(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def _named(self, key: str, prefix: str, recurse: bool):
        seen = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, t in getattr(m, key).items():
                if t is None or id(t) in seen:
                    continue
                seen.add(id(t))
                yield (f"{mp}.{name}" if mp else name), t

    def named_parameters(
        self, prefix: str = "", recurse: bool = True
    ) -> Iterator[tuple[str, Parameter]]:
        """``(name, parameter)`` pairs, each parameter once (a shared one under its first
        name), in registration order."""
        return self._named("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        return self._named("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> OrderedDict[str, Tensor]:
        """Every parameter and buffer by dotted name (detached tensors sharing storage)."""
        out: OrderedDict[str, Tensor] = OrderedDict()
        for mp, m in self._every_module():
            for key in ("_parameters", "_buffers"):
                for name, t in getattr(m, key).items():
                    if t is not None:
                        out[f"{mp}.{name}" if mp else name] = t.detach()
        return out

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True
    ) -> IncompatibleKeys:
        """Copies the values of ``state_dict`` into this module's parameters and buffers
        (shapes must match); ``strict``: missing or unexpected keys raise."""
        own = {}
        for mp, m in self._every_module():
            for key in ("_parameters", "_buffers"):
                for name, t in getattr(m, key).items():
                    if t is not None:
                        own[f"{mp}.{name}" if mp else name] = t
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        if strict and (missing or unexpected):
            raise KeyError(
                f"load_state_dict for {type(self).__name__}: missing keys "
                f"{missing}, unexpected keys {unexpected}; pass strict=False to "
                f"load what matches"
            )
        with no_grad():
            for k, t in own.items():
                if k not in state_dict:
                    continue
                v = state_dict[k]
                v = v if isinstance(v, Tensor) else _tensor(v)
                if tuple(v.shape) != tuple(t.shape):
                    raise ValueError(
                        f"load_state_dict: {k!r} has shape {tuple(v.shape)} in "
                        f"the state_dict but {tuple(t.shape)} in the module"
                    )
                F.copy_(t, v)
        return IncompatibleKeys(missing, unexpected)

    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        changed()
        return self

    def eval(self) -> Module:
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        zero_grad(self.parameters(), set_to_none)

    # -- dtype and device ----------------------------------------------------------------
    def to(
        self,
        *args: Any,
        device: Device | str | None = None,
        dtype: DType | str | None = None,
        non_blocking: bool = False,
    ) -> Module:
        """Converts the floating-point parameters and buffers to ``dtype`` and moves every
        one to ``device``, in place (the Parameter objects stay: an optimizer holding them
        sees the new values; a gradient is converted too): ``m.to(af.bfloat16)``,
        ``m.to("cuda:0")``, ``m.to(device, dtype)``, ``m.to(tensor)``, as PyTorch's."""
        for a in args:
            if isinstance(a, DType) or (isinstance(a, str) and a in _DTYPE_NAMES):
                dtype = a
            elif isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            else:
                device = a
        dtype = None if dtype is None else as_dtype(dtype)
        if dtype is not None and not dtype.is_floating_point:
            raise TypeError(
                f"Module.to: only floating point dtypes are allowed, got {dtype}; "
                f"a module's integer buffers keep their dtype"
            )

        def convert(t):
            if dtype is not None and t.dtype.is_floating_point and t.dtype is not dtype:
                t = F.cast(t, dtype)
            return t if device is None else F.to_device(t, device)

        with no_grad():
            for m in self.modules():
                for p in m._parameters.values():
                    if p is None:
                        continue
                    new = convert(p)
                    if new is not p:
                        ag = p._impl.ag
                        p._impl = new._impl
                        p._impl.ag = ag
                        if ag is not None and ag.grad is not None:
                            ag.grad = convert(ag.grad)
                for name, b in list(m._buffers.items()):
                    if b is not None:
                        m._buffers[name] = convert(b)
        changed()
        return self

    def to_global(self, placement: Placement, sbp: Any = None) -> Module:
        """Makes every parameter and buffer a global tensor on ``placement`` laid out as
        ``sbp`` (default ``af.sbp.broadcast``: a full copy on every rank, data
        parallelism's layout), in place as ``to`` does: the Parameter objects stay.

        Example: ``model.to_global(af.placement("cpu", ranks=2))``"""
        return self.to(layout(placement, as_sbp(broadcast if sbp is None else sbp, "to_global")))

    def float(self) -> Module:  # noqa: A003
        return self.to(float32)

    def double(self) -> Module:
        return self.to(float64)

    def half(self) -> Module:
        return self.to(float16)

    def bfloat16(self) -> Module:
        return self.to(bfloat16)

    # -- printing ------------------------------------------------------------------------
    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = []
        extra = self.extra_repr()
        if extra:
            lines = extra.split("\n")
        for name, m in self._modules.items():
            body = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {body}")
        name = type(self).__name__
        if not lines:
            return f"{name}()"
        if len(lines) == 1 and not self._modules:
            return f"{name}({lines[0]})"
        return f"{name}(\n  " + "\n  ".join(lines) + "\n)"


class _Handle:
    def __init__(self, hooks: list[Any], hook: Callable[..., Any]) -> None:
        self.hooks, self.hook = hooks, hook
        hooks.append(hook)
        changed()

    def remove(self) -> None:
        if self.hook in self.hooks:
            self.hooks.remove(self.hook)
            changed()
