"""AdamW: Adam's update (``adam.adam_update``) with decoupled weight decay."""

from __future__ import annotations

from .adam import Adam


class AdamW(Adam):
    """Adam with decoupled weight decay: ``p *= 1 - lr * weight_decay`` before the step."""

    decoupled = True

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        amsgrad: bool = False,
        maximize: bool = False,
    ):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize)
