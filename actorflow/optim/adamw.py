"""AdamW: Adam's update (``adam.adam_update``) with decoupled weight decay."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .adam import Adam

if TYPE_CHECKING:
    from .optimizer import ParamsT


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p *= 1 - lr * weight_decay`` before the step."""

    decoupled = True

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        maximize: bool = False,
    ) -> None:
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
