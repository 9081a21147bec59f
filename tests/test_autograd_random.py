"""Random programs through autograd, against PyTorch: shared subexpressions, broadcasting,
views and reductions mixed at random (float64), the same gradients to 1e-9."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorflow as af

torch = pytest.importorskip("torch")

UNARY = ["tanh", "exp_small", "sigmoid", "neg", "square", "relu", "gelu"]
BINARY = ["add", "sub", "mul", "div_safe", "maximum"]
SHAPE = ["T", "sum0_keep", "reshape_flat", "slice", "expand_row"]


def apply(lib, name, a, b=None):
    """One op in either library (``lib`` is af or torch); every op keeps the (3, 4)
    shape, so the programs can combine any two values."""
    t = lib is torch
    if name == "tanh":
        return lib.tanh(a)
    if name == "exp_small":
        return lib.exp(a * 0.3)
    if name == "sigmoid":
        return lib.sigmoid(a)
    if name == "neg":
        return -a
    if name == "square":
        return a * a
    if name == "relu":
        return lib.relu(a)
    if name == "gelu":
        return torch.nn.functional.gelu(a) if t else af.gelu(a)
    if name == "add":
        return a + b
    if name == "sub":
        return a - b
    if name == "mul":
        return a * b
    if name == "div_safe":
        return a / (b * b + 1.0)
    if name == "maximum":
        return lib.maximum(a, b)
    if name == "T":  # matmul through transposed views: (3, 4)
        return (a @ b.T) @ a * 0.1
    if name == "sum0_keep":
        return a - a.sum(dim=0, keepdim=True) * 0.25
    if name == "reshape_flat":
        return a.reshape(12).reshape(3, 4) * 1.5
    if name == "slice":
        return a[:, :2].repeat(1, 2) if t else af.cat([a[:, :2], a[:, :2]], dim=1)
    if name == "expand_row":
        return a[0:1, :].expand(3, 4) + a
    raise AssertionError(name)


program = st.lists(
    st.tuples(st.sampled_from(UNARY + BINARY + SHAPE), st.integers(0, 50), st.integers(0, 50)),
    min_size=1,
    max_size=10,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prog=program, seed=st.integers(0, 2**16), n_leaves=st.integers(1, 3))
def test_random_programs_have_pytorchs_gradients(prog, seed, n_leaves):
    rng = np.random.default_rng(seed)
    leaves = [rng.standard_normal((3, 4)) for _ in range(n_leaves)]
    # ties in maximum/relu would make the two libraries pick differently: keep values apart
    leaves = [v + np.sign(v) * 0.05 for v in leaves]
    cot = rng.standard_normal((3, 4))

    def run(lib):
        xs = [lib.tensor(v, requires_grad=True) for v in leaves]
        vals = list(xs)
        for name, i, j in prog:
            a, b = vals[i % len(vals)], vals[j % len(vals)]
            vals.append(apply(lib, name, a, b))
        out = sum(((v * lib.tensor(cot)).sum() for v in vals[n_leaves:]), vals[0].sum() * 0)
        out.backward()
        return [x.grad.numpy() if x.grad is not None else np.zeros((3, 4)) for x in xs]

    got, want = run(af), run(torch)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-9)
