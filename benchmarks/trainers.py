"""The training loops the training benchmarks share (a plain module, not part of actorflow):
one model and optimizer in actorflow (eager, or an ``nn.Graph`` step) or in PyTorch, reset
to saved weights and a fresh optimizer state before every timed run.

``spec`` says what is trained, in either framework (``lib`` is actorflow or torch):
``spec["make"](lib)`` builds the model, ``spec["optim"]`` names the optimizer class in
``lib.optim`` and ``spec["options"]`` are its arguments. The loss is ``CrossEntropyLoss``.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np


def eager_steps(model, opt, lossf, x, y, k: int):
    """``k`` training steps of an eager loop, in either framework: the last loss."""
    loss = None
    for _ in range(k):
        opt.zero_grad()
        loss = lossf(model(x), y)
        loss.backward()
        opt.step()
    return loss


def make_train_step(af):
    """``TrainStep(model, opt)``: an ``nn.Graph`` whose ``build(x, y)`` computes the loss,
    runs backward and returns the loss, the optimizer added."""

    class TrainStep(af.nn.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model = model
            self.loss = af.nn.CrossEntropyLoss()
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = self.loss(self.model(x), y)
            loss.backward()
            return loss

    return TrainStep


class AfTrainer:
    """An actorflow model and optimizer (and, with ``graph``, its ``nn.Graph`` step), reset
    to ``saved`` (numpy arrays by ``state_dict`` key) and a fresh optimizer state by
    ``reset()``. A compiled step holds the optimizer's state tensors, so graph mode zeroes
    them in place: a fresh SGD momentum or Adam state is all zeros, its step count included
    (with dampening 0, SGD's next update is then ``buf = 0.9 * 0 + g = g``, a first step's)."""

    def __init__(self, af, spec: dict, saved: dict, graph: bool):
        self.af, self.spec, self.saved, self.graph = af, spec, saved, graph
        self.model = spec["make"](af)
        self.model.train()
        self.opt = self.new_optimizer()
        self.lossf = af.nn.CrossEntropyLoss()
        self.step = make_train_step(af)(self.model, self.opt) if graph else None
        self.reset()

    def new_optimizer(self):
        return getattr(self.af.optim, self.spec["optim"])(
            self.model.parameters(), **self.spec["options"]
        )

    def reset(self) -> None:
        af = self.af
        self.model.load_state_dict({k: af.tensor(v) for k, v in self.saved.items()})
        if self.graph:
            with af.no_grad():
                for st in self.opt.state.values():
                    for v in st.values():
                        if isinstance(v, af.Tensor):
                            v.zero_()
        else:
            self.opt = self.new_optimizer()
        af.synchronize()

    def eager_steps(self, x, y, k: int) -> float:
        """``k`` eager steps; the loss's ``item()`` waits for the last update (ops are
        asynchronous: the time includes finishing it, not just queueing it)."""
        loss = eager_steps(self.model, self.opt, self.lossf, x, y, k)
        self.af.synchronize()
        return loss.item()

    def graph_steps(self, x, y, k: int) -> float:
        loss = None
        for _ in range(k):
            loss = self.step(x, y)
        return loss.item()

    def graph_run(self, batches, fused: bool) -> float:
        """``step.run(batches)`` (an actor per op, or with ``fused`` the step as one op
        actor); the last loss."""
        losses = [float(v) for v in self.step.run(batches, buffers=2, fused=fused)]
        return losses[-1]

    def digest(self) -> str:
        """A hash of the model's parameters and buffers (bit for bit comparisons)."""
        h = hashlib.sha256()
        for k, v in self.model.state_dict().items():
            h.update(k.encode())
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()[:16]


class TorchTrainer:
    """The same model and optimizer in PyTorch, from the same saved weights."""

    def __init__(self, torch, spec: dict, saved: dict):
        self.torch, self.spec = torch, spec
        self.model = spec["make"](torch)
        self.model.train()
        self.saved = {k: torch.from_numpy(v.copy()) for k, v in saved.items()}
        self.lossf = torch.nn.CrossEntropyLoss()
        self.reset()

    def reset(self) -> None:
        self.model.load_state_dict(self.saved)  # copies: same layout as actorflow's
        self.opt = getattr(self.torch.optim, self.spec["optim"])(
            self.model.parameters(), **self.spec["options"]
        )

    def steps(self, x, y, k: int) -> float:
        return eager_steps(self.model, self.opt, self.lossf, x, y, k).item()


def rel(a: float, b: float) -> float:
    """``|a - b| / |b|``."""
    return abs(a - b) / max(abs(b), 1e-30)


class LossChecks:
    """The checks of K-step runs: ``check_for(name)`` is a contender's check, its warm-up
    run's last loss the reference (kept in ``last_loss``) that every timed run's must equal
    within ``rtol`` relative (the same work from the same start); ``first_steps`` marks the
    contenders whose first step's loss is not the reference contender's within
    ``first_rtol``."""

    def __init__(self, k: int, rtol: float):
        self.k, self.rtol = k, rtol
        self.last_loss: dict = {}

    def check_for(self, name: str):
        seen = []

        def check(loss, _ref):
            if not isinstance(loss, float) or not math.isfinite(loss):
                return f"loss after {self.k} steps is {loss!r}, not a finite float"
            if not seen:
                seen.append(loss)  # the warm-up run: the reference for the rest
                self.last_loss[name] = loss
                return None
            if rel(loss, seen[0]) > self.rtol:
                return (
                    f"loss after {self.k} steps {loss!r} != {seen[0]!r} of the warm-up "
                    f"run (not the same work from the same start)"
                )
            return None

        return check

    @staticmethod
    def first_steps(contenders: list, first: dict, ref_name: str, first_rtol: float) -> None:
        for c in contenders:
            if rel(first[c.name], first[ref_name]) > first_rtol:
                c.check_failures.append(
                    f"first step's loss {first[c.name]!r} != {ref_name}'s "
                    f"{first[ref_name]!r} within {first_rtol} relative (not the same initial "
                    f"weights or math)"
                )
