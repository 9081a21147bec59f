"""Attention: nn.functional.scaled_dot_product_attention, triu/tril/masked_fill,
nn.MultiheadAttention, nn.TransformerEncoderLayer and nn.TransformerEncoder against PyTorch
on the same inputs and weights (copied through numpy via state_dict): values and the
gradients of every input and parameter, with masks, causal, key padding, batch_first and
norm_first; dropout's statistics; a tiny causal language model in eager mode, under
no_grad, in nn.Graph (step and run, fused or not) and on the cuda emulator; the errors."""

import copy

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from cuda_fixtures import CUDA, assert_same

torch = pytest.importorskip("torch")
TF = torch.nn.functional
NF = nn.functional

pytestmark = pytest.mark.timeout(120)

RNG = np.random.default_rng(0)
TOL = {np.float64: dict(rtol=1e-9, atol=1e-12), np.float32: dict(rtol=1e-4, atol=1e-5)}


def both(*arrays, grad=True):
    """The arrays as actorflow and torch tensors (leaves that require grad)."""
    return (
        [af.tensor(a, requires_grad=grad) for a in arrays],
        [torch.tensor(a, requires_grad=grad) for a in arrays],
    )


def close(got, want, dtype=np.float64):
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else want
    np.testing.assert_allclose(
        got.numpy() if isinstance(got, af.Tensor) else got, want, **TOL[dtype]
    )


def backward_both(ya, yt):
    """Both outputs' backward with the same random cotangent."""
    w = np.random.default_rng(1).standard_normal(tuple(yt.shape))
    (ya * af.tensor(w.astype(ya.numpy().dtype))).sum().backward()
    (yt * torch.tensor(w.astype(yt.detach().numpy().dtype))).sum().backward()


# -- scaled_dot_product_attention --------------------------------------------------------------


def _mask_bool():
    m = RNG.random((5, 6)) > 0.4
    m[2] = False  # a row that attends to nothing: zeros, as PyTorch
    return m


def _mask_float():
    m = RNG.standard_normal((3, 1, 6))  # per head, broadcast over the query rows
    m[1, 0, :] = -np.inf  # the whole head masked: zeros
    m[0, 0, 2] = -np.inf
    return m


SDPA = [
    ("plain", {}),
    ("causal", dict(is_causal=True)),
    ("bool mask", dict(attn_mask=_mask_bool())),
    ("float mask", dict(attn_mask=_mask_float())),
    ("scale", dict(scale=0.3)),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("kind,kw", SDPA, ids=[k for k, _ in SDPA])
def test_sdpa_values_and_gradients_equal_pytorchs(kind, kw, dtype):
    # batch dims broadcast: query (2, 3, L, E), key (1, 3, S, E), value (3, S, Ev)
    q, k, v = (
        RNG.standard_normal(s).astype(dtype) for s in [(2, 3, 5, 4), (1, 3, 6, 4), (3, 6, 7)]
    )
    (qa, ka, va), (qt, kt, vt) = both(q, k, v)
    akw = {n: af.tensor(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    tkw = {n: torch.tensor(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    if "attn_mask" in kw and kw["attn_mask"].dtype != bool:
        akw["attn_mask"] = akw["attn_mask"].to(af.float32 if dtype == np.float32 else af.float64)
        tkw["attn_mask"] = tkw["attn_mask"].to(qt.dtype)
    ya = NF.scaled_dot_product_attention(qa, ka, va, **akw)
    yt = TF.scaled_dot_product_attention(qt, kt, vt, **tkw)
    assert ya.shape == tuple(yt.shape) and ya.dtype == af.tensor(q).dtype
    close(ya, yt, dtype)
    backward_both(ya, yt)
    for a, t in ((qa, qt), (ka, kt), (va, vt)):
        assert not np.isnan(a.grad.numpy()).any()
        close(a.grad, t.grad, dtype)


def test_sdpa_dropout_keeps_the_mean_and_follows_manual_seed():
    # (seeded, and 2,048 rows: a row's dropped weights sum to 1 +- ~0.4, so the mean over
    # 256 rows missed 1 by more than 0.05 for ~5% of unseeded q, as test order drew them)
    af.manual_seed(0)
    q = af.randn(16, 128, 8)
    v = af.ones(16, 128, 4)
    af.manual_seed(3)
    y = NF.scaled_dot_product_attention(q, q, v, dropout_p=0.5)
    af.manual_seed(3)
    again = NF.scaled_dot_product_attention(q, q, v, dropout_p=0.5)
    other = NF.scaled_dot_product_attention(q, q, v, dropout_p=0.5)
    a = y.numpy()
    assert np.array_equal(a, again.numpy()) and not np.array_equal(a, other.numpy())
    # every weight row sums to 1 without dropout; with it, to 1 on average (kept weights x2)
    assert abs(a.mean() - 1.0) < 0.05 and a.std() > 0.05
    np.testing.assert_allclose(NF.scaled_dot_product_attention(q, q, v).numpy(), 1.0, rtol=1e-6)


def test_sdpa_refuses_shapes_and_arguments_naming_them():
    q = af.randn(2, 5, 4)
    with pytest.raises(af.ShapeError, match=r"mask's shape \(4, 6\).*\(2, 5, 5\)"):
        NF.scaled_dot_product_attention(q, q, q, attn_mask=af.ones(4, 6, dtype=af.bool))
    with pytest.raises(af.ShapeError, match=r"query \(2, 5, 4\), key \(2, 5, 3\)"):
        NF.scaled_dot_product_attention(q, af.randn(2, 5, 3), q)
    with pytest.raises(ValueError, match="either attn_mask or is_causal"):
        NF.scaled_dot_product_attention(
            q, q, q, attn_mask=af.ones(5, 5, dtype=af.bool), is_causal=True
        )
    with pytest.raises(af.DTypeError, match="attn_mask must be bool.*int64"):
        NF.scaled_dot_product_attention(q, q, q, attn_mask=af.ones(5, 5, dtype=af.int64))


# -- triu, tril, masked_fill ---------------------------------------------------------------


@pytest.mark.parametrize("diagonal", [-1, 0, 2])
def test_triu_tril_masked_fill_equal_pytorchs(diagonal):
    x = RNG.standard_normal((2, 3, 4))
    a, t = af.tensor(x), torch.tensor(x)
    close(af.triu(a, diagonal), torch.triu(t, diagonal))
    close(a.tril(diagonal), t.tril(diagonal))
    close(
        af.ones(3, 4, dtype=af.bool).triu(diagonal).long(),
        torch.ones(3, 4, dtype=torch.bool).triu(diagonal).long(),
    )
    m = RNG.random((3, 4)) > 0.5
    close(a.masked_fill(af.tensor(m), -2.5), t.masked_fill(torch.tensor(m), -2.5))
    got = af.masked_fill(a.float(), af.tensor(m), af.tensor(7.0, dtype=af.float64))
    assert got.dtype == af.float32  # the input's dtype, as PyTorch
    close(got, torch.masked_fill(t.float(), torch.tensor(m), torch.tensor(7.0)), np.float32)
    with pytest.raises(af.ShapeError, match=r"triu: needs a tensor of at least 2 dims.*\(4,\)"):
        af.triu(af.ones(4))
    with pytest.raises(af.DTypeError, match="masked_fill: mask must be a bool tensor"):
        a.masked_fill(af.ones(3, 4), 0.0)
    with pytest.raises(af.ShapeError, match=r"mask's shape \(5,\) does not broadcast"):
        a.masked_fill(af.ones(5, dtype=af.bool), 0.0)


def test_masked_fill_casts_a_number_to_the_inputs_dtype_as_pytorch():
    m = np.array([True, False, True])
    for x, value in [
        ([1, 2, 3], 2.7),
        ([1, 2, 3], -2.7),
        ([True, False, False], 0),
        ([True, False, False], 2.5),
        ([1.5, 2.0, 3.0], 1),
        ([4, 5, 6], True),
    ]:
        got = af.tensor(x).masked_fill(af.tensor(m), value)
        want = torch.tensor(x).masked_fill(torch.tensor(m), value)
        assert got.dtype.name == str(want.dtype).split(".")[-1], (x, value)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    with pytest.raises(
        ValueError,
        match=r"masked_fill: value nan cannot be converted to the "
        r"input's int64",
    ):
        af.tensor([1, 2, 3]).masked_fill(af.tensor(m), float("nan"))


# -- MultiheadAttention ------------------------------------------------------------------------


def load_from_torch(amod, tmod):
    """Copies ``tmod``'s weights into ``amod`` through numpy, checking keys and shapes."""
    tsd = tmod.state_dict()
    asd = amod.state_dict()
    assert list(asd) == list(tsd)
    assert [tuple(v.shape) for v in asd.values()] == [tuple(v.shape) for v in tsd.values()]
    amod.load_state_dict({k: af.tensor(v.detach().numpy()) for k, v in tsd.items()})


def check_param_grads(amod, tmod, dtype=np.float64):
    tgrads = dict(tmod.named_parameters())
    for name, p in amod.named_parameters():
        assert p.grad is not None, name
        close(p.grad, tgrads[name].grad, dtype)


E, H, L, N = 8, 2, 5, 3


def _kpm():
    m = np.zeros((N, L), bool)
    m[0, 3:] = True
    m[2, 1] = True
    return m


MHA = [
    ("plain", {}, False),
    ("batch_first", {}, True),
    ("bool attn_mask", dict(attn_mask=np.triu(np.ones((L, L), bool), 1)), False),
    ("key_padding_mask", dict(key_padding_mask=_kpm()), True),
    (
        "both masks, per head, weights per head",
        dict(
            attn_mask=RNG.standard_normal((N * H, L, L)),
            key_padding_mask=_kpm(),
            average_attn_weights=False,
        ),
        False,
    ),
    (
        "is_causal hint",
        dict(attn_mask=np.triu(np.ones((L, L), bool), 1), is_causal=True, need_weights=False),
        True,
    ),
]


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("kind,kw,batch_first", MHA, ids=[k for k, _, _ in MHA])
def test_multihead_attention_equals_pytorchs_values_weights_and_gradients(kind, kw, batch_first):
    torch.manual_seed(0)
    tm = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=torch.float64)
    am = nn.MultiheadAttention(E, H, batch_first=batch_first, dtype=af.float64)
    load_from_torch(am, tm)
    shape = (N, L, E) if batch_first else (L, N, E)
    xs = [RNG.standard_normal(shape) for _ in range(2)]
    (qa, kva), (qt, kvt) = both(*xs)
    akw = {n: af.tensor(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    tkw = {n: torch.tensor(x) if isinstance(x, np.ndarray) else x for n, x in kw.items()}
    ya, wa = am(qa, kva, kva, **akw)
    yt, wt = tm(qt, kvt, kvt, **tkw)
    close(ya, yt)
    assert (wa is None) == (wt is None)
    if wt is not None:
        assert wa.shape == tuple(wt.shape)
        close(wa, wt)
    backward_both(ya, yt)
    close(qa.grad, qt.grad)
    close(kva.grad, kvt.grad)
    check_param_grads(am, tm)


def test_multihead_attention_unbatched_init_and_no_bias():
    af.manual_seed(0)
    am = nn.MultiheadAttention(E, H)
    w = am.in_proj_weight.numpy()
    bound = np.sqrt(6.0 / (E + 3 * E))  # Xavier uniform over (3E, E)
    assert w.shape == (3 * E, E) and np.abs(w).max() <= bound and np.abs(w).max() > bound / 2
    assert not am.in_proj_bias.numpy().any() and not am.out_proj.bias.numpy().any()
    tm = torch.nn.MultiheadAttention(E, H, bias=False, dtype=torch.float64)
    am = nn.MultiheadAttention(E, H, bias=False, dtype=af.float64)
    load_from_torch(am, tm)
    x = RNG.standard_normal((L, E))
    (xa,), (xt,) = both(x)
    ya, wa = am(xa, xa, xa)  # self-attention: one packed projection
    yt, wt = tm(xt, xt, xt)
    close(ya, yt)
    close(wa, wt)
    backward_both(ya, yt)
    close(xa.grad, xt.grad)
    check_param_grads(am, tm)


def test_multihead_attention_refusals_name_the_values():
    with pytest.raises(ValueError, match=r"embed_dim \(10\) must be divisible by num_heads \(4\)"):
        nn.MultiheadAttention(10, 4)
    with pytest.raises(NotImplementedError, match="kdim=6 differs from embed_dim=8"):
        nn.MultiheadAttention(8, 2, kdim=6)
    m = nn.MultiheadAttention(E, H)
    x = af.randn(L, N, E)
    with pytest.raises(af.ShapeError, match=r"attn_mask must have shape \(5, 5\).*got \(4, 5\)"):
        m(x, x, x, attn_mask=af.ones(4, 5, dtype=af.bool))
    with pytest.raises(
        af.ShapeError,
        match=r"key_padding_mask must have shape \(3, 5\).*"
        r"got \(5, 3\)",
    ):
        m(x, x, x, key_padding_mask=af.ones(5, 3, dtype=af.bool))
    with pytest.raises(af.ShapeError, match=r"embed_dim=8 features.*\(5, 3, 6\)"):
        m(x, af.randn(5, 3, 6), af.randn(5, 3, 6))


# -- TransformerEncoderLayer, TransformerEncoder -------------------------------------------

LAYERS = [
    (False, False, "relu"),
    (False, True, "gelu"),
    (True, False, "gelu"),
    (True, True, "relu"),
]


@pytest.mark.parametrize("norm_first,batch_first,activation", LAYERS)
def test_encoder_layer_equals_pytorchs_in_eval_with_masks(norm_first, batch_first, activation):
    torch.manual_seed(0)
    kw = dict(
        dim_feedforward=16,
        dropout=0.1,
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
    )
    tl = torch.nn.TransformerEncoderLayer(E, H, dtype=torch.float64, **kw).eval()
    al = nn.TransformerEncoderLayer(E, H, dtype=af.float64, **kw).eval()
    load_from_torch(al, tl)
    x = RNG.standard_normal((N, L, E) if batch_first else (L, N, E))
    (xa,), (xt,) = both(x)
    mask = np.triu(np.ones((L, L), bool), 1)
    ya = al(xa, src_mask=af.tensor(mask), src_key_padding_mask=af.tensor(_kpm()))
    yt = tl(xt, src_mask=torch.tensor(mask), src_key_padding_mask=torch.tensor(_kpm()))
    close(ya, yt)
    backward_both(ya, yt)
    close(xa.grad, xt.grad)
    check_param_grads(al, tl)


def test_encoder_deep_copies_the_layer_with_pytorchs_keys_and_values():
    torch.manual_seed(0)
    tl = torch.nn.TransformerEncoderLayer(
        E, H, 16, dropout=0.0, batch_first=True, dtype=torch.float64
    )
    te = torch.nn.TransformerEncoder(
        tl, 2, norm=torch.nn.LayerNorm(E, dtype=torch.float64), enable_nested_tensor=False
    )
    al = nn.TransformerEncoderLayer(E, H, 16, dropout=0.0, batch_first=True, dtype=af.float64)
    ae = nn.TransformerEncoder(al, 2, norm=nn.LayerNorm(E, dtype=af.float64))
    assert ae.layers[0].linear1.weight is not ae.layers[1].linear1.weight
    assert isinstance(ae.layers[1].linear1.weight, nn.Parameter)
    with pytest.raises(RuntimeError, match="deepcopy: only tensors made by the user"):
        copy.deepcopy(al.linear1.weight * 2)
    assert np.array_equal(ae.layers[0].linear1.weight.numpy(), al.linear1.weight.numpy())
    assert "layers.1.self_attn.in_proj_weight" in ae.state_dict()
    load_from_torch(ae, te)
    x = RNG.standard_normal((N, L, E))
    (xa,), (xt,) = both(x)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    ya = ae(xa, mask=af.tensor(mask.numpy()), is_causal=True)
    yt = te(xt, mask=mask, is_causal=True)
    close(ya, yt)
    backward_both(ya, yt)
    check_param_grads(ae, te)


def test_encoder_layer_dropout_in_training_keeps_the_mean():
    af.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.5)
    x = af.randn(64, 8, 16)
    layer.eval()
    want = layer(x).numpy()
    layer.train()
    got = [layer(x).numpy() for _ in range(2)]
    assert not np.array_equal(got[0], want) and not np.array_equal(got[0], got[1])
    # the post-norm output is normalised per position whatever dropout did
    assert abs(got[0].mean()) < 1e-5 and abs(got[0].std() - 1.0) < 1e-2


# -- a tiny causal language model: eager, no_grad, nn.Graph, cuda -----------------------------

V, C, D = 11, 8, 16


class TinyLM(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.emb = nn.Embedding(V, D, device=device)
        self.block = nn.TransformerEncoderLayer(
            D,
            4,
            32,
            dropout=0.0,
            batch_first=True,
            norm_first=True,
            activation="gelu",
            device=device,
        )
        self.head = nn.Linear(D, V, device=device)

    def forward(self, idx):
        causal = af.ones(C, C, dtype=af.bool, device=idx.device).triu(1)
        return self.head(self.block(self.emb(idx), src_mask=causal, is_causal=True))


class LMStep(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = NF.cross_entropy(self.model(x).reshape(-1, V), y.reshape(-1))
        loss.backward()
        return loss


def lm_batches(n, b=4):
    rng = np.random.default_rng(5)
    out = []
    for _ in range(n):  # counting mod V from a random start: learnable
        s = (rng.integers(0, V, (b, 1)) + np.arange(C + 1)) % V
        out.append((s[:, :-1], s[:, 1:]))
    return out


def make_lm(device=None, sgd=False):
    af.manual_seed(0)
    model = TinyLM(device)
    if sgd:
        return model, optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return model, optim.AdamW(model.parameters(), lr=1e-2)


def eager_lm(data, device=None, sgd=False):
    model, opt = make_lm(device, sgd)
    losses = []
    for x, y in data:
        opt.zero_grad()
        logits = model(af.tensor(x, device=device))
        loss = NF.cross_entropy(logits.reshape(-1, V), af.tensor(y, device=device).reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss)
    return [float(v) for v in losses], model


def test_tiny_lm_graph_step_and_runs_equal_eager():
    data = lm_batches(6)
    want, m1 = eager_lm(data)
    assert want[-1] < want[0]
    model, opt = make_lm()
    x0 = af.tensor(data[0][0])
    with af.no_grad():  # no_grad: the same forward, nothing recorded
        y0 = model(x0)
    assert y0.grad_fn is None and not y0.requires_grad
    assert np.array_equal(y0.numpy(), model(x0).detach().numpy())
    step = LMStep(model, opt)
    got = [float(step(af.tensor(x), af.tensor(y))) for x, y in data[:2]]
    got += [float(v) for v in step.run(data[2:4])]  # an actor per op
    got += [float(v) for v in step.run(data[4:], fused=True)]  # one actor
    assert got == want  # bit for bit
    for (name, a), b in zip(m1.named_parameters(), model.parameters(), strict=True):
        assert np.array_equal(b.numpy(), a.numpy()), name


def test_tiny_lm_trains_on_cuda_as_on_cpu(cuda):
    """Losses with AdamW; parameters with SGD: Adam's step is about lr times the sign of a
    near-zero gradient, so a GPU's other rounding of such a gradient moves that parameter by
    up to 2 lr (seen on an H200: 6e-4 on 1e-4 values); SGD's step is in proportion to the
    gradient, so its parameters compare within the rounding."""
    data = lm_batches(2)
    want, _ = eager_lm(data)
    got, _ = eager_lm(data, CUDA)
    assert_same(np.array(got), np.array(want), exact=False, rtol=1e-4)
    want, m1 = eager_lm(data, sgd=True)
    got, m2 = eager_lm(data, CUDA, sgd=True)
    assert_same(np.array(got), np.array(want), exact=False, rtol=1e-4)
    for a, b in zip(m1.parameters(), m2.parameters(), strict=True):
        assert_same(b.numpy(), a.numpy(), exact=False, rtol=1e-4)
