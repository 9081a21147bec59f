"""Autograd: every grad rule against central finite differences (float64), and against
PyTorch on the same inputs where it is installed; accumulation, no_grad, detach, in-place
checks, retain_graph, views."""

import numpy as np
import pytest

import actorflow as af
from actorflow.autograd.nodes import _RULES, _VIEW_RULES

RNG = np.random.default_rng(0)


def rand(*shape, positive=False, spread=False):
    a = RNG.standard_normal(shape)
    if spread:  # values far apart: no ties, no kinks near them
        a = RNG.permutation(np.arange(int(np.prod(shape)), dtype=np.float64)).reshape(shape)
        a = a * 0.37 - 1.1
    if positive:
        a = np.abs(a) + 0.5
    return a


def idx(*values):
    return af.tensor(np.array(values, dtype=np.int64))


# name, function of tensors (numpy-compatible names via the af namespace), input arrays
CASES = [
    ("add", lambda a, b: a + b, [rand(3, 4), rand(4)]),
    ("sub", lambda a, b: a - b, [rand(3, 1), rand(1, 4)]),
    ("mul", lambda a, b: a * b, [rand(2, 3), rand(2, 3)]),
    ("div", lambda a, b: a / b, [rand(2, 3), rand(3, positive=True)]),
    ("pow", lambda a, b: a**b, [rand(2, 3, positive=True), rand(2, 3)]),
    (
        "maximum",
        lambda a, b: af.maximum(a, b),
        [rand(3, 3, spread=True), rand(3, 3, spread=True) + 0.1],
    ),
    (
        "minimum",
        lambda a, b: af.minimum(a, b),
        [rand(3, 3, spread=True), rand(3, 3, spread=True) + 0.1],
    ),
    ("remainder", lambda a, b: a % b, [rand(4, positive=True) * 3 + 0.05, rand(4, positive=True)]),
    ("remainder_scalar", lambda a: a % 0.7, [np.array([0.3, 1.1, 2.5, -0.4])]),
    (
        "floor_divide",
        lambda a, b: a // b + a,
        [np.array([1.3, 2.6, 3.7]), np.array([0.7, 1.1, 1.6])],
    ),
    ("floor_divide_scalar", lambda a: a // 0.7 + a, [np.array([0.3, 1.1, 2.5])]),
    ("rfloor_divide_scalar", lambda a: 2.9 // a + a, [np.array([0.7, 1.3, 2.2])]),
    ("rremainder_scalar", lambda a: 2.9 % a, [np.array([0.7, 1.3, 2.2, 3.5])]),
    ("add_scalar", lambda a: a + 2.5, [rand(3)]),
    ("radd_scalar", lambda a: 2.5 + a, [rand(3)]),
    ("sub_scalar", lambda a: a - 2.5, [rand(3)]),
    ("rsub_scalar", lambda a: 2.5 - a, [rand(3)]),
    ("mul_scalar", lambda a: a * 3.0, [rand(3)]),
    ("rmul_scalar", lambda a: 3.0 * a, [rand(3)]),
    ("div_scalar", lambda a: a / 3.0, [rand(3)]),
    ("rdiv_scalar", lambda a: 3.0 / a, [rand(3, positive=True)]),
    ("pow_scalar", lambda a: a**3, [rand(4)]),
    ("rpow_scalar", lambda a: 2.0**a, [rand(4)]),
    ("maximum_scalar", lambda a: af.maximum(a, 0.05), [rand(5, spread=True)]),
    ("minimum_scalar", lambda a: af.minimum(a, 0.05), [rand(5, spread=True)]),
    ("rmaximum_scalar", lambda a: af.maximum(0.05, a), [rand(5, spread=True)]),
    ("rminimum_scalar", lambda a: af.minimum(0.05, a), [rand(5, spread=True)]),
    ("neg", lambda a: -a, [rand(3)]),
    ("abs", lambda a: af.abs(a), [rand(5, spread=True)]),
    ("exp", lambda a: af.exp(a), [rand(3, 2)]),
    ("log", lambda a: af.log(a), [rand(3, positive=True)]),
    ("sqrt", lambda a: af.sqrt(a), [rand(3, positive=True)]),
    ("tanh", lambda a: af.tanh(a), [rand(3, 2)]),
    ("sigmoid", lambda a: af.sigmoid(a), [rand(3, 2)]),
    ("relu", lambda a: af.relu(a), [rand(6, spread=True)]),
    ("gelu", lambda a: af.gelu(a), [rand(6)]),
    ("gelu", lambda a: af.gelu(a, approximate="tanh"), [rand(6)]),
    ("clamp", lambda a: af.clamp(a, -0.5, 0.7), [rand(8, spread=True) * 0.5]),
    # tensor bounds, broadcast; the last row's max is below every min but one (max wins)
    (
        "clamp_tensor",
        lambda a, b, c: af.clamp(a, b, c),
        [
            rand(3, 4, spread=True),
            np.array([-0.5, 0.0, 0.4, -2.0]),
            np.array([[0.9], [2.0], [-0.9]]),
        ],
    ),
    (
        "clamp_tensor",
        lambda a, b: af.clamp(a, min=b),
        [rand(3, 4, spread=True), np.array([-0.5, 0.0, 0.4, -2.0])],
    ),
    (
        "clamp_tensor",
        lambda a, b: af.clamp(a, max=b),
        [rand(3, 4, spread=True), np.array([[0.9], [2.0], [-0.9]])],
    ),
    (
        "trunc_divide",
        lambda a, b: af.div(a, b, rounding_mode="trunc") + a,
        [np.array([1.3, 2.6, -3.7]), np.array([0.7, 1.1, 1.6])],
    ),
    (
        "trunc_divide_scalar",
        lambda a: af.div(a, 0.7, rounding_mode="trunc") + a,
        [np.array([0.3, 1.1, -2.5])],
    ),
    (
        "rtrunc_divide_scalar",
        lambda a: af.div(2.9, a, rounding_mode="trunc") + a,
        [np.array([0.7, 1.3, -2.2])],
    ),
    ("cast", lambda a: a.float().double() * 2.0, [rand(3)]),  # linear: see EPS
    ("copy", lambda a: a.clone(), [rand(2, 2)]),
    ("where", lambda a, b: af.where(a > 0, a, b), [rand(3, 3, spread=True), rand(3, 3)]),
    ("where", lambda a: af.where(a > 0, a, 0.5), [rand(3, 3, spread=True)]),
    ("where", lambda a: af.where(a > 0, 0.5, a), [rand(3, 3, spread=True)]),
    ("sum", lambda a: a.sum(dim=1), [rand(3, 4)]),
    ("sum", lambda a: a.sum(dim=(0, 2), keepdim=True), [rand(2, 3, 4)]),
    ("mean", lambda a: a.mean(dim=0), [rand(3, 4)]),
    ("mean", lambda a: a.mean(), [rand(3, 4)]),
    ("amax", lambda a: a.amax(dim=1), [rand(3, 4, spread=True)]),
    ("amin", lambda a: a.amin(), [rand(3, 4, spread=True)]),
    ("max_dim", lambda a: a.max(dim=1).values, [rand(3, 4, spread=True)]),
    ("min_dim", lambda a: a.min(dim=0, keepdim=True).values, [rand(3, 4, spread=True)]),
    ("softmax", lambda a: af.softmax(a, dim=1), [rand(3, 5)]),
    ("log_softmax", lambda a: af.log_softmax(a, dim=-1), [rand(3, 5)]),
    ("matmul", lambda a, b: a @ b, [rand(3, 4), rand(4, 2)]),
    ("matmul", lambda a, b: a @ b, [rand(2, 3, 4), rand(4, 5)]),
    ("matmul", lambda a, b: a @ b, [rand(4), rand(4, 3)]),
    ("matmul", lambda a, b: a @ b, [rand(3, 4), rand(4)]),
    ("matmul", lambda a, b: a @ b, [rand(4), rand(4)]),
    ("cat", lambda a, b: af.cat([a, b], dim=1), [rand(2, 3), rand(2, 2)]),
    ("stack", lambda a, b: af.stack([a, b], dim=0), [rand(2, 3), rand(2, 3)]),
    ("index", lambda a: a[idx(0, 2, 2)], [rand(4, 3)]),
    ("index", lambda a: a[idx(0, 1, 1), idx(2, 0, 0)], [rand(3, 3)]),
    ("masked_index", lambda a: a[a > 0], [rand(3, 4, spread=True)]),
    ("index_put", lambda a, b: _put(a * 1.0, idx(0, 2), b), [rand(3, 4), rand(4)]),
    ("index_put", lambda a: _put(a * 1.0, idx(1), 0.5), [rand(3, 2)]),
    ("reshape", lambda a: a.reshape(6, 2) * af.tensor(np.arange(12.0).reshape(6, 2)), [rand(3, 4)]),
    (
        "permute",
        lambda a: a.permute(2, 0, 1) * af.tensor(np.arange(24.0).reshape(4, 2, 3)),
        [rand(2, 3, 4)],
    ),
    ("permute", lambda a: a.T * af.tensor(np.arange(6.0).reshape(3, 2)), [rand(2, 3)]),
    (
        "permute",
        lambda a: a.transpose(0, 2) * af.tensor(np.arange(24.0).reshape(4, 3, 2)),
        [rand(2, 3, 4)],
    ),
    ("expand", lambda a: a.expand(3, 4) * af.tensor(np.arange(12.0).reshape(3, 4)), [rand(1, 4)]),
    ("index", lambda a: a[1:, ::2] * af.tensor(np.arange(4.0).reshape(2, 2)), [rand(3, 4)]),
    ("index", lambda a: a[:, 1] * af.tensor(np.arange(3.0)), [rand(3, 4)]),
    (
        "reshape",
        lambda a: a.unsqueeze(1).squeeze(1).flatten() * af.tensor(np.arange(6.0)),
        [rand(2, 3)],
    ),
    # gather / scatter_add, cumsum, sort / topk, pad
    ("gather", lambda a: a.gather(1, af.tensor(np.array([[0, 2, 2], [1, 1, 0]]))), [rand(2, 4)]),
    (
        "gather",
        lambda a: af.gather(a, 0, af.tensor(np.array([[2, 0], [2, 2], [1, 0]]))),
        [rand(3, 3)],
    ),
    (
        "scatter_add",
        lambda a, b: af.scatter_add(a, 0, af.tensor(np.array([[0, 2], [0, 1]])), b),
        [rand(3, 2), rand(2, 2)],
    ),
    (
        "scatter_add_src_past_index",  # src larger than the index: zeros past it
        lambda a, b: af.scatter_add(a, 0, af.tensor(np.array([[0, 2], [0, 1]])), b),
        [rand(3, 2), rand(3, 3)],
    ),
    (
        "scatter_add",
        lambda a, b: (a * 1.0).scatter_add_(1, af.tensor(np.array([[1, 1, 0]])), b),
        [rand(2, 3), rand(1, 3)],
    ),
    ("cumsum", lambda a: af.cumsum(a, 1), [rand(2, 4)]),
    ("cumsum", lambda a: a.cumsum(dim=0), [rand(3, 2)]),
    ("sort", lambda a: af.sort(a, dim=0, descending=True).values, [rand(3, 4, spread=True)]),
    ("sort", lambda a: a.sort().values[:, :2], [rand(2, 5, spread=True)]),
    ("topk", lambda a: af.topk(a, 2, dim=1).values, [rand(3, 4, spread=True)]),
    ("topk", lambda a: a.topk(2, dim=0, largest=False).values, [rand(4, 3, spread=True)]),
    ("pad", lambda a: af.nn.functional.pad(a, (1, 2, -1, 1), value=0.5), [rand(3, 4)]),
    ("pad", lambda a: af.nn.functional.pad(a, (2, 1, 1, 2), mode="reflect"), [rand(1, 3, 4)]),
    ("pad", lambda a: af.nn.functional.pad(a, (2, 1), mode="replicate"), [rand(2, 3)]),
    ("pad", lambda a: af.nn.functional.pad(a, (1, 3, 2, 0), mode="circular"), [rand(1, 3, 4)]),
    # normalization and the math ops: sin, cos, rsqrt, erf, silu (ops); var/std and
    # group_norm (compositions); batch_norm (training: its own op and backward; eval: a
    # composition)
    ("sin", lambda a: a.sin(), [rand(3, 4)]),
    ("cos", lambda a: a.cos(), [rand(3, 4)]),
    ("rsqrt", lambda a: a.rsqrt(), [rand(3, 4, positive=True)]),
    ("erf", lambda a: a.erf(), [rand(3, 4)]),
    ("var", lambda a: a.var(dim=1) + a.std(), [rand(3, 4)]),
    ("var", lambda a: a.var(0, False, True) * a.std(dim=(0, 1), correction=2), [rand(3, 4)]),
    ("silu", lambda a: af.nn.functional.silu(a), [rand(3, 4)]),
    (
        "group_norm",
        lambda a, w, b: af.nn.functional.group_norm(a, 2, w, b),
        [rand(2, 4, 3), rand(4), rand(4)],
    ),
    (
        "batch_norm",
        lambda a, w, b: af.nn.functional.batch_norm(a, None, None, w, b, True),
        [rand(4, 3), rand(3), rand(3)],
    ),
    (
        "batch_norm",
        lambda a: af.nn.functional.batch_norm(a, None, None, training=True),
        [rand(2, 3, 2, 2)],
    ),
    (
        "batch_norm",
        lambda a, w: af.nn.functional.batch_norm(a, None, None, w, training=True),
        [rand(3, 2, 4), rand(2)],
    ),
    (
        "batch_norm",
        lambda a, b: af.nn.functional.batch_norm(a, None, None, None, b, True),
        [rand(3, 2, 4), rand(2)],
    ),
    (
        "batch_norm",
        lambda a, w, b: af.nn.functional.batch_norm(
            a, af.tensor(np.array([0.3, -0.2, 0.1])), af.tensor(np.array([0.5, 1.5, 2.0])), w, b
        ),
        [rand(4, 3, 2), rand(3), rand(3)],
    ),
    # attention's helpers: triangles of a (batch of) matrices
    ("triu", lambda a: a.triu(1), [rand(2, 3, 4)]),
    ("triu", lambda a: a.triu(-1), [rand(4, 3)]),
    ("tril", lambda a: a.tril(), [rand(3, 4)]),
    ("tril", lambda a: a.tril(-2), [rand(2, 4, 4)]),
    # convolution and pooling
    (
        "conv2d",
        lambda a, w, b: af.nn.functional.conv2d(
            a, w, b, stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2
        ),
        [rand(1, 2, 5, 5), rand(4, 1, 2, 2), rand(4)],
    ),
    (
        "conv2d",
        lambda a, w: af.nn.functional.conv2d(a, w, padding="same"),
        [rand(2, 2, 3, 4), rand(2, 2, 2, 3)],
    ),
    (
        "conv_transpose2d",
        lambda a, w, b: af.nn.functional.conv_transpose2d(
            a, w, b, stride=2, padding=1, output_padding=1, groups=2
        ),
        [rand(1, 2, 3, 2), rand(2, 2, 2, 3), rand(4)],
    ),
    (
        "max_pool2d",
        lambda a: af.nn.functional.max_pool2d(a, 2, 1, 1, ceil_mode=True),
        [rand(2, 2, 3, 4, spread=True)],
    ),
    (
        "max_pool2d",
        lambda a: af.nn.functional.max_pool2d(a, (2, 3), 2, dilation=(1, 2)),
        [rand(1, 2, 4, 6, spread=True)],
    ),
    (
        "avg_pool2d",
        lambda a: af.nn.functional.avg_pool2d(a, 3, 2, 1, True, False),
        [rand(1, 2, 5, 4)],
    ),
    (
        "avg_pool2d",
        lambda a: af.nn.functional.avg_pool2d(a, 2, divisor_override=3),
        [rand(2, 1, 4, 4)],
    ),
    (
        "adaptive_avg_pool2d",
        lambda a: af.nn.functional.adaptive_avg_pool2d(a, (2, 3)),
        [rand(1, 2, 5, 4)],
    ),
    (
        "unfold",
        lambda a: af.nn.functional.unfold(a, 2, padding=1, stride=(2, 1)),
        [rand(1, 2, 3, 3)],
    ),
    ("fold", lambda a: af.nn.functional.fold(a, (3, 4), 2, stride=(1, 2)), [rand(1, 4, 4)]),
    # layer norm: its own op and backward (affine or not, one or two normalized dims)
    (
        "layer_norm",
        lambda a, w, b: af.nn.functional.layer_norm(a, (4,), w, b),
        [rand(3, 4), rand(4), rand(4)],
    ),
    ("layer_norm", lambda a: af.nn.functional.layer_norm(a, (2, 3)), [rand(2, 2, 3)]),
    (
        "layer_norm",
        lambda a, w: af.nn.functional.layer_norm(a, [3], w, eps=1e-3),
        [rand(2, 1, 3), rand(3)],
    ),
    ("layer_norm", lambda a, b: af.nn.functional.layer_norm(a, (5,), None, b), [rand(5), rand(5)]),
]


def _put(h, key, value):
    """``h[key] = value`` on a tensor in autograd (a setitem records index_put)."""
    h[key] = value
    return h


EPS = {"cast": 1e-2}  # float32 inside: a wider step (the function is linear, so exact)


def weights_for(y):
    """A fixed random cotangent, so the test is sensitive to every output element."""
    w = np.random.default_rng(1).standard_normal(y.shape)
    return af.tensor(w)


def analytic(fn, arrays):
    xs = [af.tensor(a, requires_grad=True) for a in arrays]
    y = fn(*xs)
    (y * weights_for(y)).sum().backward()
    return [x.grad.numpy() for x in xs], y


def numeric(fn, arrays, eps=1e-6):
    grads = []
    for k, a in enumerate(arrays):
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):

            def f(delta, k=k, i=i):
                b = [x.copy() for x in arrays]
                b[k][i] += delta
                y = fn(*[af.tensor(x) for x in b])
                return float((y * weights_for(y)).sum().item())

            g[i] = (f(eps) - f(-eps)) / (2 * eps)
        grads.append(g)
    return grads


def names_in(y) -> set:
    seen, stack, names = set(), [y.grad_fn], set()
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        names.add(n.name)
        stack.extend(e[0] for e in n.edges if e is not None and hasattr(e[0], "edges"))
    return names


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradient_matches_finite_differences(case):
    name, fn, arrays = case
    got, y = analytic(fn, arrays)
    want = numeric(fn, arrays, EPS.get(name, 1e-6))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_every_rule_is_checked_by_a_case():
    covered = set()
    for _name, fn, arrays in CASES:
        xs = [af.tensor(a, requires_grad=True) for a in arrays]
        covered |= names_in(fn(*xs))
    missing = (set(_RULES) | set(_VIEW_RULES)) - covered
    assert not missing, f"rules without a finite-difference case: {sorted(missing)}"


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_gradient_matches_pytorch(case):
    torch = pytest.importorskip("torch")
    name, fn, arrays = case
    if name in ("rremainder_scalar", "floor_divide", "floor_divide_scalar", "rfloor_divide_scalar"):
        pytest.skip(
            f"PyTorch has no gradient for {name} (finite differences check this "
            f"rule: zero away from the jumps, as floor's)"
        )
    if name == "scatter_add_src_past_index":
        pytest.skip(
            "PyTorch's scatter_add backward fails when src is larger than the index "
            "(it returns src's gradient in the index's shape); finite differences "
            "check this case"
        )
    got, y = analytic(fn, arrays)
    ts = [torch.tensor(a, requires_grad=True) for a in arrays]

    tfn = _torch_version(fn, torch)
    ty = tfn(*ts)
    w = torch.tensor(np.random.default_rng(1).standard_normal(tuple(ty.shape)))
    (ty * w).sum().backward()
    for g, t in zip(got, ts, strict=True):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-6, atol=1e-8)


def _torch_version(fn, torch):
    """Runs ``fn`` with ``af`` names swapped for torch's (the lambdas call af.X)."""
    import types

    shim = types.SimpleNamespace(
        abs=torch.abs,
        exp=torch.exp,
        log=torch.log,
        sqrt=torch.sqrt,
        tanh=torch.tanh,
        sigmoid=torch.sigmoid,
        relu=torch.relu,
        gelu=lambda a, approximate="none": torch.nn.functional.gelu(a, approximate=approximate),
        clamp=torch.clamp,
        div=torch.div,
        where=lambda c, a, b: torch.where(c, _t(torch, a, c), _t(torch, b, c)),
        softmax=lambda a, dim: torch.softmax(a, dim),
        log_softmax=lambda a, dim: torch.log_softmax(a, dim),
        cat=lambda xs, dim: torch.cat(xs, dim),
        stack=lambda xs, dim: torch.stack(xs, dim),
        tensor=lambda a: torch.tensor(a),
        nn=torch.nn,
        gather=torch.gather,
        scatter_add=torch.scatter_add,
        cumsum=torch.cumsum,
        sort=lambda a, dim=-1, descending=False: torch.sort(
            a, dim=dim, descending=descending, stable=True
        ),
        topk=torch.topk,
    )
    shim.maximum = lambda a, b: torch.maximum(_t(torch, a, b), _t(torch, b, a))
    shim.minimum = lambda a, b: torch.minimum(_t(torch, a, b), _t(torch, b, a))
    g = dict(fn.__globals__)
    g["af"] = shim
    g["idx"] = lambda *v: torch.tensor(v, dtype=torch.int64)
    import types as _ty

    return _ty.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)


def _t(torch, v, like):
    if isinstance(v, torch.Tensor):
        return v
    return torch.tensor(v, dtype=like.dtype if like.dtype.is_floating_point else torch.float64)


# -- semantics -----------------------------------------------------------------------------


def test_grad_accumulates_and_none_until_backward():
    x = af.tensor([1.0, 2.0], requires_grad=True)
    assert x.grad is None and x.is_leaf and x.requires_grad
    (x * x).sum().backward()
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2 + 3, 4 + 3])
    x.grad = None
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2, 2])


def test_a_later_gradient_is_added_into_grad_in_place_as_pytorch_does():
    """PyTorch's AccumulateGrad: once a leaf has a ``.grad``, backward adds into it
    (``grad += g``): the same tensor, seen changed by whoever holds it; a ``.grad`` the user
    set as a view of another tensor is replaced by the sum, its base left alone."""
    torch = pytest.importorskip("torch")
    x = af.tensor([1.0, 2.0], requires_grad=True)
    tx = torch.tensor([1.0, 2.0], requires_grad=True)
    (x * x).sum().backward()
    (tx * tx).sum().backward()
    held, theld = x.grad, tx.grad
    (x * 3.0).sum().backward()
    (tx * 3.0).sum().backward()
    assert (x.grad is held) == (tx.grad is theld) == True  # noqa: E712
    np.testing.assert_array_equal(held.numpy(), theld.numpy())
    base = af.zeros(4)
    x.grad = base[:2]
    (x * 3.0).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 3.0])
    np.testing.assert_array_equal(base.numpy(), np.zeros(4))
    w = af.ones(3, requires_grad=True)  # (tied: two gradients in one backward)
    (w * 2.0 + w * 5.0).sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), [7.0, 7.0, 7.0])


def test_requires_grad_in_every_creation_function_has_its_meaning():
    makers = [
        lambda: af.tensor([1.0, 2.0], requires_grad=True),
        lambda: af.zeros(2, requires_grad=True),
        lambda: af.ones(2, requires_grad=True),
        lambda: af.full((2,), 3.0, requires_grad=True),
        lambda: af.rand(2, requires_grad=True),
        lambda: af.randn(2, requires_grad=True),
        lambda: af.empty(2, requires_grad=True),
        lambda: af.arange(2, dtype=af.float32, requires_grad=True),
        lambda: af.zeros_like(af.ones(2), requires_grad=True),
    ]
    for make in makers:
        x = make()
        assert x.requires_grad and x.is_leaf
        (x * 2.0).sum().backward()
        np.testing.assert_allclose(x.grad.numpy(), [2.0, 2.0])
    with pytest.raises(RuntimeError, match="floating point"):
        af.tensor([1, 2], requires_grad=True)


def test_no_grad_detach_and_grad_mode():
    x = af.tensor([1.0, 2.0], requires_grad=True)
    with af.no_grad():
        y = x * 2
    assert not y.requires_grad and y.grad_fn is None
    z = x.detach() * 2
    assert not z.requires_grad
    assert (x * 2).grad_fn.name == "mul_scalar" and "grad_fn=<mul_scalar>" in repr(x * 2)

    @af.no_grad()
    def f(t):
        return t * 2

    assert not f(x).requires_grad and af.is_grad_enabled()
    with af.set_grad_enabled(False):
        assert not (x * 2).requires_grad
        with af.enable_grad():
            assert (x * 2).requires_grad
    assert af.is_grad_enabled()


def test_inplace_on_a_leaf_that_requires_grad_is_refused_but_fine_under_no_grad():
    w = af.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad.*no_grad"):
        w.add_(1.0)
    with af.no_grad():
        w.add_(1.0)
    np.testing.assert_allclose(w.numpy(), [2, 2, 2])
    assert (w * 1.0).sum().item() == 6.0  # the runtime keeps working after the error


def test_modifying_a_tensor_saved_for_backward_raises_a_clear_error():
    x = af.tensor([1.0, 2.0], requires_grad=True)
    h = x * 1.0
    y = (h * h).sum()  # mul saves h
    h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_second_backward_needs_retain_graph():
    x = af.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    np.testing.assert_allclose(x.grad.numpy(), [4, 8])
    with pytest.raises(RuntimeError, match="second time.*retain_graph=True"):
        y.backward()


def test_retain_grad_and_non_scalar_backward():
    x = af.tensor([1.0, 2.0], requires_grad=True)
    h = x * 3.0
    h.retain_grad()
    y = h * h
    with pytest.raises(RuntimeError, match="one-element outputs"):
        y.backward()
    y.backward(af.tensor([1.0, 1.0]))
    np.testing.assert_allclose(h.grad.numpy(), [6, 12])
    np.testing.assert_allclose(x.grad.numpy(), [18, 36])
    with pytest.raises(RuntimeError, match="does not require grad"):
        af.tensor([1.0]).backward()


def test_shared_subexpressions_accumulate_deterministically():
    def run():
        x = af.tensor(np.linspace(-1, 1, 7, dtype=np.float32), requires_grad=True)
        h = af.tanh(x)
        y = (h * h + h.exp() * 3.0 + af.sigmoid(h)).sum()
        y.backward()
        return x.grad.numpy()

    a, b = run(), run()
    assert np.array_equal(a, b)  # bit for bit: the same order every time
    x = np.linspace(-1, 1, 7, dtype=np.float64)
    h = np.tanh(x)
    s = 1 / (1 + np.exp(-h))
    want = (2 * h + 3 * np.exp(h) + s * (1 - s)) * (1 - h * h)
    np.testing.assert_allclose(a, want, rtol=1e-5)


def test_float32_grads_stay_float32_and_mixed_dtypes_cast_back():
    x = af.tensor([1.0, 2.0], requires_grad=True)  # float32
    y = af.tensor([0.5, 0.25], dtype=af.float64)
    (x * y).sum().backward()
    assert x.grad.dtype is af.float32
    np.testing.assert_allclose(x.grad.numpy(), [0.5, 0.25])


def test_a_view_grad_is_a_contiguous_leaf_grad():
    x = af.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    x.expand(4, 3).sum().backward()
    assert x.grad.is_contiguous()
    np.testing.assert_allclose(x.grad.numpy(), [[4, 4, 4]])


def test_inplace_on_a_non_leaf_rebases_its_history():
    x = af.tensor([1.0, 2.0], requires_grad=True)
    h = x * 2.0
    h.mul_(3.0)
    h.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [6, 6])
    h2 = x * 2.0
    h2.zero_()  # overwritten by values that need no grad:
    assert h2.requires_grad and not h2.is_leaf  # still in autograd, as in PyTorch
    x.grad = None
    (h2 + x).sum().backward()  # nothing flows back past the write
    np.testing.assert_allclose(x.grad.numpy(), [1, 1])


# -- review regressions ----------------------------------------------------------------------


def test_inplace_ops_on_non_leaves_use_the_values_before_the_write():
    x = af.tensor([0.5, 1.5, 2.0]).requires_grad_()
    w = af.tensor([1.0, 3.0, 4.0]).requires_grad_()
    y = x * 1
    y.mul_(w)
    y.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [0.5, 1.5, 2.0])  # x, not x * w
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 3.0, 4.0])
    x = af.tensor([0.5, 1.5, 2.0]).requires_grad_()
    buf = af.zeros(3)
    buf.add_(x)
    buf.mul_(x)  # x * x
    buf.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.0, 3.0, 4.0])


def test_a_view_of_a_base_written_since_refuses_to_backward():
    x = af.tensor([1.0, 2.0, 3.0]).requires_grad_()
    y = x * 1
    v = y[1:]
    y.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        v.sum().backward()


def test_writing_a_grad_value_into_a_slice_is_refused_not_lost():
    y = af.tensor([2.0, 3.0]).requires_grad_()
    x = af.zeros(3)
    with pytest.raises(RuntimeError, match="view.*out of place"):
        x[1:] = y
    h = y * 1.0
    h[af.tensor([0])] = 5.0  # index assignment records index_put
    h[af.tensor([1])] = 6.0  # (twice: no false in-place error)
    (h * y).sum().backward()
    np.testing.assert_allclose(y.grad.numpy(), [5.0, 6.0])


def test_set_grad_enabled_as_a_decorator_and_bare_no_grad():
    x = af.ones(2, requires_grad=True)

    @af.set_grad_enabled(False)
    def evaluate():
        return (x * 2).requires_grad

    assert af.is_grad_enabled() and evaluate() is False and af.is_grad_enabled()

    @af.no_grad
    def bare():
        return (x * 2).requires_grad

    @af.no_grad()
    def steps():
        yield (x * 2).requires_grad
        yield (x * 3).requires_grad

    assert bare() is False and list(steps()) == [False, False] and af.is_grad_enabled()


def test_grads_are_never_shared_between_leaves_or_with_the_callers_gradient():
    a, b = af.ones(3).requires_grad_(), af.ones(3).requires_grad_()
    g = af.ones(3)
    (a + b).backward(g)
    assert a.grad is not b.grad and a.grad is not g
    with af.no_grad():
        af.mul_(a.grad, 0.5)
    np.testing.assert_allclose(b.grad.numpy(), [1, 1, 1])
    np.testing.assert_allclose(g.numpy(), [1, 1, 1])
    x = af.ones(2).requires_grad_()
    x.backward(af.ones(2, dtype=af.float64))
    assert x.grad.dtype is af.float32


def test_backward_twice_through_nodes_that_saved_nothing():
    x = af.tensor([1.0, 2.0]).requires_grad_()
    loss = (x + 1).sum()
    loss.backward()
    loss.backward()  # PyTorch allows it: nothing was freed
    np.testing.assert_allclose(x.grad.numpy(), [2, 2])


def test_pow_at_a_zero_base_and_floor_divide_give_pytorchs_gradients():
    x = af.tensor([0.0, 2.0], requires_grad=True)
    e = af.tensor([0.0, 3.0], requires_grad=True)
    af.pow(x, e).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [0, 12])
    np.testing.assert_allclose(e.grad.numpy(), [0, 8 * np.log(2)], rtol=1e-6)
    z = af.tensor([1.0, 2.0], requires_grad=True)
    (0**z).sum().backward()
    np.testing.assert_allclose(z.grad.numpy(), [0, 0])
    w = af.tensor([1.5, 2.5], requires_grad=True)
    (w // 1.0).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), [0, 0])


def _cpu_in_use():
    af.synchronize()
    af.lowlevel.get_vm().collect_releases()
    return af.lowlevel.memory_stats("cpu").in_use


@pytest.mark.parametrize("n", [1000, 1 << 19])  # small blobs and queued big ones
def test_saved_outputs_make_no_cycle_memory_returns_without_the_cycle_collector(n):
    import gc

    x = af.ones(n, requires_grad=True)
    gc.collect()
    base = _cpu_in_use()
    gc.disable()
    try:
        y = x.exp()  # exp saves its output
        z = (y * 2).sum()
        assert _cpu_in_use() > base
        del y, z  # no backward: freed at once
        assert _cpu_in_use() == base
        y = x.tanh()
        z = y.sum()
        del y  # the node still reads it...
        z.backward()  # ...so backward works
        np.testing.assert_allclose(x.grad.numpy()[:3], [1 - np.tanh(1.0) ** 2] * 3, rtol=1e-6)
        del z
        x.grad = None
        assert _cpu_in_use() == base
    finally:
        gc.enable()


def test_a_detached_tensor_is_written_in_place_as_in_pytorch():
    torch = pytest.importorskip("torch")
    a = af.tensor([1.0, 2.0], requires_grad=True)
    d = a.detach()
    assert not d.requires_grad and d.grad_fn is None
    d.add_(10)  # shares a's storage: a changes too
    np.testing.assert_array_equal(a.detach().numpy(), [11.0, 12.0])
    ta = torch.tensor([1.0, 2.0], requires_grad=True)
    ta.detach().add_(10)
    np.testing.assert_array_equal(a.detach().numpy(), ta.detach().numpy())
    m = af.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    m[0].detach().mul_(10)  # a detached view, and a view of one
    m.detach()[1].add_(5)
    np.testing.assert_array_equal(m.detach().numpy(), [[10.0, 20.0], [8.0, 9.0]])
    b = af.tensor([1.0, 2.0], requires_grad=True)
    y = (b * b).sum()  # saves b for backward
    b.detach().add_(1)  # the version counter is shared
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()
    c = af.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        c.add_(1)  # the original itself is still protected
    v = c[0:1]
    with pytest.raises(RuntimeError, match="view"):
        v.add_(1)  # and so is a view of it
    dd = a.detach()
    del a
    np.testing.assert_array_equal(dd.numpy(), [11.0, 12.0])  # the storage outlives a
