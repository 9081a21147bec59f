"""Autograd: ``requires_grad``, ``backward()``, ``.grad``, ``no_grad()``, ``detach()``.

``graph.py`` records a backward node per op call on tensors that require grad (armed by
the first one: until then no op pays anything), ``rules.py`` and ``rules_shape.py`` hold
the grad rule of each op, ``engine.py`` runs backward; the Tensor's autograd methods
(bound by ``actorflow.methods``) are here.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..creation import ones_like
from ..eager import interpreter
from ..functional import cast
from ..sbp import broadcast, layout
from ..tensor import tensor as tensor_module
from ..tensor.tensor import Tensor
from . import rules_conv  # noqa: F401 - registers the convolution and pooling rules
from .engine import run_backward
from .mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .nodes import Meta, Node, record, record_view, use_rules
from .rules import RULES
from .rules_shape import VIEW_RULES

use_rules(RULES, VIEW_RULES)
_ARMED = [False]


def arm() -> None:
    """Makes op calls and views go through the recorder from now on (idempotent)."""
    if not _ARMED[0]:
        tensor_module.GRAD_VIEW[0] = record_view
        interpreter.use_autograd(record)
        _ARMED[0] = True


# -- the Tensor's autograd face (bound by actorflow.methods) ---------------------------------


def requires_grad_(self, requires_grad: bool = True) -> Tensor:
    """Marks a leaf tensor as needing ``.grad`` after ``backward()`` (floating point only)."""
    impl = self._impl
    ag = impl.ag
    if requires_grad:
        if not self.dtype.is_floating_point:
            raise RuntimeError(
                f"only tensors of floating point dtype can require gradients, "
                f"got {self.dtype}; convert with .float() first"
            )
        if ag is None:
            arm()
            impl.ag = Meta()
        elif not ag.requires_grad:
            ag.requires_grad = True
        return self
    if ag is not None and ag.grad_fn is not None:
        raise RuntimeError(
            "requires_grad_(False) on a tensor computed from tensors that "
            "require grad; use .detach() to get one outside autograd"
        )
    if ag is not None:
        ag.requires_grad = False
    return self


def _get_requires_grad(self) -> bool:
    ag = self._impl.ag
    return ag is not None and ag.requires_grad


def _set_requires_grad(self, value: bool) -> None:
    requires_grad_(self, bool(value))


def _get_grad(self) -> Tensor | None:
    ag = self._impl.ag
    return None if ag is None else ag.grad


def _set_grad(self, value: Tensor | None) -> None:
    ag = self._impl.ag
    if value is not None and not isinstance(value, Tensor):
        raise TypeError(f"grad must be a Tensor or None, got {type(value).__name__}")
    if value is not None and value.shape != self.shape:
        raise RuntimeError(
            f"assigned grad has shape {value.shape}, but the tensor has shape {self.shape}"
        )
    if ag is None:
        if value is None:
            return
        arm()
        ag = self._impl.ag = Meta(requires_grad=False)
    ag.grad = value


def _grad_fn(self) -> Node | None:
    ag = self._impl.ag
    return None if ag is None else ag.grad_fn


def _is_leaf(self) -> bool:
    ag = self._impl.ag
    return ag is None or ag.grad_fn is None


def retain_grad(self) -> None:
    """Keeps this non-leaf tensor's gradient in ``.grad`` after ``backward()``."""
    ag = self._impl.ag
    if ag is None or not ag.requires_grad:
        raise RuntimeError("retain_grad() on a tensor that does not require grad")
    if ag.grad_fn is None:
        return  # a leaf keeps its gradient anyway
    node = ag.grad_fn
    if node.retained is None:
        node.retained = {}
    node.retained[ag.output_nr] = ag
    ag.retains_grad = True


def backward(
    self, gradient: Tensor | None = None, retain_graph: bool = False, create_graph: bool = False
) -> None:
    """Computes the gradient of this tensor with respect to the leaves that require grad
    and adds it to their ``.grad``. ``gradient``: d(something)/d(this tensor), needed
    unless it has one element."""
    if create_graph:
        raise NotImplementedError(
            "backward(create_graph=True): gradients of gradients are not supported yet"
        )
    ag = self._impl.ag
    if ag is None or not ag.requires_grad:
        raise RuntimeError(
            "backward(): this tensor does not require grad and has no "
            "grad_fn; nothing it was computed from requires grad (set "
            "requires_grad=True on the parameters, and compute outside "
            "af.no_grad())"
        )
    if gradient is None:
        if self.numel() != 1:
            raise RuntimeError(
                f"backward(): grad can be implicitly created only for "
                f"one-element outputs, and this one has shape {self.shape}; "
                f"pass gradient= (a tensor of that shape) or reduce it first "
                f"(loss.sum() or loss.mean())"
            )
        dev = self._impl.meta.device
        if dev.placed and dev.sbp[0].kind == "P":
            # a partial sum's seed of ones is laid out broadcast (each rank holding 1, not
            # a summand of it): the rules' ops then run where the inputs' parts are
            dev = layout(dev.placement, (broadcast,))
        gradient = ones_like(self, device=dev)
    elif not isinstance(gradient, Tensor) or gradient.shape != self.shape:
        raise RuntimeError(
            f"backward(gradient=...): expected a tensor of shape {self.shape}, "
            f"got {getattr(gradient, 'shape', type(gradient).__name__)}"
        )
    elif gradient.dtype is not self.dtype:
        with no_grad():
            gradient = cast(gradient, self.dtype)
    run_backward([ag], [gradient], retain_graph)


def detach_(self) -> Tensor:
    """Takes this tensor out of autograd in place."""
    if self._impl.base is not None and self._impl.ag is not None:
        raise RuntimeError("detach_() on a view is not supported; use detach()")
    self._impl.ag = None
    return self


def zero_grad(params: Iterable[Tensor], set_to_none: bool = True) -> None:
    """Clears the gradients of ``params`` (``Module.zero_grad``, ``Optimizer.zero_grad``):
    to None, or to zeros in place."""
    for p in params:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            with no_grad():
                p.grad.zero_()


METHODS = {
    "requires_grad_": requires_grad_,
    "requires_grad": property(_get_requires_grad, _set_requires_grad),
    "grad": property(_get_grad, _set_grad),
    "grad_fn": property(_grad_fn),
    "is_leaf": property(_is_leaf),
    "retain_grad": retain_grad,
    "backward": backward,
    "detach_": detach_,
}

__all__ = [
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "is_grad_enabled",
    "Node",
    "Meta",
    "arm",
    "zero_grad",
    "METHODS",
]
