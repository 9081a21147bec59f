"""Optimizers, learning-rate schedules and gradient clipping against PyTorch's, step for
step: RMSprop and Adagrad in every option, parameter groups of different options in every
optimizer, each scheduler's rates over many steps, clip_grad_norm_/clip_grad_value_; and
in nn.Graph: the same numbers bit for bit as eager mode, a schedule's rates read as state
of the compiled step (no compile per step), clipping traced into the step."""

import math

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.nn import graph as graph_module
from actorflow.optim import lr_scheduler as sched

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(120)

OPTIONS = {
    "SGD": [dict(lr=0.1), dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01),
            dict(lr=0.05, momentum=0.9, nesterov=True, maximize=True)],
    "Adam": [dict(lr=0.01), dict(lr=0.02, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)],
    "AdamW": [dict(lr=0.01), dict(lr=0.02, weight_decay=0.3, eps=1e-6, maximize=True)],
    "RMSprop": [dict(), dict(lr=0.01, alpha=0.9, eps=1e-6, weight_decay=0.1),
                dict(lr=0.01, momentum=0.9), dict(lr=0.01, centered=True),
                dict(lr=0.005, momentum=0.5, centered=True, weight_decay=0.05,
                     maximize=True)],
    "Adagrad": [dict(), dict(lr=0.1, lr_decay=0.01), dict(lr=0.1, weight_decay=0.1,
                                                           initial_accumulator_value=0.5),
                dict(lr=0.05, lr_decay=0.001, eps=1e-6, maximize=True)],
}
CASES = [(name, kw) for name, kws in OPTIONS.items() for kw in kws]
IDS = [f"{name}-{i}" for name, kws in OPTIONS.items() for i in range(len(kws))]


def torch_opt(name, params, **kw):
    extra = {} if name == "SGD" else dict(foreach=False)
    return getattr(torch.optim, name)(params, **kw, **extra)


def run_both(name, groups, steps, shapes=((4, 3), (3,))):
    """Trains one float64 tensor per shape, in ``groups`` (options per group; each group
    takes the tensors at its indices), with actorflow and with PyTorch on the same loss;
    returns both sets of tensors after every step."""
    rng = np.random.default_rng(5)
    w0 = [rng.standard_normal(s) for s in shapes]
    tgt = [rng.standard_normal(s) for s in shapes]
    ps = [af.tensor(w, requires_grad=True) for w in w0]
    tps = [torch.tensor(w, requires_grad=True) for w in w0]
    opt = getattr(optim, name)([dict(g, params=[ps[i] for i in idx]) for idx, g in groups])
    topt = torch_opt(name, [dict(g, params=[tps[i] for i in idx]) for idx, g in groups])
    for step in range(steps):
        for o, qs, T in ((opt, ps, af.tensor), (topt, tps, torch.tensor)):
            o.zero_grad()
            loss = sum((((q - T(t)) ** 2) * (step + 1.0) + q ** 3 * 0.1).sum()
                       for q, t in zip(qs, tgt))
            loss.backward()
            o.step()
        for a, b in zip(ps, tps):
            np.testing.assert_allclose(a.detach().numpy(), b.detach().numpy(), rtol=1e-9,
                                       atol=1e-12, err_msg=f"{name} step {step}")
    return opt, topt


@pytest.mark.parametrize("name,kw", [c for c in CASES if c[0] in ("RMSprop", "Adagrad")],
                         ids=[i for i in IDS if i.split("-")[0] in ("RMSprop", "Adagrad")])
def test_rmsprop_and_adagrad_match_pytorch_step_for_step(name, kw):
    opt, topt = run_both(name, [((0, 1), kw)], 25)
    mine, theirs = opt.state_dict(), topt.state_dict()
    assert mine["param_groups"][0].keys() <= theirs["param_groups"][0].keys()
    for i, st in theirs["state"].items():
        assert set(mine["state"][i]) == set(st)
        assert mine["state"][i]["step"] == int(st["step"])
        for k, v in st.items():
            if k != "step":
                np.testing.assert_allclose(mine["state"][i][k].numpy(), v.numpy(), rtol=1e-9,
                                           atol=1e-12)


@pytest.mark.parametrize("name", list(OPTIONS))
def test_every_optimizer_takes_groups_of_different_options(name):
    a, b = OPTIONS[name][0], OPTIONS[name][-1]
    run_both(name, [((0,), a), ((1, 2), b)], 8, shapes=((4, 3), (3,), (2, 2)))
