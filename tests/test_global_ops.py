"""Global tensors against local ones: every registry op under every SBP signature its rule
lists, on 1, 2 and 3 ranks with uneven splits (a dim of 5 over 2 or 3 ranks, of 2 over 3:
a rank holding nothing); boxing between every pair of layouts; views of global tensors;
and autograd through a data-parallel MLP.

The op samples are calls of the public functions on local tensors, recorded as the eager
interpreter receives them (so the attrs are the functional layer's own, backward ops
included); each recorded call is replayed on global inputs laid out as a signature asks
(then boxing costs nothing and the interpreter picks that signature: ``CHOSEN`` says it
did) and its outputs compared with the op on the local inputs, and their layouts with the
signature's."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import actorflow as af
from actorflow import functional as F
from actorflow.eager.interpreter import EagerInterpreter, apply, use_interpreter
from actorflow.nn import functional as NF
from actorflow.ops import get as op_def
from actorflow.ops.registry import all_ops as _all_ops
from actorflow.parallel import interpreter as gi
from actorflow.parallel import rules
from actorflow.parallel.ranks import ranks_of
from actorflow.sbp import broadcast, layout, partial_sum, split, split_sizes
from actorflow.tensor.tensor import wrap


def all_ops() -> dict:
    """The library's ops (other test files register ops of their own into the same
    registry while this file's tests run, under xdist in any order)."""
    return {n: op for n, op in _all_ops().items() if op.infer.__module__.startswith("actorflow.")}


B, P, S = broadcast, partial_sum, split
KS = (1, 2, 3)
_COPY = op_def("copy")

# Ops with no rule of their own (the all-broadcast signature alone), and why.
BROADCAST_ONLY = {
    # factories take no signature: the global interpreter makes each rank's part itself
    # (interpreter._factory), tested below for every layout
    "empty": "factory: parts made by the global interpreter",
    "full": "factory: parts made by the global interpreter",
    "arange": "factory: parts made by the global interpreter",
    "rand": "factory: parts made by the global interpreter",
    "randn": "factory: parts made by the global interpreter",
    # a draw of a part would be other values than the whole draw's slice
    "rand_step": "draws by the whole shape: each rank draws the whole",
    "randn_step": "draws by the whole shape: each rank draws the whole",
    # value-dependent output shapes (the interpreter runs them broadcast)
    "masked_index": "dynamic: the output's shape depends on the mask's values",
    "nonzero": "dynamic: the output's shape depends on the values",
}

# ops whose outputs sum many products: a split changes the summation order, so they are
# compared within a tight tolerance (every op is, under a partial sum)
ACCUMULATE = {
    "matmul", "sum", "mean", "cumsum", "softmax", "log_softmax", "softmax_backward",
    "conv2d", "conv_transpose2d", "conv2d_weight", "fold", "avg_pool2d", "avg_pool2d_backward",
    "adaptive_avg_pool2d", "adaptive_avg_pool2d_backward", "max_pool2d_backward",
    "layer_norm", "layer_norm_backward", "batch_norm", "batch_norm_backward",
    "scatter_add", "index_add", "pad_backward",
}  # fmt: skip


# -- recording the functional layer's calls ------------------------------------------------


class _Recorder(EagerInterpreter):
    """Runs every op call eagerly and keeps (op, copies of its inputs, attrs, device,
    in place?) (the copies taken before the call: an in-place op writes its input)."""

    def __init__(self) -> None:
        self.calls: list = []

    def apply(self, op, inputs, attrs, device=None, outs=None):
        snap = [EagerInterpreter.apply(self, _COPY, [i], {})[0] for i in inputs]
        self.calls.append((op, snap, dict(attrs), device, outs is not None))
        return EagerInterpreter.apply(self, op, inputs, attrs, device, outs)


def _t(a, grad: bool = False) -> af.Tensor:
    return af.tensor(np.asarray(a), dtype=_DT[np.asarray(a).dtype], requires_grad=grad)


_DT = {
    np.dtype(np.float16): af.float16,
    np.dtype(np.float32): af.float32,
    np.dtype(np.float64): af.float64,
    np.dtype(np.int64): af.int64,
    np.dtype(np.int32): af.int32,
    np.dtype(np.bool_): af.bool_,
}


def _vals(rng, shape, positive: bool = False) -> np.ndarray:
    """float32 values that are multiples of 1/4 in [-4, 4] ((0, 4] positive): partial sums
    of them are exact."""
    v = rng.integers(1 if positive else -16, 17, size=shape) / 4
    return v.astype(np.float32)


# -- samples: each a function of a numpy generator calling public functions ----------------

SAMPLES: dict[str, list[Callable]] = {}


def sample(*names: str) -> Callable:
    def register(fn: Callable) -> Callable:
        for n in names:
            SAMPLES.setdefault(n, []).append(fn)
        return fn

    return register


_UNARY_POSITIVE = {"log", "sqrt", "rsqrt"}
_INT_OPS = {"bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not"}
_BOOL_OPS = {"logical_and", "logical_or", "logical_not"}
_DIVIDING = {"div", "floor_divide", "remainder", "trunc_divide", "pow"}


def _elementwise_sample(name: str) -> Callable:
    """A call of an elementwise op (one without attrs of its own beyond ``scalar``) on a
    (5, 3) tensor, with a (3,) one broadcast against it, or a number."""
    op = op_def(name)
    base = name[1:] if name.startswith("r") and name.endswith("_scalar") else name
    base = base.removesuffix("_scalar")
    scalar = name.endswith("_scalar")

    def make(rng, shape, second: bool = False):
        if base in _INT_OPS:
            return rng.integers(-8, 9, size=shape).astype(np.int64)
        if base in _BOOL_OPS:
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        positive = base in _UNARY_POSITIVE or (base in _DIVIDING and (second or base == "pow"))
        return _vals(rng, shape, positive)

    def call(rng):
        x = _t(make(rng, (5, 3)))
        if len(op.inputs) == 1 and not scalar:
            return apply(op, [x._impl], {})
        if scalar:
            s = 3 if base in _INT_OPS else (True if base in _BOOL_OPS else 1.5)
            return apply(op, [x._impl], {"scalar": s})
        return apply(op, [x._impl, _t(make(rng, (3,), second=True))._impl], {})

    return call


for _n, _op in all_ops().items():
    if _op.elementwise and _op.attrs in ((), ("scalar",)):
        SAMPLES[_n] = [_elementwise_sample(_n)]


@sample("gelu", "gelu_backward")
def _gelu(rng):
    for approximate in ("none", "tanh"):
        x = _t(_vals(rng, (5, 3)), grad=True)
        NF.gelu(x, approximate=approximate).sum().backward()


@sample("silu", "silu_backward")
def _silu(rng):
    x = _t(_vals(rng, (5, 3)), grad=True)
    NF.silu(x).sum().backward()


@sample("clamp", "clamp_tensor")
def _clamp(rng):
    x = _t(_vals(rng, (5, 3)))
    F.clamp(x, -1.0, 2.0)
    F.clamp(x, min=0.5)
    F.clamp(x, _t(_vals(rng, (5, 1))), _t(_vals(rng, (3,))))


@sample("cast", "copy")
def _cast(rng):
    x = _t(_vals(rng, (5, 3)))
    F.cast(x, af.float64)
    F.cast(x, af.int64)
    F.cast(F.cast(x, af.float16), af.float32)
    F.cast(_t(_vals(rng, (5, 3)).astype(np.float64)), af.float32)
    apply(op_def("cast"), [x._impl], {"dtype": af.float32})  # a copy: passes partial sums
    F.clone(x)


@sample("where")
def _where(rng):
    c = _t(rng.integers(0, 2, size=(5, 3)).astype(np.bool_))
    x, y = _t(_vals(rng, (5, 3))), _t(_vals(rng, (3,)))
    F.where(c, x, y)
    F.where(c, x, 0.0)
    F.where(c, 1.5, y)
    F.where(c, 0.0, x)


@sample("sum", "mean", "amax", "amin")
def _reductions(rng):
    x = _t(_vals(rng, (5, 3, 2)))
    for f in (F.sum, F.mean, F.amax, F.amin):
        f(x)
        f(x, 1)
        f(x, (0, 2), keepdim=True)


@sample("argmax", "argmin", "max_dim", "min_dim")
def _arg(rng):
    x = _t(_vals(rng, (5, 3, 2)))
    F.argmax(x, 1)
    F.argmin(x, 0, keepdim=True)
    F.argmax(x)
    F.max(x, 2)
    F.min(x, 1, keepdim=True)


@sample("matmul")
def _matmul(rng):
    F.matmul(_t(_vals(rng, (5, 3))), _t(_vals(rng, (3, 2))))
    F.matmul(_t(_vals(rng, (2, 5, 3))), _t(_vals(rng, (3, 4))))
    F.matmul(_t(_vals(rng, (5, 3))), _t(_vals(rng, (3,))))
    F.matmul(_t(_vals(rng, (3,))), _t(_vals(rng, (3, 5))))
    F.matmul(_t(_vals(rng, (3,))), _t(_vals(rng, (3,))))


@sample("softmax", "log_softmax", "softmax_backward")
def _softmax(rng):
    x = _t(_vals(rng, (5, 3)), grad=True)
    (F.softmax(x, 1) * _t(_vals(rng, (5, 3)))).sum().backward()
    F.log_softmax(x, 0)


@sample("cumsum")
def _cumsum(rng):
    x = _t(_vals(rng, (5, 3)), grad=True)
    (F.cumsum(x, 1) * _t(_vals(rng, (5, 3)))).sum().backward()  # (reverse: its gradient)


@sample("cat", "stack")
def _joining(rng):
    a, b = _t(_vals(rng, (5, 3))), _t(_vals(rng, (5, 2)))
    F.cat([a, b], 1)
    F.stack([a, _t(_vals(rng, (5, 3)))], 1)


@sample("triu", "tril")
def _triangle(rng):
    x = _t(_vals(rng, (3, 5, 4)))
    F.triu(x, 1)
    F.tril(x, -1)


@sample("sort", "topk")
def _sort(rng):
    x = _t(rng.integers(0, 4, size=(5, 3)).astype(np.float32))  # ties
    F.sort(x, 0)
    F.sort(x, 1, descending=True)
    F.topk(x, 2, dim=0)


@sample("gather", "scatter_add")
def _gather(rng):
    x = _t(_vals(rng, (5, 3)), grad=True)
    idx = _t(rng.integers(0, 5, size=(4, 3)))
    (F.gather(x, 0, idx) * _t(_vals(rng, (4, 3)))).sum().backward()
    idx2 = _t(rng.integers(0, 3, size=(5, 3)))
    F.gather(x.detach(), 1, idx2)
    F.scatter_add(_t(_vals(rng, (5, 3))), 0, idx, _t(_vals(rng, (4, 3))))
    F.scatter_add(_t(_vals(rng, (5, 3))), 1, idx2, _t(_vals(rng, (5, 3))))


@sample("index", "index_add")
def _index(rng):
    w = _t(_vals(rng, (5, 3)), grad=True)
    idx = _t(rng.integers(0, 5, size=(2, 3)))
    (NF.embedding(idx, w) * _t(_vals(rng, (2, 3, 3)))).sum().backward()  # ROWS, bounds
    x = _t(_vals(rng, (5, 3)), grad=True)
    (x[:, _t(np.array([2, 0, 2]))] * _t(_vals(rng, (5, 3)))).sum().backward()
    x = _t(_vals(rng, (5, 3, 2)), grad=True)  # by one index in the middle, more dims after
    (x[:, _t(np.array([[2, 0], [1, 1]]))] * _t(_vals(rng, (5, 2, 2, 2)))).sum().backward()
    x[_t(np.array(3))]  # (a 0-dim index)
    x[_t(np.array([1, 2])), :, _t(np.array([0, 1]))]  # (two index tensors: linear only)


@sample("class_index")
def _class_index(rng):
    logits = _t(_vals(rng, (5, 3)))
    NF.cross_entropy(logits, _t(np.array([0, 2, -100, 1, 2])))


@sample("index_put", "masked_index", "nonzero")
def _dynamic(rng):
    x = _t(_vals(rng, (5, 3)))
    x[_t(np.array([1, 3]))] = 2.5
    x[_t(np.array([0, 4]))] = _t(_vals(rng, (2, 3)))
    mask = rng.integers(0, 2, size=(5, 3)).astype(np.bool_)
    x[_t(mask)] = 1.5  # (a mask of the whole shape: split alike)
    x[_t(~mask)] = _t(np.float32(-0.5))
    x[_t(rng.integers(0, 2, size=(5, 3)).astype(np.bool_))]
    F.nonzero(x > 0)


@sample("pad", "pad_backward")
def _pad(rng):
    for mode, value in (("constant", None), ("constant", 1.5), ("reflect", None)):
        x = _t(_vals(rng, (5, 3, 4)), grad=True)
        y = F.pad(x, (1, 2), mode=mode, value=value)
        (y * _t(_vals(rng, tuple(y.shape)))).sum().backward()
    x = _t(_vals(rng, (5, 3, 4)), grad=True)
    y = F.pad(x, (1, 0, 0, 1), mode="replicate")
    (y * _t(_vals(rng, tuple(y.shape)))).sum().backward()


@sample("layer_norm", "layer_norm_backward")
def _layer_norm(rng):
    x = _t(_vals(rng, (5, 2, 3)), grad=True)
    w, b = _t(_vals(rng, (3,)), grad=True), _t(_vals(rng, (3,)), grad=True)
    (NF.layer_norm(x, (3,), w, b) * _t(_vals(rng, (5, 2, 3)))).sum().backward()
    x = _t(_vals(rng, (5, 2, 3)), grad=True)
    (NF.layer_norm(x, (2, 3)) * _t(_vals(rng, (5, 2, 3)))).sum().backward()


@sample("batch_norm", "batch_norm_backward")
def _batch_norm(rng):
    x = _t(_vals(rng, (4, 5, 2, 3)), grad=True)
    w, b = _t(_vals(rng, (5,), True), grad=True), _t(_vals(rng, (5,)), grad=True)
    y = NF.batch_norm(x, None, None, w, b, training=True)
    (y * _t(_vals(rng, (4, 5, 2, 3)))).sum().backward()
    x = _t(_vals(rng, (4, 3, 2)), grad=True)  # (no affine; 3 channels over 2 ranks)
    (NF.batch_norm(x, None, None, training=True) * _t(_vals(rng, (4, 3, 2)))).sum().backward()


def test_batch_norm_on_a_rank_holding_no_channel():
    p = af.placement("cpu", 3)
    x = _vals(np.random.default_rng(0), (4, 2, 3))
    y = NF.batch_norm(_t(x).to_global(p, S(1)), None, None, training=True)
    np.testing.assert_allclose(
        y.numpy(), NF.batch_norm(_t(x), None, None, training=True).numpy(), rtol=1e-5
    )


@sample("conv2d", "conv2d_weight", "conv_transpose2d")
def _conv(rng):
    x = _t(_vals(rng, (2, 5, 4, 4)), grad=True)
    w = _t(_vals(rng, (4, 5, 3, 3)), grad=True)
    (NF.conv2d(x, w, padding=1) * _t(_vals(rng, (2, 4, 4, 4)))).sum().backward()
    x = _t(_vals(rng, (2, 4, 5, 5)), grad=True)
    w = _t(_vals(rng, (6, 2, 3, 3)), grad=True)
    y = NF.conv2d(x, w, stride=2, groups=2)
    (y * _t(_vals(rng, tuple(y.shape)))).sum().backward()
    NF.conv_transpose2d(_t(_vals(rng, (2, 5, 3, 3))), _t(_vals(rng, (5, 3, 2, 2))), stride=2)


@sample("unfold", "fold")
def _unfold(rng):
    x = _t(_vals(rng, (3, 2, 4, 4)))
    cols = F.unfold(x, 2)
    F.fold(cols, (4, 4), 2)


@sample("max_pool2d", "max_pool2d_backward", "avg_pool2d", "avg_pool2d_backward")
def _pools(rng):
    for pool in (F.max_pool2d, F.avg_pool2d):
        x = _t(_vals(rng, (3, 5, 4, 4)), grad=True)
        y = pool(x, 2)
        (y * _t(_vals(rng, tuple(y.shape)))).sum().backward()


def test_max_pool_backward_on_a_rank_holding_no_sample():
    p = af.placement("cpu", 3)
    a = _vals(np.random.default_rng(0), (2, 3, 4, 4))
    x = _t(a).to_global(p, S(0)).requires_grad_()
    F.max_pool2d(x, 2).sum().backward()
    want = _t(a, grad=True)
    F.max_pool2d(want, 2).sum().backward()
    np.testing.assert_array_equal(x.grad.numpy(), want.grad.numpy())


@sample("adaptive_avg_pool2d", "adaptive_avg_pool2d_backward")
def _adaptive(rng):
    x = _t(_vals(rng, (3, 5, 5, 4)), grad=True)
    y = F.adaptive_avg_pool2d(x, (2, 3))
    (y * _t(_vals(rng, tuple(y.shape)))).sum().backward()


@sample("empty", "full", "arange", "rand", "randn")
def _factories(rng):
    af.empty(5, 3)
    af.full((5, 3), 2.5)
    af.arange(7)
    af.arange(1.5, 4.0, 0.5)
    af.rand(5, 3)
    af.randn(2, 5)


@sample("rand_step", "randn_step")
def _step_draws(rng):
    count = _t(np.array(4, dtype=np.int64))
    for name in ("rand_step", "randn_step"):
        attrs = {"shape": (5, 3), "dtype": af.float32, "device": af.device("cpu")}
        apply(op_def(name), [count._impl], dict(attrs, key=(11, 2)))


@functools.cache
def recorded(name: str) -> list:
    """The calls of op ``name`` its samples make: (op, numpy inputs, attrs, device, in
    place?)."""
    out = []
    for n, fn in enumerate(SAMPLES[name]):
        rec = _Recorder()
        with use_interpreter(rec):
            fn(np.random.default_rng(n))
        for op, snap, attrs, device, in_place in rec.calls:
            if op.name == name:
                out.append((op, [wrap(i).numpy() for i in snap], attrs, device, in_place))
    assert out, f"the samples of {name!r} make no call of it"
    return out


# -- replaying on global tensors -----------------------------------------------------------


def to_global(a: np.ndarray, p, sbp, rng) -> af.Tensor:
    """``a`` as a global tensor laid out ``sbp``; a partial sum's summands are random
    (integers, so they add back to ``a`` exactly) on every rank."""
    if sbp.kind != "P" or a.dtype == np.bool_:
        return _t(a).to_global(p, sbp)
    ranks = ranks_of(p)
    k = ranks.size
    parts = [rng.integers(-3, 4, size=a.shape).astype(a.dtype) for _ in range(k - 1)]
    parts.append(a - sum(parts, np.zeros_like(a)))
    impls = [ranks.put(r, _t(x)._impl) for r, x in enumerate(parts)]
    return wrap(gi.make(ranks, impls, a.shape, _DT[a.dtype], P))


def _compare(name: str, got: np.ndarray, want: np.ndarray, exact: bool, what: str) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    if exact or want.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=what)


def check_op(name: str) -> int:
    """Every signature of every recorded call of ``name`` on 1, 2 and 3 ranks against the
    local call; returns how many (call, k, signature) it ran."""
    runs = 0
    for op, arrays, attrs, device, in_place in recorded(name):
        if not arrays:  # a factory: each layout of its output
            _check_factory(op, attrs, device)
            runs += 1
        else:
            runs += check_call(op, arrays, attrs, in_place)
    return runs


def check_call(op, arrays: list, attrs: dict, in_place: bool = False) -> int:
    """Every signature of one call of ``op`` on 1, 2 and 3 ranks: the interpreter picks it
    for inputs laid out so, and its outputs equal the local call's, laid out as it says."""
    runs = 0
    rng = np.random.default_rng(0)
    local = [_t(a)._impl for a in arrays]
    want = apply(op, local, attrs, None, [local[0]] if in_place else None)
    want = [wrap(w).numpy() for w in want]
    metas = [i.meta for i in local]
    specs = op.infer(metas, attrs)
    dynamic = any(s is None for s, _ in specs)
    sigs = (
        [((B,) * len(arrays), (B,) * len(specs))]
        if dynamic
        else rules.signatures(op, metas, attrs, len(specs))
    )
    for k in KS:
        p = af.placement("cpu", k)
        for sig in sigs:
            what = f"{op.name} {attrs} inputs {[a.shape for a in arrays]} k={k} {sig}"
            if in_place and sig[1][0] != sig[0][0]:
                continue  # (an in-place call's output is its input)
            ins = [to_global(a, p, s, rng)._impl for a, s in zip(arrays, sig[0], strict=True)]
            gi.CHOSEN[0] = None
            outs = apply(op, ins, attrs, None, [ins[0]] if in_place else None)
            assert gi.CHOSEN[0] == sig, f"{what}: the interpreter chose {gi.CHOSEN[0]}"
            exact = op.name not in ACCUMULATE and P not in sig[0] + sig[1]
            for n, (o, w) in enumerate(zip(outs, want, strict=True)):
                assert o.meta.device.sbp == (sig[1][n],), what
                _compare(op.name, wrap(o).numpy(), w, exact, f"{what}: output {n}")
            runs += 1
    return runs


_CALLS = sorted(n for n, op in all_ops().items() if op.inputs)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(_CALLS), k=st.sampled_from(KS), data=st.data())
def test_op_on_inputs_in_any_layout_equals_local(name, k, data):
    """Inputs laid out at random (the interpreter boxes them to the signature it picks):
    the result equals the local call's."""
    calls = recorded(name)
    op, arrays, attrs, _, in_place = calls[data.draw(st.integers(0, len(calls) - 1))]
    p = af.placement("cpu", k)
    rng = np.random.default_rng(k)
    layouts = []
    for n, a in enumerate(arrays):
        choices = [S(d) for d in range(a.ndim)] + [B, P]
        layouts.append(B if in_place and n == 0 else data.draw(st.sampled_from(choices)))
    local = [_t(a)._impl for a in arrays]
    want = apply(op, local, attrs, None, [local[0]] if in_place else None)
    ins = [to_global(a, p, s, rng)._impl for a, s in zip(arrays, layouts, strict=True)]
    got = apply(op, ins, attrs, None, [ins[0]] if in_place else None)
    for n, (o, w) in enumerate(zip(got, want, strict=True)):
        _compare(name, wrap(o).numpy(), wrap(w).numpy(), False, f"{name} {layouts} k={k} #{n}")


def _check_factory(op, attrs, device) -> None:
    want = wrap(apply(op, [], attrs, device=device)[0]).numpy()
    for k in KS:
        p = af.placement("cpu", k)
        for sbp in [S(d) for d in range(want.ndim)] + [B, P]:
            lay = layout(p, (sbp,))
            out = apply(op, [], dict(attrs, device=lay), device=lay)[0]
            assert out.meta.device is lay
            got = wrap(out).numpy()
            assert got.shape == want.shape and got.dtype == want.dtype
            if op.name != "empty":  # (empty's values are whatever memory held)
                np.testing.assert_array_equal(got, want, err_msg=f"{op.name} k={k} {sbp}")


@pytest.mark.parametrize("name", sorted(all_ops()))
def test_op_under_every_signature_equals_local(name):
    assert name in SAMPLES, f"no sample call of op {name!r} here: add one"
    assert check_op(name) > 0


def test_every_op_has_a_rule_or_a_reason():
    ops = all_ops()
    for name, op in ops.items():
        ruled = name in rules.RULES or op.elementwise
        if name in BROADCAST_ONLY:
            assert not ruled, f"{name!r} has a rule: take it off BROADCAST_ONLY"
        else:
            assert ruled, f"op {name!r} has no sbp rule (only the all-broadcast fallback)"
    assert set(BROADCAST_ONLY) <= set(ops)


def test_rules_list_parallel_signatures_for_the_samples():
    """A rule that lists nothing but all-broadcast for its samples would test nothing."""
    for name in sorted(all_ops()):
        if name in BROADCAST_ONLY:
            continue
        n_parallel = 0
        for op, arrays, attrs, _, _ in recorded(name):
            metas = [_t(a)._impl.meta for a in arrays]
            n_out = len(op.infer(metas, attrs))
            n_parallel += len(rules.signatures(op, metas, attrs, n_out)) - 1
        assert n_parallel, f"{name!r}: its rule lists no parallel signature for its samples"


def test_a_rule_picks_the_cheapest_signature():
    """With the inputs split on the batch, a matmul by a broadcast weight runs split (no
    boxing), and a layer norm's gradient comes back partial for the weight."""
    p = af.placement("cpu", 3)
    x = _t(_vals(np.random.default_rng(1), (5, 3))).to_global(p, S(0))
    w = _t(_vals(np.random.default_rng(2), (3, 4))).to_global(p, B)
    y = x @ w
    assert gi.CHOSEN[0] == ((S(0), B), (S(0),)) and y.sbp == (S(0),)
    np.testing.assert_array_equal(y.numpy(), x.numpy() @ w.numpy())
    sums = y.sum(0)
    assert sums.sbp == (P,)


# -- boxing --------------------------------------------------------------------------------

LAYOUTS = [S(0), S(1), B, P]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("shape", [(5, 2), (2, 3), (1, 4)])
def test_boxing_every_pair(k, shape):
    p = af.placement("cpu", k)
    rng = np.random.default_rng(k)
    a = _vals(rng, shape)
    for src in LAYOUTS:
        for dst in LAYOUTS:
            g = to_global(a, p, src, rng).to_global(sbp=dst)
            what = f"{src} -> {dst}, shape {shape}, k={k}"
            assert g.sbp == (dst,), what
            np.testing.assert_array_equal(g.numpy(), a, err_msg=what)
            parts = [g.to_local(rank=r).numpy() for r in range(k)]
            if dst.kind == "S":
                want = np.split(a, np.cumsum(split_sizes(a.shape[dst.dim], k))[:-1], dst.dim)
                for r in range(k):
                    np.testing.assert_array_equal(parts[r], want[r], err_msg=what)
            elif dst.kind == "B":
                for r in range(k):
                    np.testing.assert_array_equal(parts[r], a, err_msg=what)
            else:
                np.testing.assert_array_equal(sum(parts), a, err_msg=what)


def test_boxing_integers_and_bools():
    p = af.placement("cpu", 3)
    a = np.arange(10, dtype=np.int64).reshape(5, 2)
    for src in LAYOUTS:
        for dst in LAYOUTS:
            g = _t(a).to_global(p, src).to_global(sbp=dst)
            np.testing.assert_array_equal(g.numpy(), a)
    m = a % 3 == 0
    for src in (S(0), S(1), B):
        for dst in (S(0), S(1), B):
            np.testing.assert_array_equal(_t(m).to_global(p, src).to_global(sbp=dst).numpy(), m)


# -- views ---------------------------------------------------------------------------------

VIEWS = [
    ("permute", lambda t: t.permute(2, 0, 1)),
    ("transpose", lambda t: t.transpose(0, 2)),
    ("view", lambda t: t.view(5, 6)),
    ("view split", lambda t: t.view(5, 3, 2, 1)),
    ("reshape", lambda t: t.reshape(15, 2)),
    ("flatten", lambda t: t.reshape(-1)),
    ("unsqueeze", lambda t: t.unsqueeze(1)),
    ("squeeze", lambda t: t.unsqueeze(0).squeeze(0)),
    ("expand", lambda t: t.unsqueeze(0).expand(4, 5, 3, 2)),
    ("index", lambda t: t[1:4, :, 0]),
    ("index int", lambda t: t[:, 1]),
    ("index step", lambda t: t[::2, None, ..., 1]),
    ("index all", lambda t: t[:, :, :]),
]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("name,fn", VIEWS, ids=[v[0] for v in VIEWS])
def test_views_of_global_tensors_equal_local(k, name, fn):
    rng = np.random.default_rng(3)
    a = _vals(rng, (5, 3, 2))
    want = fn(_t(a)).numpy()
    p = af.placement("cpu", k)
    for sbp in (S(0), S(1), S(2), B, P):
        g = fn(to_global(a, p, sbp, rng))
        assert g.is_global
        np.testing.assert_array_equal(g.numpy(), want, err_msg=f"{name} of {sbp}, k={k}")
        # and the view computes on: its layout is one the interpreter can box
        np.testing.assert_array_equal((g * 2).numpy(), want * 2)


# -- autograd ------------------------------------------------------------------------------


@pytest.mark.parametrize("k", KS)
def test_data_parallel_mlp_gradients_equal_local(k):
    rng = np.random.default_rng(5)
    xs, w1s, w2s = _vals(rng, (7, 4)), _vals(rng, (4, 5)), _vals(rng, (5, 3))

    def loss(x, w1, w2):
        h = F.relu(x @ w1)
        return (F.softmax(h @ w2, 1) * (h @ w2)).sum()

    w1, w2 = _t(w1s, grad=True), _t(w2s, grad=True)
    lo = loss(_t(xs), w1, w2)
    lo.backward()
    p = af.placement("cpu", k)
    g1 = _t(w1s).to_global(p, B).requires_grad_()
    g2 = _t(w2s).to_global(p, B).requires_grad_()
    lg = loss(_t(xs).to_global(p, S(0)), g1, g2)
    lg.backward()
    np.testing.assert_allclose(lg.numpy(), lo.numpy(), rtol=1e-5)
    for g, w in ((g1, w1), (g2, w2)):
        assert g.grad.sbp == (B,)
        np.testing.assert_allclose(g.grad.numpy(), w.grad.numpy(), rtol=1e-5, atol=1e-5)


# -- writing global tensors in place -------------------------------------------------------


def _writes(k: int, sbp, fn: Callable, want_fn: Callable) -> None:
    rng = np.random.default_rng(9)
    a = _vals(rng, (5, 3, 2))
    g = to_global(a, af.placement("cpu", k), sbp, rng)
    fn(g)
    want = a.copy()
    want_fn(want)
    assert g.sbp == (sbp,)
    np.testing.assert_array_equal(g.numpy(), want, err_msg=f"{sbp}, k={k}")


def _set_rows(t):
    t[1:3] = 7.0


def _set_rows_np(a):
    a[1:3] = 7.0


def _set_col(t):
    t[:, 1] = _t(np.full((5, 2), 9.0, np.float32)).to_global(t.placement, t.sbp)


def _set_col_np(a):
    a[:, 1] = 9.0


@pytest.mark.parametrize("k", KS)
def test_in_place_writes_reach_every_part(k):
    """fill_/zero_ (a factory written into the tensor's parts: it wrote nothing before),
    copy_ from a tensor laid out alike, writes through a view that keeps the split dim,
    add_/mul_."""
    for sbp in (S(0), S(1), B, P):
        _writes(k, sbp, lambda t: F.fill_(t, 2.5), lambda a: a.fill(2.5))
        _writes(k, sbp, F.zero_, lambda a: a.fill(0))
        _writes(k, sbp, lambda t: t.mul_(2.0), lambda a: a.__imul__(2))
        _writes(
            k,
            sbp,
            lambda t: F.copy_(t, _t(np.ones((3, 2), np.float32)).to_global(t.placement, t.sbp)),
            lambda a: a.fill(1),
        )
    for sbp in (S(1), B, P):  # (the rows' slice keeps dim 1 whole)
        _writes(k, sbp, _set_rows, _set_rows_np)
    for sbp in (S(0), B, P):
        _writes(k, sbp, lambda t: F.fill_(t[:, :, 1], 4.0), lambda a: a[:, :, 1].fill(4))
        _writes(k, sbp, _set_col, _set_col_np)


def test_a_write_into_a_gathered_view_is_refused():
    """A view that cuts the split dim (rows 1:3 of a tensor split on rows) is a view of a
    gathered copy: a write into it would be lost, so it raises, naming the way out."""
    p = af.placement("cpu", 2)
    a = _vals(np.random.default_rng(4), (5, 3))
    g = _t(a).to_global(p, S(0))
    np.testing.assert_array_equal(g[1:3].numpy(), a[1:3])  # (reading it is fine)
    with pytest.raises(af.DeviceError, match="cannot write in place into this view"):
        g[1:3] = 7.0
    with pytest.raises(af.DeviceError, match="to_global"):
        F.fill_(g[1:3].view(6), 1.0)
    np.testing.assert_array_equal(g.numpy(), a)


def test_copy_between_layouts():
    p = af.placement("cpu", 2)
    a = _vals(np.random.default_rng(4), (5, 3))
    g = _t(np.zeros((5, 3), np.float32)).to_global(p, S(0))
    F.copy_(g, _t(a).to_global(p, B))
    np.testing.assert_array_equal(g.numpy(), a)


# -- shapes drawn at random ----------------------------------------------------------------


def record_calls(fn: Callable) -> list:
    """The op calls ``fn()`` makes: (op, numpy inputs, attrs, in place?)."""
    rec = _Recorder()
    with use_interpreter(rec):
        fn()
    return [
        (op, [wrap(i).numpy() for i in snap], attrs, in_place)
        for op, snap, attrs, _, in_place in rec.calls
        if snap
    ]


def check_calls(fn: Callable) -> None:
    calls = record_calls(fn)
    assert calls
    for op, arrays, attrs, in_place in calls:
        check_call(op, arrays, attrs, in_place)


_dims = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)
_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _stretched(data, shape: tuple) -> tuple:
    """A shape broadcasting to ``shape``: leading dims dropped, some dims made 1."""
    lead = data.draw(st.integers(0, len(shape) - 1))
    return tuple(1 if data.draw(st.booleans()) else n for n in shape[lead:])


@_SETTINGS
@given(shape=_dims, data=st.data())
def test_random_broadcasts(shape, data):
    rng = np.random.default_rng(len(shape))
    a = _t(_vals(rng, _stretched(data, shape)))
    b = _t(_vals(rng, shape))
    c = _t(rng.integers(0, 2, size=_stretched(data, shape)).astype(np.bool_))

    def calls():
        F.add(a, b)
        F.mul(b, a)
        F.maximum(a, b)
        F.where(c, a, b)
        F.where(c, b, 0.0)
        F.clamp(b, a, None)

    check_calls(calls)


@_SETTINGS
@given(shape=_dims, data=st.data())
def test_random_reductions_and_scans(shape, data):
    x = _t(_vals(np.random.default_rng(len(shape)), shape))
    nd = len(shape)
    dims = tuple(sorted(data.draw(st.sets(st.integers(0, nd - 1), min_size=1))))
    dim = data.draw(st.integers(-nd, nd - 1))
    keep = data.draw(st.booleans())

    def calls():
        F.sum(x, dims, keepdim=keep)
        F.mean(x, dims, keepdim=keep)
        F.amax(x, dims, keepdim=keep)
        F.argmin(x, dim, keepdim=keep)
        F.max(x, dim, keepdim=keep)
        F.softmax(x, dim)
        F.cumsum(x, dim)
        F.sort(x, dim)
        F.topk(x, data.draw(st.integers(0, shape[dim])), dim=dim)
        F.cat([x, x], dim)
        F.stack([x, x], data.draw(st.integers(0, nd)))

    check_calls(calls)


@_SETTINGS
@given(
    batch=st.lists(st.integers(1, 3), max_size=2).map(tuple),
    n=st.integers(1, 5),
    m=st.integers(1, 4),
    q=st.integers(1, 5),
    data=st.data(),
)
def test_random_matmuls(batch, n, m, q, data):
    rng = np.random.default_rng(n)
    a = _t(_vals(rng, _stretched(data, batch + (n,))[:-1] + (n, m) if batch else (n, m)))
    b = _t(_vals(rng, (_stretched(data, batch + (1,))[:-1] if batch else ()) + (m, q)))
    v = _t(_vals(rng, (m,)))
    check_calls(lambda: (F.matmul(a, b), F.matmul(a, v), F.matmul(v, b)))


@_SETTINGS
@given(shape=_dims, data=st.data())
def test_random_gathers_and_pads(shape, data):
    rng = np.random.default_rng(len(shape))
    x = _t(_vals(rng, shape))
    nd = len(shape)
    dim = data.draw(st.integers(0, nd - 1))
    ishape = tuple(
        data.draw(st.integers(1, 5)) if d == dim else data.draw(st.integers(1, n))
        for d, n in enumerate(shape)
    )
    idx = _t(rng.integers(0, shape[dim], size=ishape))
    src = _t(_vals(rng, ishape))
    pads = tuple(data.draw(st.integers(0, 2)) for _ in range(2 * data.draw(st.integers(1, nd))))

    def calls():
        F.gather(x, dim, idx)
        F.scatter_add(x, dim, idx, src)
        F.pad(x, pads)
        F.pad(x, pads, value=0.5)

    check_calls(calls)


@_SETTINGS
@given(shape=_dims, k=st.sampled_from(KS), data=st.data())
def test_random_views(shape, k, data):
    rng = np.random.default_rng(len(shape))
    a = _vals(rng, shape)
    nd = len(shape)
    perm = data.draw(st.permutations(range(nd)))
    flat = int(np.prod(shape))
    divisors = [d for d in range(1, flat + 1) if flat % d == 0]
    first = data.draw(st.sampled_from(divisors))
    sbp = data.draw(st.sampled_from([S(d) for d in range(nd)] + [B, P]))
    g = to_global(a, af.placement("cpu", k), sbp, rng)
    for name, got, want in (
        ("permute", g.permute(*perm), a.transpose(perm)),
        ("reshape", g.reshape(first, -1), a.reshape(first, -1)),
        ("view", g.view(*shape, 1), a.reshape(shape + (1,))),
        ("unsqueeze squeeze", g.unsqueeze(nd).squeeze(), a.squeeze()),
        ("index", g[..., : shape[-1] // 2 + 1], a[..., : shape[-1] // 2 + 1]),
    ):
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{name} of {sbp}, k={k}")


def _model(x, ids, target, w):
    h = F.relu(NF.conv2d(x, w["conv"]))
    h = NF.batch_norm(h, None, None, w["bn_w"], w["bn_b"], training=True)
    h = F.avg_pool2d(F.max_pool2d(h, 1), 2)
    e = NF.layer_norm(NF.embedding(ids, w["emb"]), 8, w["ln_w"], w["ln_b"]).mean(1)
    z = F.cat([h.reshape(h.shape[0], -1), e], 1) @ w["lin"]
    return NF.cross_entropy(z, target)


@pytest.mark.parametrize("k", KS)
def test_data_parallel_convnet_gradients_equal_local(k):
    """Convolution, batch norm (split on channels), pools, an embedding, layer norm, cat
    and a loss with the batch split and every weight broadcast: the loss and gradients
    equal local, the gradients broadcast (all-reduced)."""
    rng = np.random.default_rng(6)
    xs, ids, target = (
        _vals(rng, (5, 3, 6, 6)),
        rng.integers(0, 7, (5, 4)),
        np.array([0, 1, 2, 1, 0]),
    )
    shapes = dict(
        conv=(4, 3, 3, 3), emb=(7, 8), ln_w=(8,), ln_b=(8,), lin=(24, 3), bn_w=(4,), bn_b=(4,)
    )
    ws = {n: _vals(rng, s) for n, s in shapes.items()}
    local = {n: _t(a, grad=True) for n, a in ws.items()}
    lo = _model(_t(xs), _t(ids), _t(target), local)
    lo.backward()
    p = af.placement("cpu", k)
    glob = {n: _t(a).to_global(p, B).requires_grad_() for n, a in ws.items()}
    lg = _model(*(_t(a).to_global(p, S(0)) for a in (xs, ids, target)), glob)
    lg.backward()
    np.testing.assert_allclose(lg.numpy(), lo.numpy(), rtol=1e-5)
    for n in ws:
        assert glob[n].grad.sbp == (B,), n
        np.testing.assert_allclose(
            glob[n].grad.numpy(), local[n].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=n
        )
