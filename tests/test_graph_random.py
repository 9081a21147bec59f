"""Random ops inside nn.Graph: dropout (and af.rand/af.randn) in a compiled step draw new
values every step, from a counter-based generator keyed by the graph's seed and the op's
place in the step, at the graph's step count (state, advanced in piece order): so step(),
run() with an actor per op (pieces pipelined), run(fused=True) and the CUDA emulator draw
the same values for the same step. Eager draws are their own (as PyTorch's compiled graphs
draw differently from eager)."""

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.nn import functional as NF
from cuda_fixtures import CUDA, assert_captures, assert_same


def batches(n, b=6, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((b, 8)).astype(np.float32), rng.integers(0, 3, b)) for _ in range(n)
    ]


def make(p=0.5, device=None, lr=0.1):
    af.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 32, device=device), nn.ReLU(), nn.Dropout(p), nn.Linear(32, 3, device=device)
    )
    return model, optim.SGD(model.parameters(), lr=lr, momentum=0.9)


class TrainStep(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = NF.cross_entropy(self.model(x), y)
        loss.backward()
        return loss


def losses_by_steps(data, p=0.5):
    model, opt = make(p)
    step = TrainStep(model, opt)
    got = [float(step(af.tensor(x), af.tensor(y))) for x, y in data]
    return got, model, step


def test_dropout_draws_new_masks_every_step_and_the_same_after_the_same_seed():
    x, y = batches(1)[0]
    model, opt = make(lr=0.0)  # the parameters stay: only the masks move
    step = TrainStep(model, opt)
    a, b = float(step(af.tensor(x), af.tensor(y))), float(step(af.tensor(x), af.tensor(y)))
    model.eval()
    plain = float(step(af.tensor(x), af.tensor(y)))  # no dropout: nothing random traced
    assert a != b and plain not in (a, b)
    assert int(step._count) == 2  # eval steps draw nothing, count nothing
    model.train()
    third = float(step(af.tensor(x), af.tensor(y)))
    model2, opt2 = make(lr=0.0)  # another graph after the same manual_seed
    again = TrainStep(model2, opt2)
    assert [float(again(af.tensor(x), af.tensor(y))) for _ in range(3)] == [a, b, third]


def test_a_graphs_seed_follows_manual_seed_and_leaves_eager_draws_alone():
    class Noise(nn.Graph):
        def build(self, x):
            return x + af.rand(4)

    x = af.zeros(4)
    af.manual_seed(3)
    want = af.rand(4).numpy()
    af.manual_seed(3)
    a, b = Noise(), Noise()  # the first and second graph after the seed
    assert np.array_equal(af.rand(4).numpy(), want)  # eager draws: as without graphs
    first = a(x).numpy()
    assert not np.array_equal(first, b(x).numpy())
    af.manual_seed(3)
    af.rand(100)  # eager draws between: no matter
    assert np.array_equal(Noise()(x).numpy(), first)


def test_a_run_from_a_data_loader_draws_as_steps_do():
    from actorflow.data import DataLoader, TensorDataset

    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20, 8)).astype(np.float32), rng.integers(0, 3, 20)
    want, _, _ = losses_by_steps([(x[i : i + 8], y[i : i + 8]) for i in range(0, 20, 8)])
    for fused in (False, True):
        model, opt = make()
        step = TrainStep(model, opt)
        loader = DataLoader(TensorDataset(x, y), batch_size=8, workers=2)
        assert [float(v) for v in step.run(loader, fused=fused)] == want


@pytest.mark.parametrize("fused", [False, True], ids=["op-actors", "fused"])
def test_steps_equal_runs_bit_for_bit(fused):
    data = batches(6)
    want, m1, s1 = losses_by_steps(data)
    model, opt = make()
    step = TrainStep(model, opt)
    got = [float(step(af.tensor(x), af.tensor(y))) for x, y in data[:2]]  # step()
    got += [float(v) for v in step.run(data[2:], fused=fused, buffers=3)]  # pipelined
    assert got == want
    for (name, a), b in zip(m1.named_parameters(), model.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy()), name
    assert int(step._count) == int(s1._count) == 6


def test_piece_k_draws_at_count_k_from_philox():
    class Noise(nn.Graph):
        def build(self, x):
            return x + af.rand(3, 5), x * af.randn(3, 5, dtype=af.float64)

    af.manual_seed(7)
    g = Noise()
    x = np.zeros((3, 5), np.float32)
    first = g(af.tensor(x))
    outs = [first] + list(g.run([x, x])) + list(g.run([x], fused=True))
    seed = g._seed

    def philox(index, count, normal, dtype):
        bits = np.random.Philox(
            key=np.array([seed, index], dtype=np.uint64),
            counter=np.array([0, 0, 0, count], dtype=np.uint64),
        )
        gen = np.random.Generator(bits)
        return gen.standard_normal((3, 5), dtype) if normal else gen.random((3, 5), dtype)

    for k, (u, n) in enumerate(outs):
        u, n = (v.numpy() if isinstance(v, af.Tensor) else v for v in (u, n))
        assert np.array_equal(u, philox(0, k, False, np.float32)), k
        assert n.dtype == np.float64 and not n.any()  # x * randn, x = 0
    assert not np.array_equal(outs[0][0].numpy(), outs[1][0])


def test_dropout_statistics_in_a_graph():
    class Drop(nn.Graph):
        def build(self, x):
            return NF.dropout(x, 0.3), af.randn(200_000)

    af.manual_seed(1)
    g = Drop()
    ones = np.ones(200_000, np.float32)
    for y, z in [tuple(t.numpy() for t in g(af.tensor(ones)))] + list(g.run([ones])):
        zeroed = float(np.mean(y == 0))
        assert abs(zeroed - 0.3) < 0.01
        assert np.allclose(y[y != 0], 1 / 0.7) and abs(float(y.mean()) - 1.0) < 0.02
        assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1.0) < 0.01


class Tiny(nn.Module):
    def __init__(self, device=None, dropout=0.1):
        super().__init__()
        self.emb = nn.Embedding(11, 16, device=device)
        self.block = nn.TransformerEncoderLayer(
            16, 4, 32, dropout=dropout, batch_first=True, device=device
        )
        self.head = nn.Linear(16, 11, device=device)

    def forward(self, idx):
        return self.head(self.block(self.emb(idx)))


class LM(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = NF.cross_entropy(self.model(x).reshape(-1, 11), y.reshape(-1))
        loss.backward()
        return loss


def lm_data(n, b=4, c=8):
    rng = np.random.default_rng(5)
    out = []
    for _ in range(n):  # counting mod 11 from a random start: learnable
        s = (rng.integers(0, 11, (b, 1)) + np.arange(c + 1)) % 11
        out.append((s[:, :-1], s[:, 1:]))
    return out


def test_transformer_encoder_layer_with_dropout_trains_in_a_graph():
    data = lm_data(10)

    def lm():
        af.manual_seed(0)
        model = Tiny()
        return LM(model, optim.AdamW(model.parameters(), lr=1e-2)), model

    g, m1 = lm()
    want = [float(g(af.tensor(x), af.tensor(y))) for x, y in data]
    assert want[-1] < want[0] - 0.5  # it learns, with its dropout on
    h, m2 = lm()
    got = [float(h(af.tensor(x), af.tensor(y))) for x, y in data[:4]]
    got += [float(v) for v in h.run(data[4:7])]
    got += [float(v) for v in h.run(data[7:], fused=True)]
    assert got == want
    for (name, a), b in zip(m1.named_parameters(), m2.parameters(), strict=True):
        assert np.array_equal(a.numpy(), b.numpy()), name
    kinds = {s.op.name for c in g._compiled.values() for s in c.program.steps}
    assert "rand_step" in kinds and "rand" not in kinds


def test_attention_dropout_in_a_traced_step():
    class Attend(nn.Graph):
        def __init__(self, p):
            super().__init__()
            self.p = p
            self.q = nn.Linear(4, 4)
            self.add_optimizer(optim.SGD(self.q.parameters(), lr=0.1))

        def build(self, x):
            out = NF.scaled_dot_product_attention(self.q(x), x, x, dropout_p=self.p)
            loss = (out * out).sum()
            loss.backward()
            return loss, out

    x = np.random.default_rng(2).standard_normal((2, 5, 4)).astype(np.float32)

    def graph(p):
        af.manual_seed(0)
        return Attend(p)

    a = graph(0.5)
    steps = [tuple(t.numpy() for t in a(af.tensor(x))) for _ in range(3)]
    assert not np.array_equal(steps[0][1], steps[1][1])
    b = graph(0.5)
    runs = list(b.run([x])) + list(b.run([x, x], fused=True))
    for (l1, o1), (l2, o2) in zip(steps, runs, strict=True):
        assert l1 == l2 and np.array_equal(o1, o2)
    c = graph(0.0)  # no dropout: the eager numbers
    af.manual_seed(0)
    q = nn.Linear(4, 4)
    want = NF.scaled_dot_product_attention(q(af.tensor(x)), af.tensor(x), af.tensor(x))
    assert np.array_equal(c(af.tensor(x))[1].numpy(), want.detach().numpy())


def test_random_ops_are_refused_where_no_step_counts():
    @af.trace
    def noisy(x):
        return x + af.rand(2)

    with pytest.raises(
        af.TraceError,
        match=r"rand: a random op .* same values for every "
        r"piece.*nn.Graph",
    ):
        noisy.actor_graph(af.Spec((2,)))
    g = af.ActorGraph()
    src = g.source([np.zeros(3, np.float32)])
    with pytest.raises(af.TraceError, match="randn: a random op"):
        g.sink(g.op(lambda x: x * af.randn(3), src))
        list(g.run())
    assert np.array_equal(noisy(af.zeros(2)).shape, (2,))  # eager: as ever


def test_dropout_graph_on_cuda_equals_cpu(cuda):
    data = batches(5)
    want, m1, _ = losses_by_steps(data)
    model, opt = make(device=CUDA)
    step = TrainStep(model, opt)
    got = [
        float(step(af.tensor(x, device=CUDA), af.tensor(y, device=CUDA))) for x, y in data[:3]
    ]  # launched, then captured and replayed
    (compiled,) = step._compiled.values()
    assert_captures(compiled.device, 1, 2)
    got += [float(v) for v in step.run(data[3:4])]
    got += [float(v) for v in step.run(data[4:], fused=True)]
    assert_same(np.array(got), np.array(want), exact=False, rtol=1e-5)
    for a, b in zip(m1.parameters(), model.parameters(), strict=True):
        assert_same(b.numpy(), a.numpy(), exact=False, rtol=1e-5)
    assert int(step._count) == 5
