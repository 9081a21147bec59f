"""Indices out of range are errors, never wrapped: class targets of cross_entropy and
nll_loss and an embedding's indices must be in [0, n) (a negative one does not count from
the end, as in PyTorch); ``x[idx]`` and ``x[idx] = v`` take -n to n-1, as in PyTorch. The
values exist only when the kernel runs, so the error surfaces as a KernelError at the next
sync point in eager mode, as the op's error in nn.Graph, and the runtime keeps working."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.errors import IndexOutOfBoundsError
from actorflow.nn import functional as NF
from test_graph_mode import TrainStep

pytestmark = pytest.mark.timeout(60)

LOGITS = np.array([[1.0, 2.0, 3.0], [1.0, 0.0, 0.0]], np.float32)


def _kernel_error(fn):
    """The KernelError ``fn`` raises (at its read), after checking its kind."""
    with pytest.raises(af.KernelError) as info:
        fn()
    assert isinstance(info.value.original, IndexOutOfBoundsError)
    return info.value


# -- cross_entropy and nll_loss ------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("bad", [-1, -3, 3])
def test_class_targets_out_of_range_raise_naming_the_loss_target_and_range(bad, loss, reduction):
    fn = getattr(NF, loss)
    out = fn(af.tensor(LOGITS), af.tensor([0, bad]), reduction=reduction)
    err = _kernel_error(out.numpy)
    assert err.op == "class_index"
    text = str(err)
    assert f"{loss}: Target {bad} is out of bounds" in text
    assert "[0, 3)" in text and "ignore_index (-100)" in text
    assert f"pass ignore_index={bad}" in text
    # the runtime keeps working, and no second error is left behind (conftest checks)
    assert fn(af.tensor(LOGITS), af.tensor([0, 2]), reduction=reduction).numpy() is not None
    af.synchronize()


def test_loss_modules_raise_on_negative_targets_as_on_too_large_ones():
    lg = af.tensor(LOGITS)
    for module in (nn.CrossEntropyLoss(), nn.NLLLoss()):
        for bad in (-1, -3, 3):
            _kernel_error(lambda module=module, bad=bad: float(module(lg, af.tensor([bad, 0]))))
    assert float(nn.CrossEntropyLoss()(lg, af.tensor([2, 0]))) == pytest.approx(0.4795253)


def test_k_dim_targets_name_the_first_bad_one_and_count_them():
    x = af.tensor(np.zeros((2, 3, 4), np.float32))  # (N, C, d)
    t = np.array([[0, 1, -1, 2], [2, 7, 0, 1]])
    err = _kernel_error(lambda: NF.cross_entropy(x, af.tensor(t)).numpy())
    assert "Target -1 is out of bounds (2 of 8 values are)" in str(err)
    bad_none = NF.nll_loss(x, af.tensor(t), reduction="none")
    assert bad_none.shape == (2, 4)
    _kernel_error(bad_none.numpy)


def test_class_weights_with_a_bad_target_give_one_error():
    lg, w = af.tensor(LOGITS), af.tensor([1.0, 2.0, 3.0])
    for bad in (-1, 3):  # (the weight's gather reads the checked targets)
        loss = NF.cross_entropy(lg, af.tensor([bad, 0]), weight=w)
        err = _kernel_error(loss.numpy)
        assert f"Target {bad}" in str(err)
        af.synchronize()  # nothing else failed


@pytest.mark.parametrize("ignore_index", [-1, 5, -100])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ignore_index_is_the_value_allowed_out_of_range(ignore_index, reduction):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((4, 3, 2))
    t = np.array([[0, ignore_index], [2, 1], [ignore_index, ignore_index], [1, 0]])
    w = np.array([0.5, 2.0, 1.5])
    a, ta = af.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    got = NF.cross_entropy(
        a, af.tensor(t), weight=af.tensor(w), ignore_index=ignore_index, reduction=reduction
    )
    want = torch.nn.functional.cross_entropy(
        ta, torch.tensor(t), weight=torch.tensor(w), ignore_index=ignore_index, reduction=reduction
    )
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-6, atol=1e-12)
    cot = np.random.default_rng(1).standard_normal(want.shape)
    (got * af.tensor(cot)).sum().backward()
    (want * torch.tensor(cot)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("case", ["plain", "weight", "smoothing", "nll"])
def test_gradients_for_valid_targets_match_pytorch(case):
    torch = pytest.importorskip("torch")
    tF = torch.nn.functional
    x = np.random.default_rng(2).standard_normal((5, 4))
    t = np.array([3, 0, 1, 3, 2])
    w = np.array([1.0, 0.5, 2.0, 1.5])
    a, ta = af.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    if case == "plain":
        got, want = NF.cross_entropy(a, af.tensor(t)), tF.cross_entropy(ta, torch.tensor(t))
    elif case == "weight":
        got = NF.cross_entropy(a, af.tensor(t), weight=af.tensor(w))
        want = tF.cross_entropy(ta, torch.tensor(t), weight=torch.tensor(w))
    elif case == "smoothing":
        got = NF.cross_entropy(a, af.tensor(t), label_smoothing=0.2, ignore_index=3)
        want = tF.cross_entropy(ta, torch.tensor(t), label_smoothing=0.2, ignore_index=3)
    else:
        got = NF.nll_loss(NF.log_softmax(a, dim=1), af.tensor(t), reduction="sum")
        want = tF.nll_loss(tF.log_softmax(ta, dim=1), torch.tensor(t), reduction="sum")
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=1e-6)
    got.backward()
    want.backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-6, atol=1e-12)


def test_backward_through_a_bad_target_raises_and_autograd_goes_on():
    a = af.tensor(LOGITS, requires_grad=True)
    loss = NF.cross_entropy(a, af.tensor([-1, 0]))
    loss.backward()  # queued: the error is in the values
    _kernel_error(a.grad.numpy)
    a.grad = None
    loss = NF.cross_entropy(a, af.tensor([2, 0]))
    loss.backward()
    p = np.exp(LOGITS) / np.exp(LOGITS).sum(1, keepdims=True)
    np.testing.assert_allclose(a.grad.numpy(), (p - np.eye(3)[[2, 0]]) / 2, rtol=1e-6)


def test_target_arguments_that_cannot_be_class_indices_are_refused_at_the_call():
    lg = af.tensor(LOGITS)
    with pytest.raises(TypeError, match="nll_loss: target must hold class indices.*bool"):
        NF.nll_loss(lg, af.tensor([True, False]))
    with pytest.raises(TypeError, match="cross_entropy: target must hold class indices"):
        NF.cross_entropy(lg, af.tensor([True, False]))
    with pytest.raises(TypeError, match="ignore_index must be an int"):
        NF.cross_entropy(lg, af.tensor([0, 1]), ignore_index=-1.0)
    with pytest.raises(
        af.errors.ShapeError,
        match=r"weight must hold one value per class: "
        r"shape \(3,\).*got shape \(2,\)",
    ):
        NF.cross_entropy(lg, af.tensor([0, 1]), weight=af.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="reduction must be"):
        NF.nll_loss(lg, af.tensor([0, 1]), reduction="avg")
    with pytest.raises(af.errors.ShapeError, match="with a class dim, got a 0-d input"):
        NF.nll_loss(af.tensor(1.0), af.tensor(0))


# -- embedding -----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, -3, 3, 100])
def test_embedding_indices_out_of_range_raise(bad):
    e = nn.Embedding(3, 2)
    out = e(af.tensor([[0, bad], [1, 2]]))
    err = _kernel_error(out.numpy)
    assert err.op == "index"
    assert f"embedding: index {bad} is out of bounds: valid values are in [0, 3)" in str(err)
    np.testing.assert_array_equal(e(af.tensor([2])).numpy(), e.weight.numpy()[2:])


def test_embedding_with_padding_keeps_checking_and_its_gradient():
    e = nn.Embedding(3, 2, padding_idx=-1)  # row 2, counted from the end
    _kernel_error(e(af.tensor([-1])).numpy)
    out = e(af.tensor([0, 2, 2]))
    np.testing.assert_array_equal(out.numpy()[1:], 0.0)
    out.sum().backward()
    assert e.weight.grad.numpy().tolist() == [[1, 1], [0, 0], [0, 0]]
    e.weight.grad = None
    bad = e(af.tensor([0, -2]))
    _kernel_error(bad.numpy)
    bad.sum().backward()
    _kernel_error(e.weight.grad.numpy)


def test_embedding_gradient_never_lands_on_a_wrapped_row():
    e = nn.Embedding(3, 2)
    e(af.tensor([0, -1])).sum().backward()  # the forward's values never read
    err = _kernel_error(e.weight.grad.numpy)  # (the gather's gradient checks too)
    assert err.op == "index_add" and "embedding: index -1 is out of bounds" in str(err)
    with pytest.raises(af.KernelError, match="op 'index' failed.*embedding: index -1"):
        af.synchronize()  # the forward's own error
    e.weight.grad = None
    e(af.tensor([0, 2, 2])).sum().backward()
    assert e.weight.grad.numpy().tolist() == [[1, 1], [0, 0], [2, 2]]


def test_embedding_arguments_are_checked_at_the_call():
    w = af.tensor(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match=r"padding_idx 5 is outside the 3 embeddings"):
        NF.embedding(af.tensor([0]), w, padding_idx=5)
    with pytest.raises(ValueError, match=r"padding_idx -4"):
        NF.embedding(af.tensor([0]), w, padding_idx=-4)
    with pytest.raises(TypeError, match="indices must be an integer tensor.*bool"):
        NF.embedding(af.tensor([True]), w)
    with pytest.raises(TypeError, match="indices must be an integer tensor.*float"):
        NF.embedding(af.tensor([0.0]), w)


def test_embedding_matches_pytorch_for_valid_indices():
    torch = pytest.importorskip("torch")
    e = nn.Embedding(4, 3, padding_idx=-2, dtype=af.float64)
    te = torch.nn.Embedding(4, 3, padding_idx=-2, dtype=torch.float64)
    with torch.no_grad():
        te.weight.copy_(torch.tensor(e.weight.numpy()))
    idx = np.array([[0, 3, 2], [2, 1, 1]])
    y, ty = e(af.tensor(idx.astype(np.int32))), te(torch.tensor(idx))
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    cot = np.random.default_rng(0).standard_normal((2, 3, 3))
    (y * af.tensor(cot)).sum().backward()
    (ty * torch.tensor(cot)).sum().backward()
    np.testing.assert_allclose(e.weight.grad.numpy(), te.weight.grad.numpy())
    with pytest.raises(IndexError):
        te(torch.tensor([-1]))  # what the error above mirrors


# -- plain indexing keeps PyTorch's negative indices -----------------------------------------


def test_advanced_indexing_takes_negative_indices_and_refuses_out_of_range():
    torch = pytest.importorskip("torch")
    x = np.arange(6.0).reshape(2, 3)
    a, t = af.tensor(x), torch.tensor(x)
    idx = [-1, 0, -2]
    np.testing.assert_array_equal(a[af.tensor(idx)].numpy(), t[torch.tensor(idx)].numpy())
    np.testing.assert_array_equal(
        a[:, af.tensor([-3, 2])].numpy(), t[:, torch.tensor([-3, 2])].numpy()
    )
    a2, t2 = af.tensor(x), torch.tensor(x)
    a2[af.tensor([-1])] = 7.0
    t2[torch.tensor([-1])] = 7.0
    np.testing.assert_array_equal(a2.numpy(), t2.numpy())
    for bad in (2, -3):
        err = _kernel_error(lambda bad=bad: a[af.tensor([bad])].numpy())
        assert f"getitem: index {bad} is out of bounds for axis 0 with size 2" in str(err)
        with pytest.raises(IndexError):
            t[torch.tensor([bad])]
    err = _kernel_error(lambda: a[af.tensor([True, False, True])].numpy())
    assert "getitem: boolean index did not match" in str(err)


def test_index_keys_that_cannot_index_are_refused_at_the_call():
    a = af.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(IndexError, match="tensors used as indices must be long, int or bool"):
        a[af.tensor([0.0])]
    with pytest.raises(IndexError, match="does not fit an int64"):
        a[np.array([2**64 - 1], np.uint64)]  # (not wrapped to -1)
    np.testing.assert_array_equal(a[np.array([1], np.uint64)].numpy(), [[3.0, 4.0, 5.0]])


def test_gather_gradients_with_negative_indices_match_pytorch():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((4, 3))
    idx = np.array([-1, 0, -1, 2])
    a, t = af.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    a[af.tensor(idx)].sum().backward()
    t[torch.tensor(idx)].sum().backward()
    np.testing.assert_array_equal(a.grad.numpy(), t.grad.numpy())


# -- the same in nn.Graph ------------------------------------------------------------------

_Step = TrainStep


def test_graph_step_raises_on_a_bad_target_and_leaves_the_parameters_alone():
    af.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 3))
    step = _Step(model, optim.SGD(model.parameters(), lr=0.1))
    x = af.tensor(np.ones((2, 5), np.float32))
    step.step(x, af.tensor([0, 1]))
    before = model[0].weight.numpy().copy()
    for bad in (-1, 3):
        with pytest.raises(
            IndexOutOfBoundsError,
            match=f"cross_entropy: Target {bad} is out "
            r"of bounds: valid values are in \[0, 3\)",
        ):
            step.step(x, af.tensor([0, bad]))
    np.testing.assert_array_equal(model[0].weight.numpy(), before)
    assert np.isfinite(float(step.step(x, af.tensor([2, 1]))))


def test_graph_step_checks_embedding_indices():
    af.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4, 3, padding_idx=0), nn.Flatten(), nn.Linear(6, 4))
    step = _Step(model, optim.SGD(model.parameters(), lr=0.1))
    x = af.tensor([[1, 3], [0, 2]])
    y = af.tensor([0, 3])
    first = float(step.step(x, y))
    with pytest.raises(IndexOutOfBoundsError, match="embedding: index -1 is out of bounds"):
        step.step(af.tensor([[1, -1], [0, 2]]), y)
    assert float(step.step(x, y)) < first
