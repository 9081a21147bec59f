"""Learning-rate schedules with PyTorch's formulas, step for step: ``StepLR``,
``MultiStepLR``, ``CosineAnnealingLR``, ``OneCycleLR``, ``LambdaLR``, ``LinearLR`` and
``SequentialLR`` on the ``LRScheduler`` base.

A scheduler writes each parameter group's ``lr`` (and OneCycleLR its ``momentum`` or
``betas[0]``) as a Python float, computed as PyTorch computes it (the chainable form from
the group's current value where PyTorch uses it, the closed form where it does), so the
rates are the same floats as PyTorch's. An ``nn.Graph`` step reads those options as state
(``Optimizer.graph_rates``): stepping a scheduler compiles nothing anew; a ``run()`` reads
them when it starts, so a schedule steps between runs (per epoch), or, given to
``nn.Graph.add_optimizer(opt, lr_sch=...)``, per batch inside a run (the graph steps it).
"""

from __future__ import annotations

import math
import types
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .optimizer import Optimizer


class LRScheduler:
    """The base: ``step()`` moves ``last_epoch`` on and writes each group's ``lr`` from
    ``get_lr()``; ``get_last_lr()`` the rates written last; ``state_dict()`` every
    attribute but the optimizer, as PyTorch's.

    Args:
        optimizer: an actorflow optimizer.
        last_epoch: the index of the last epoch when resuming (-1: a fresh start, which
            records each group's ``lr`` as its ``initial_lr``).

    Raises:
        TypeError: ``optimizer`` is not an optimizer.
        KeyError: resuming (``last_epoch >= 0``) with a group that has no ``initial_lr``.
    """

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        _check_optimizer(type(self).__name__, optimizer)
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"{type(self).__name__}: param_groups[{i}] has no "
                        f"'initial_lr' while resuming with last_epoch="
                        f"{last_epoch}; load the optimizer's state_dict first, or "
                        f"start with last_epoch=-1"
                    )
        self.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        """The step a scheduler takes when made (``last_epoch`` -1 -> 0)."""
        self._step_count = 0
        self._is_initial = True
        try:
            self.step()
        finally:
            self._is_initial = False

    def get_lr(self) -> list[float]:
        """Each group's rate for ``last_epoch`` (the scheduler's formula)."""
        raise NotImplementedError

    def get_last_lr(self) -> list[float]:
        """The rates the last ``step()`` wrote, one per parameter group."""
        return self._last_lr

    def step(self, epoch: int | None = None) -> None:
        """Moves to the next epoch (or to ``epoch``, with the closed form where there is
        one, as PyTorch's deprecated ``step(epoch)``) and writes each group's ``lr``. Call
        it after ``optimizer.step()``."""
        self._step_count += 1
        self._update_lr(epoch)

    def _update_lr(self, epoch: int | None = None) -> None:
        if epoch is None:
            self.last_epoch += 1
            values = self.get_lr()
        else:
            self.last_epoch = epoch
            closed = getattr(self, "_get_closed_form_lr", None)
            values = closed() if closed is not None else self.get_lr()
        for group, lr in zip(self.optimizer.param_groups, values, strict=True):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def _current(self) -> list:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Every attribute but the optimizer (PyTorch's keys)."""
        return {k: v for k, v in self.__dict__.items() if k != "optimizer"}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Takes what ``state_dict()`` gave."""
        self.__dict__.update(state_dict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(last_epoch={self.last_epoch}, lr={self._last_lr})"


def _check_optimizer(name: str, optimizer) -> None:
    if not (hasattr(optimizer, "param_groups") and hasattr(optimizer, "graph_state")):
        raise TypeError(
            f"{name}: {type(optimizer).__name__} is not an Optimizer; give an "
            f"actorflow optimizer (af.optim.SGD(...), ...)"
        )


def _per_group(name: str, optimizer, value) -> list:
    """``value`` per parameter group: a list or tuple of one per group, or one for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != len(optimizer.param_groups):
            raise ValueError(
                f"expected {len(optimizer.param_groups)} values for {name} (one "
                f"per parameter group), got {len(value)}"
            )
        return list(value)
    return [value] * len(optimizer.param_groups)


class LambdaLR(LRScheduler):
    """``lr = initial_lr * lr_lambda(epoch)``; ``lr_lambda`` one function, or a list of one
    per group."""

    def __init__(
        self,
        optimizer: Optimizer,
        lr_lambda: Callable[[int], float]
        | list[Callable[[int], float]]
        | tuple[Callable[[int], float], ...],
        last_epoch: int = -1,
    ) -> None:
        self.optimizer = optimizer
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != len(optimizer.param_groups):
                raise ValueError(
                    f"LambdaLR: expected {len(optimizer.param_groups)} "
                    f"lr_lambdas (one per parameter group), got {len(lr_lambda)}"
                )
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * len(optimizer.param_groups)
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        return [
            base * f(self.last_epoch)
            for f, base in zip(self.lr_lambdas, self.base_lrs, strict=True)
        ]

    def state_dict(self) -> dict[str, Any]:
        """As the base's, each lambda as None (a function) or its ``__dict__`` (a callable
        object's), as PyTorch's."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "lr_lambdas")}
        out["lr_lambdas"] = [
            None if isinstance(f, types.FunctionType) else dict(f.__dict__) for f in self.lr_lambdas
        ]
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        lambdas = state_dict.pop("lr_lambdas")
        self.__dict__.update(state_dict)
        for f, saved in zip(self.lr_lambdas, lambdas, strict=True):
            if saved is not None:
                f.__dict__.update(saved)


class StepLR(LRScheduler):
    """The rate times ``gamma`` every ``step_size`` epochs."""

    def __init__(
        self, optimizer: Optimizer, step_size: int, gamma: float = 0.1, last_epoch: int = -1
    ) -> None:
        self.step_size = step_size
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0 or self.last_epoch % self.step_size != 0:
            return self._current()
        return [lr * self.gamma for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        return [base * self.gamma ** (self.last_epoch // self.step_size) for base in self.base_lrs]


class MultiStepLR(LRScheduler):
    """The rate times ``gamma`` at each of ``milestones`` (epochs; one listed twice counts
    twice)."""

    def __init__(
        self,
        optimizer: Optimizer,
        milestones: Iterable[int],
        gamma: float = 0.1,
        last_epoch: int = -1,
    ) -> None:
        self.milestones = Counter(milestones)
        self.gamma = gamma
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch not in self.milestones:
            return self._current()
        return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._current()]

    def _get_closed_form_lr(self) -> list:
        milestones = sorted(self.milestones.elements())
        return [
            base * self.gamma ** bisect_right(milestones, self.last_epoch) for base in self.base_lrs
        ]


class LinearLR(LRScheduler):
    """The rate scaled by a factor going linearly from ``start_factor`` to ``end_factor``
    over ``total_iters`` epochs, then kept.

    Raises:
        ValueError: ``start_factor`` not in (0, 1] or ``end_factor`` not in [0, 1]."""

    def __init__(
        self,
        optimizer: Optimizer,
        start_factor: float = 1.0 / 3,
        end_factor: float = 1.0,
        total_iters: int = 5,
        last_epoch: int = -1,
    ) -> None:
        if not 0 < start_factor <= 1.0:
            raise ValueError(f"LinearLR: start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1.0:
            raise ValueError(f"LinearLR: end_factor must be in [0, 1], got {end_factor}")
        self.start_factor = start_factor
        self.end_factor = end_factor
        self.total_iters = total_iters
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        if self.last_epoch == 0:
            return [lr * self.start_factor for lr in self._current()]
        if self._is_initial or self.last_epoch > self.total_iters:
            return self._current()
        d = self.end_factor - self.start_factor
        return [
            lr * (1.0 + d / (self.total_iters * self.start_factor + (self.last_epoch - 1) * d))
            for lr in self._current()
        ]

    def _get_closed_form_lr(self) -> list:
        return [
            base
            * (
                self.start_factor
                + (self.end_factor - self.start_factor)
                * min(self.total_iters, self.last_epoch)
                / self.total_iters
            )
            for base in self.base_lrs
        ]


class CosineAnnealingLR(LRScheduler):
    """Cosine annealing from the initial rate to ``eta_min`` over ``T_max`` epochs (and back
    up over the next ``T_max``), in PyTorch's recursive form."""

    def __init__(
        self,
        optimizer: Optimizer,
        T_max: int,
        eta_min: float = 0.0,  # noqa: N803 - PyTorch's
        last_epoch: int = -1,
    ) -> None:
        self.T_max = T_max
        self.eta_min = eta_min
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> list[float]:
        t, n, lo = self.last_epoch, self.T_max, self.eta_min
        if self._is_initial:
            return self._current()
        if self._step_count == 1 and t > 0:
            return [
                lo + (base - lo) * (1 + math.cos(t * math.pi / n)) / 2 for base in self.base_lrs
            ]
        if (t - 1 - n) % (2 * n) == 0:
            return [
                lr + (base - lo) * (1 - math.cos(math.pi / n)) / 2
                for base, lr in zip(self.base_lrs, self._current(), strict=True)
            ]
        return [
            (1 + math.cos(math.pi * t / n)) / (1 + math.cos(math.pi * (t - 1) / n)) * (lr - lo) + lo
            for lr in self._current()
        ]

    def _get_closed_form_lr(self) -> list:
        return [
            self.eta_min
            + (base - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
            for base in self.base_lrs
        ]


class SequentialLR(LRScheduler):
    """``schedulers`` in turn: the i-th from epoch ``milestones[i - 1]`` on (each starting
    from its own epoch 0 there).

    Raises:
        ValueError: no schedulers, one of another optimizer, or not one milestone fewer
            than schedulers."""

    def __init__(
        self,
        optimizer: Optimizer,
        schedulers: list[LRScheduler],
        milestones: list[int],
        last_epoch: int = -1,
    ) -> None:
        if len(schedulers) < 1:
            raise ValueError("SequentialLR expects at least one scheduler, got none")
        for i, s in enumerate(schedulers):
            if getattr(s, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"SequentialLR: scheduler {i} ({type(s).__name__}) belongs "
                    f"to another optimizer; give schedulers of this one"
                )
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR expects one milestone fewer than schedulers: "
                f"{len(schedulers)} schedulers, {len(milestones)} milestones"
            )
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # back to the initial rates
            group["lr"] = group["initial_lr"]
        for s in self._schedulers:  # undo their own first steps
            s.last_epoch -= 1
        first = self._schedulers[bisect_right(self._milestones, 0)]
        first._initial_step()
        self._last_lr = first.get_last_lr()

    def step(self) -> None:  # type: ignore[override]  # noqa: D102 - as PyTorch's: no epoch=
        self.last_epoch += 1
        idx = bisect_right(self._milestones, self.last_epoch)
        s = self._schedulers[idx]
        if idx > 0 and self._milestones[idx - 1] == self.last_epoch:
            s._update_lr(0)
        else:
            s.step()
        self._last_lr = s.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        """As the base's, with each scheduler's own state dict."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("optimizer", "_schedulers")}
        out["_schedulers"] = [s.state_dict() for s in self._schedulers]
        return out

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        saved = state_dict.pop("_schedulers")
        self.__dict__.update(state_dict)
        for s, st in zip(self._schedulers, saved, strict=True):
            s.load_state_dict(st)


class OneCycleLR(LRScheduler):
    """The 1cycle policy: the rate from ``max_lr / div_factor`` up to ``max_lr`` over
    ``pct_start`` of ``total_steps`` (or ``epochs * steps_per_epoch``), then down to
    ``initial_lr / final_div_factor`` (``three_phase``: back to the initial rate first),
    annealed by ``anneal_strategy`` (``"cos"`` or ``"linear"``); with ``cycle_momentum``
    the momentum (SGD's, RMSprop's ``momentum``, Adam's ``betas[0]``) goes the other way
    between ``max_momentum`` and ``base_momentum``. Stepped once per batch.

    Raises:
        ValueError: no ``total_steps`` nor ``epochs`` and ``steps_per_epoch``, a bad
            ``pct_start`` or ``anneal_strategy``, ``cycle_momentum`` with an optimizer
            without momentum (Adagrad), or a step past ``total_steps``."""

    def __init__(
        self,
        optimizer: Optimizer,
        max_lr: float | Sequence[float],
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float | Sequence[float] = 0.85,
        max_momentum: float | Sequence[float] = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        _check_optimizer("OneCycleLR", optimizer)
        self.optimizer = optimizer
        if total_steps is not None:
            if not isinstance(total_steps, int) or total_steps <= 0:
                raise ValueError(
                    f"OneCycleLR: expected a positive integer total_steps, got {total_steps}"
                )
            self.total_steps = total_steps
        elif epochs is not None and steps_per_epoch is not None:
            for name, v in (("epochs", epochs), ("steps_per_epoch", steps_per_epoch)):
                if not isinstance(v, int) or v <= 0:
                    raise ValueError(f"OneCycleLR: expected a positive integer {name}, got {v}")
            self.total_steps = epochs * steps_per_epoch
        else:
            raise ValueError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
        n = self.total_steps
        if three_phase:
            self._schedule_phases = [
                _phase(
                    float(pct_start * n) - 1,
                    "initial_lr",
                    "max_lr",
                    "max_momentum",
                    "base_momentum",
                ),
                _phase(
                    float(2 * pct_start * n) - 2,
                    "max_lr",
                    "initial_lr",
                    "base_momentum",
                    "max_momentum",
                ),
                _phase(n - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum"),
            ]
        else:
            self._schedule_phases = [
                _phase(
                    float(pct_start * n) - 1,
                    "initial_lr",
                    "max_lr",
                    "max_momentum",
                    "base_momentum",
                ),
                _phase(n - 1, "max_lr", "min_lr", "base_momentum", "max_momentum"),
            ]
        if not isinstance(pct_start, float) or not 0 <= pct_start <= 1:
            raise ValueError(f"OneCycleLR: expected a float pct_start in [0, 1], got {pct_start!r}")
        if anneal_strategy not in ("cos", "linear"):
            raise ValueError(
                f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}"
            )
        self._anneal_func_type = anneal_strategy
        max_lrs = _per_group("max_lr", optimizer, max_lr)
        if last_epoch == -1:
            for lr, group in zip(max_lrs, optimizer.param_groups, strict=True):
                group["initial_lr"] = lr / div_factor
                group["max_lr"] = lr
                group["min_lr"] = group["initial_lr"] / final_div_factor
        self.cycle_momentum = cycle_momentum
        if cycle_momentum:
            if "momentum" not in optimizer.defaults and "betas" not in optimizer.defaults:
                raise ValueError(
                    f"OneCycleLR: cycle_momentum needs an optimizer with "
                    f"momentum or betas, {type(optimizer).__name__} has neither; "
                    f"pass cycle_momentum=False"
                )
            self.use_beta1 = "betas" in optimizer.defaults
            if last_epoch == -1:
                for hi, lo, group in zip(
                    _per_group("max_momentum", optimizer, max_momentum),
                    _per_group("base_momentum", optimizer, base_momentum),
                    optimizer.param_groups,
                    strict=True,
                ):
                    if self.use_beta1:
                        group["betas"] = (hi, *group["betas"][1:])
                    else:
                        group["momentum"] = hi
                    group["max_momentum"] = hi
                    group["base_momentum"] = lo
        super().__init__(optimizer, last_epoch)

    def _anneal(self, start, end, pct):
        if self._anneal_func_type == "cos":
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def get_lr(self) -> list[float]:
        step = self.last_epoch
        if step > self.total_steps:
            raise ValueError(
                f"OneCycleLR: stepped {step} times, past total_steps="
                f"{self.total_steps}; make total_steps (or epochs * "
                f"steps_per_epoch) the number of batches trained"
            )
        lrs = []
        last = len(self._schedule_phases) - 1
        for group in self.optimizer.param_groups:
            start = 0.0
            for i, phase in enumerate(self._schedule_phases):
                end = phase["end_step"]
                if step <= end or i == last:
                    pct = (step - start) / (end - start)
                    lr = self._anneal(group[phase["start_lr"]], group[phase["end_lr"]], pct)
                    if self.cycle_momentum:
                        mom = self._anneal(
                            group[phase["start_momentum"]], group[phase["end_momentum"]], pct
                        )
                    break
                start = phase["end_step"]
            lrs.append(lr)
            if self.cycle_momentum:
                if self.use_beta1:
                    group["betas"] = (mom, *group["betas"][1:])
                else:
                    group["momentum"] = mom
        return lrs


def _phase(end_step, start_lr, end_lr, start_momentum, end_momentum) -> dict:
    return dict(
        end_step=end_step,
        start_lr=start_lr,
        end_lr=end_lr,
        start_momentum=start_momentum,
        end_momentum=end_momentum,
    )


__all__ = [
    "LRScheduler",
    "LambdaLR",
    "StepLR",
    "MultiStepLR",
    "LinearLR",
    "CosineAnnealingLR",
    "SequentialLR",
    "OneCycleLR",
]
