"""nn, optim, af.save/af.load: module trees, state, layers and losses against PyTorch on the
same weights, optimizers step for step, and a model that learns."""

import os
import subprocess
import sys

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.nn import functional as NF


class TinyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(100, 200)
        self.activation = nn.ReLU()
        self.linear2 = nn.Linear(200, 10)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        return self.softmax(self.linear2(self.activation(self.linear1(x))))


TINY_REPR = """TinyModel(
  (linear1): Linear(in_features=100, out_features=200, bias=True)
  (activation): ReLU()
  (linear2): Linear(in_features=200, out_features=10, bias=True)
  (softmax): Softmax(dim=1)
)"""


def test_tiny_model_prints_as_pytorch_and_runs():
    m = TinyModel()
    assert repr(m) == TINY_REPR
    y = m(af.rand(4, 100))
    assert y.shape == (4, 10)
    np.testing.assert_allclose(y.sum(dim=1).numpy(), np.ones(4), rtol=1e-5)
    assert [n for n, _ in m.named_parameters()] == [
        "linear1.weight",
        "linear1.bias",
        "linear2.weight",
        "linear2.bias",
    ]
    assert m.linear1.weight.shape == (200, 100) and m.linear1.bias.shape == (200,)
    assert [type(c).__name__ for c in m.children()] == ["Linear", "ReLU", "Linear", "Softmax"]


def test_tiny_model_repr_equals_torch():
    torch = pytest.importorskip("torch")

    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear1 = torch.nn.Linear(100, 200)
            self.activation = torch.nn.ReLU()
            self.linear2 = torch.nn.Linear(200, 10)
            self.softmax = torch.nn.Softmax(dim=1)

    assert repr(T()).replace("T(", "TinyModel(", 1) == TINY_REPR


def test_linear_default_init_is_bounded_like_pytorch():
    af.manual_seed(0)
    lin = nn.Linear(64, 32)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    bound = 1 / np.sqrt(64)
    assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
    assert np.abs(w).max() > 0.9 * bound  # spread over the whole range
    assert lin.weight.requires_grad and isinstance(lin.weight, nn.Parameter)
    af.manual_seed(0)
    assert np.array_equal(nn.Linear(64, 32).weight.numpy(), w)  # seeded


def test_sequential_indexing_state_dict_and_modes():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2))
    assert len(model) == 4 and isinstance(model[0], nn.Linear) and model[-1] is model[3]
    sub = model[:2]
    assert isinstance(sub, nn.Sequential) and len(sub) == 2 and sub[0] is model[0]
    with pytest.raises(IndexError):
        model[4]
    sd = model.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "3.weight", "3.bias"]
    other = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 2))
    other.load_state_dict(sd)
    x = af.rand(3, 4)
    model.eval(), other.eval()
    assert not model[2].training
    np.testing.assert_array_equal(model(x).numpy(), other(x).numpy())
    with pytest.raises(KeyError, match="missing keys"):
        other.load_state_dict({"0.weight": sd["0.weight"]})
    res = other.load_state_dict({"0.weight": sd["0.weight"]}, strict=False)
    assert "0.bias" in res.missing_keys
    with pytest.raises(ValueError, match="shape"):
        other.load_state_dict({**sd, "0.bias": af.zeros(3)})
    model.train()
    assert model[2].training


def test_setattr_before_init_and_hooks():
    class Bad(nn.Module):
        def __init__(self):
            self.lin = nn.Linear(2, 2)

    with pytest.raises(AttributeError, match=r"call super\(\)\.__init__\(\) first"):
        Bad()
    lin = nn.Linear(2, 2)
    seen = []
    h = lin.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    lin(af.rand(5, 2))
    h.remove()
    lin(af.rand(5, 2))
    assert seen == [(5, 2)]


def test_dropout_train_and_eval():
    af.manual_seed(1)
    x = af.ones(1000)
    d = nn.Dropout(0.3)
    y = d(x).numpy()
    kept = y != 0
    assert 0.6 < kept.mean() < 0.8
    np.testing.assert_allclose(y[kept], 1 / 0.7, rtol=1e-6)
    d.eval()
    assert d(x) is x


def _torch_pair(torch, shape, dtype=np.float64, seed=0):
    a = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return af.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)


@pytest.mark.parametrize(
    "kind",
    [
        "layer_norm",
        "embedding",
        "gelu_mlp",
        "nll",
        "ce",
        "ce_weight_ignore",
        "ce_probs",
        "ce_smooth",
        "mse",
        "tanh",
    ],
)
def test_layers_and_losses_match_pytorch_with_gradients(kind):
    torch = pytest.importorskip("torch")
    tF = torch.nn.functional
    x, tx = _torch_pair(torch, (6, 5))
    tgt = np.array([0, 4, 2, 2, 1, 3], dtype=np.int64)
    w5 = np.linspace(0.5, 1.5, 5)
    if kind == "layer_norm":
        ln, tln = nn.LayerNorm(5, dtype=af.float64), torch.nn.LayerNorm(5, dtype=torch.float64)
        with torch.no_grad():
            tln.weight.copy_(torch.tensor(w5))
            tln.bias.copy_(torch.tensor(w5[::-1].copy()))
        ln.load_state_dict({"weight": af.tensor(w5), "bias": af.tensor(w5[::-1].copy())})
        y, ty = ln(x), tln(tx)
        params = [(ln.weight, tln.weight), (ln.bias, tln.bias)]
    elif kind == "embedding":
        emb = nn.Embedding(7, 5, padding_idx=2, dtype=af.float64)
        temb = torch.nn.Embedding(7, 5, padding_idx=2, dtype=torch.float64)
        with torch.no_grad():
            temb.weight.copy_(torch.tensor(emb.weight.numpy()))
        idx = np.array([[0, 2, 6], [2, 2, 1]])
        y, ty = emb(af.tensor(idx)), temb(torch.tensor(idx))
        params = [(emb.weight, temb.weight)]
    elif kind == "gelu_mlp":
        lin = nn.Linear(5, 3, dtype=af.float64)
        tlin = torch.nn.Linear(5, 3, dtype=torch.float64)
        with torch.no_grad():
            tlin.weight.copy_(torch.tensor(lin.weight.numpy()))
            tlin.bias.copy_(torch.tensor(lin.bias.numpy()))
        y, ty = nn.GELU()(lin(x)), torch.nn.GELU()(tlin(tx))
        params = [(lin.weight, tlin.weight), (lin.bias, tlin.bias)]
    elif kind == "tanh":
        y, ty = nn.Tanh()(x), torch.tanh(tx)
        params = []
    elif kind == "nll":
        y = nn.NLLLoss()(NF.log_softmax(x, dim=1), af.tensor(tgt))
        ty = tF.nll_loss(tF.log_softmax(tx, dim=1), torch.tensor(tgt))
        params = []
    elif kind == "ce":
        y, ty = nn.CrossEntropyLoss()(x, af.tensor(tgt)), tF.cross_entropy(tx, torch.tensor(tgt))
        params = []
    elif kind == "ce_weight_ignore":
        t2 = tgt.copy()
        t2[1] = -100
        y = nn.CrossEntropyLoss(weight=af.tensor(w5))(x, af.tensor(t2))
        ty = tF.cross_entropy(tx, torch.tensor(t2), weight=torch.tensor(w5))
        params = []
    elif kind == "ce_probs":
        p = np.random.default_rng(3).dirichlet(np.ones(5), size=6)
        y = nn.CrossEntropyLoss(reduction="sum")(x, af.tensor(p))
        ty = tF.cross_entropy(tx, torch.tensor(p), reduction="sum")
        params = []
    elif kind == "ce_smooth":
        y = nn.CrossEntropyLoss(label_smoothing=0.1)(x, af.tensor(tgt))
        ty = tF.cross_entropy(tx, torch.tensor(tgt), label_smoothing=0.1)
        params = []
    else:
        t = np.random.default_rng(4).standard_normal((6, 5))
        y, ty = nn.MSELoss()(x, af.tensor(t)), tF.mse_loss(tx, torch.tensor(t))
        params = []
    np.testing.assert_allclose(y.detach().numpy(), ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    cot = np.random.default_rng(9).standard_normal(tuple(ty.shape))
    (y * af.tensor(cot)).sum().backward()
    (ty * torch.tensor(cot)).sum().backward()
    if kind != "embedding":
        np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    for p, tp in params:
        np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("SGD", dict(lr=0.1)),
        ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
        ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
        ("SGD", dict(lr=0.05, momentum=0.5, dampening=0.3, maximize=True)),
        ("Adam", dict(lr=0.01)),
        ("Adam", dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True)),
        ("AdamW", dict(lr=0.01)),
        ("AdamW", dict(lr=0.02, weight_decay=0.3, eps=1e-6)),
    ],
)
def test_optimizers_match_pytorch_step_for_step(name, kwargs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    w0, target = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    p = af.tensor(w0, requires_grad=True)
    tp = torch.tensor(w0, requires_grad=True)
    opt = getattr(optim, name)([p], **kwargs)
    topt = getattr(torch.optim, name)([tp], **kwargs)
    for step in range(6):
        for o, q, tgt in ((opt, p, af.tensor(target)), (topt, tp, torch.tensor(target))):
            o.zero_grad()
            loss = ((q - tgt) ** 2 * (step + 1.0)).sum()
            loss.backward()
            o.step()
        np.testing.assert_allclose(
            p.detach().numpy(), tp.detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=f"step {step}"
        )


def test_optimizer_arguments_are_checked():
    p = af.zeros(2, requires_grad=True)
    with pytest.raises(TypeError, match="single Tensor"):
        optim.SGD(p, lr=0.1)
    with pytest.raises(ValueError, match="empty"):
        optim.Adam([], lr=0.1)
    with pytest.raises(ValueError, match="learning rate"):
        optim.SGD([p], lr=-1)
    with pytest.raises(ValueError, match="Nesterov"):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(TypeError, match="unknown options"):
        optim.SGD([{"params": [p], "lrr": 0.1}])


def test_a_model_learns_a_separable_problem():
    af.manual_seed(0)
    rng = np.random.default_rng(0)
    n = 256
    x = np.concatenate([rng.normal(-1.5, 1.0, (n, 8)), rng.normal(1.5, 1.0, (n, 8))])
    y = np.concatenate([np.zeros(n, np.int64), np.ones(n, np.int64)])
    order = rng.permutation(2 * n)
    xt, yt = af.tensor(x[order].astype(np.float32)), af.tensor(y[order])
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = optim.Adam(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()
    first = None
    for _ in range(40):
        opt.zero_grad()
        loss = loss_fn(model(xt), yt)
        loss.backward()
        opt.step()
        first = first if first is not None else loss.item()
    with af.no_grad():
        acc = (model(xt).argmax(dim=1) == yt).float().mean().item()
    assert loss.item() < first / 4
    assert acc > 0.97


def test_save_and_load_a_state_dict(tmp_path):
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    path = tmp_path / "model.npz"
    af.save(model.state_dict(), path)
    loaded = af.load(path)
    assert list(loaded) == list(model.state_dict())
    other = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    other.load_state_dict(loaded)
    x = af.rand(2, 3)
    np.testing.assert_array_equal(model(x).detach().numpy(), other(x).detach().numpy())
    af.save({"model": {"w": af.ones(2)}, "step": 7, "lr": 0.5}, tmp_path / "ckpt")
    back = af.load(tmp_path / "ckpt")
    assert back["step"] == 7 and back["lr"] == 0.5
    np.testing.assert_array_equal(back["model"]["w"].numpy(), [1, 1])
    with pytest.raises(TypeError, match="dict"):
        af.save([af.ones(2)], tmp_path / "x")
    with pytest.raises(TypeError, match="function"):
        af.save({"f": lambda: 0}, tmp_path / "x")
    with np.load(path, allow_pickle=False) as data:  # plain arrays, no pickled objects
        assert all(data[k].dtype != object for k in data.files)


def test_zero_grad_to_none_or_to_zeros():
    lin = nn.Linear(3, 2)
    opt = optim.SGD(lin.parameters(), lr=0.1)
    lin(af.ones(4, 3)).sum().backward()
    lin.zero_grad(set_to_none=False)
    assert lin.weight.grad is not None and not lin.weight.grad.numpy().any()
    lin(af.ones(4, 3)).sum().backward()
    np.testing.assert_allclose(lin.bias.grad.numpy(), [4, 4])
    opt.zero_grad()
    assert lin.weight.grad is None and lin.bias.grad is None


# -- review regressions ----------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("probs", [False, True])
def test_cross_entropy_with_extra_dims_matches_pytorch(reduction, smoothing, probs):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 3))
    t = (
        rng.dirichlet(np.ones(5), size=(2, 3)).transpose(0, 2, 1).copy()
        if probs
        else rng.integers(0, 5, (2, 3))
    )
    a, ta = af.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    got = NF.cross_entropy(a, af.tensor(t), reduction=reduction, label_smoothing=smoothing)
    want = torch.nn.functional.cross_entropy(
        ta, torch.tensor(t), reduction=reduction, label_smoothing=smoothing
    )
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9)
    got.sum().backward()
    want.sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_all_targets_ignored_gives_nan_loss_but_zero_gradients():
    x = af.tensor(np.random.default_rng(1).standard_normal((2, 5)), requires_grad=True)
    loss = NF.cross_entropy(x, af.tensor([-100, -100]))
    loss.backward()
    assert np.isnan(loss.item()) and not x.grad.numpy().any()


def test_embedding_padding_row_keeps_its_values_and_gets_no_gradient():
    e = nn.Embedding(3, 2, padding_idx=-3)  # row 0, counted from the end
    with af.no_grad():
        af.fill_(e.weight, 1.0)
    out = e(af.tensor([0, 1]))
    assert out.numpy().tolist() == [[1, 1], [1, 1]]
    out.sum().backward()
    assert e.weight.grad.numpy().tolist() == [[0, 0], [1, 1], [0, 0]]


def test_module_attributes_keep_their_kinds_and_shared_modules_save_under_each_name():
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="Parameter or None"):
        lin.weight = af.zeros(2, 2)
    lin.weight = nn.Parameter(af.zeros(2, 2))  # keeps its place
    assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]

    class AE(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(2, 2)
            self.dec = self.enc  # tied

    ae = AE()
    assert list(ae.state_dict()) == ["enc.weight", "enc.bias", "dec.weight", "dec.bias"]
    ae.load_state_dict(ae.state_dict())
    assert len(list(ae.parameters())) == 2


def test_optimizer_state_dict_round_trips_through_a_file(tmp_path):
    rng = np.random.default_rng(0)
    data = [
        (
            af.tensor(rng.standard_normal((4, 3)).astype(np.float32)),
            af.tensor(rng.integers(0, 2, 4)),
        )
        for _ in range(6)
    ]

    def train(model, opt, batches):
        for x, y in batches:
            opt.zero_grad()
            nn.CrossEntropyLoss()(model(x), y).backward()
            opt.step()

    af.manual_seed(0)
    m1 = nn.Linear(3, 2)
    o1 = optim.Adam(
        [{"params": [m1.weight]}, {"params": [m1.bias], "lr": 0.05}], lr=0.01, betas=(0.8, 0.9)
    )
    train(m1, o1, data[:3])
    af.save({"model": m1.state_dict(), "opt": o1.state_dict()}, tmp_path / "ckpt.npz")
    train(m1, o1, data[3:])  # the reference goes on

    ck = af.load(tmp_path / "ckpt.npz")
    m2 = nn.Linear(3, 2)
    o2 = optim.Adam([{"params": [m2.weight]}, {"params": [m2.bias]}], lr=0.5)
    m2.load_state_dict(ck["model"])
    o2.load_state_dict(ck["opt"])
    assert o2.param_groups[1]["lr"] == 0.05 and o2.param_groups[0]["betas"] == (0.8, 0.9)
    assert o2.state[m2.weight]["step"] == 3
    train(m2, o2, data[3:])  # resumes exactly where it was saved
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy())
    with pytest.raises(ValueError, match="groups"):
        optim.Adam(m2.parameters()).load_state_dict(ck["opt"])


def test_module_list_and_dict_register_their_modules():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([nn.Linear(2, 2) for _ in range(2)])
            self.heads = nn.ModuleDict({"a": nn.Linear(2, 1)})

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.heads["a"](x)

    m = M()
    assert [n for n, _ in m.named_parameters()] == [
        "blocks.0.weight",
        "blocks.0.bias",
        "blocks.1.weight",
        "blocks.1.bias",
        "heads.a.weight",
        "heads.a.bias",
    ]
    m.blocks.append(nn.Linear(2, 2))
    assert len(m.blocks) == 3 and "a" in m.heads and list(m.heads) == ["a"]
    assert m(af.ones(1, 2)).shape == (1, 1)
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    seq[1] = nn.Tanh()
    assert isinstance(seq[1], nn.Tanh)
    with pytest.raises(TypeError, match="not a Module"):
        m.blocks.append(3)


def test_save_and_load_lists_and_tuples_of_tensors(tmp_path):
    state = {
        "a": [af.zeros(2), af.ones(2)],
        "t": (af.full((1,), 3.0), 3, "s", None),
        "nested": [[af.ones(1)], {"x": af.zeros(1)}],
        "mixed": [1, af.arange(2)],
        "plain": [1, 2],
        "empty": [],
    }
    af.save(state, tmp_path / "l.npz")
    back = af.load(tmp_path / "l.npz")
    assert isinstance(back["a"], list) and isinstance(back["t"], tuple)
    np.testing.assert_array_equal(back["a"][1].numpy(), [1, 1])
    assert back["t"][1:] == (3, "s", None)
    np.testing.assert_array_equal(back["t"][0].numpy(), [3.0])
    np.testing.assert_array_equal(back["nested"][1]["x"].numpy(), [0.0])
    assert back["mixed"][0] == 1 and back["mixed"][1].tolist() == [0, 1]
    assert back["plain"] == [1, 2] and back["empty"] == []
    for key in ("[0]", "(1)"):  # would come back as a list: refused
        with pytest.raises(ValueError, match="list's item"):
            af.save({key: af.ones(1)}, tmp_path / "k.npz")


def test_imports_with_docstrings_stripped():
    """``python -OO`` drops docstrings (``__doc__`` is None): the batch norms' docs, built
    from their base's, must not fail the import."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-OO", "-c", "import actorflow.nn; print(actorflow.nn.BatchNorm2d)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
