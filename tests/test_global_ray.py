"""Global tensors on Ray ranks (each rank a Ray actor): the same programs give the same bits as
on inline ranks; an error in an actor comes back as the same exception at the read of the
part; a killed actor is an ActorError naming its rank; close() kills the actors. On a local
Ray cluster the module starts (2 CPUs); skipped where Ray is not installed."""

import operator
import sys
import time

import numpy as np
import pytest

import actorflow as af
from actorflow import nn
from actorflow.errors import ActorError, DeviceError, IndexOutOfBoundsError
from actorflow.ops import get as op_def
from actorflow.parallel import InlineRanks, ranks_of, use_ranks
from actorflow.parallel import workers as W
from actorflow.parallel.interpreter import parts_of

ray = pytest.importorskip("ray", reason="Ray ranks need Ray: pip install 'actorflow[ray]'")
from actorflow.parallel.ray_ranks import RayRanks  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

S0, S1, B, P = af.sbp.split(0), af.sbp.split(1), af.sbp.broadcast, af.sbp.partial_sum
KINDS = {"inline": InlineRanks, "ray": RayRanks}


@pytest.fixture(scope="module", autouse=True)
def cluster(ray_engine):
    """The module's local Ray cluster; the Ray ranks made on it killed at the end."""
    yield
    for (kind, _), g in list(af.parallel.ranks._GROUPS.items()):
        if kind == "ray":
            g.close()


def both(program, *args):
    """``program(kind, *args)`` (a list of numpy arrays) on inline and on Ray ranks: the same
    dtypes, shapes and bits."""
    got = {}
    for kind in KINDS:
        with use_ranks(kind):
            got[kind] = program(kind, *args)
    a, b = got["inline"], got["ray"]
    assert len(a) == len(b) > 0
    for n, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.dtype == y.dtype and x.shape == y.shape, n
        assert x.tobytes() == y.tobytes(), (n, x, y)
    return b


def held(kind, t):
    """Checks ``t`` is on ranks of ``kind``; returns its whole value."""
    assert isinstance(t._impl.blob.ranks, KINDS[kind])
    return t.numpy()


def dead(actor, within=30.0):
    """Whether a call on ``actor`` fails as on a dead actor within ``within`` seconds (Ray
    kills an actor asynchronously: a call made at once may still run)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            ray.get(actor.ready.remote(), timeout=within)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


def data(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("k", [2, 3])
def test_elementwise_matmul_views(k):
    def program(kind):
        p = af.placement("cpu", ranks=k)
        x = af.tensor(data((5, 7))).to_global(p, S0)
        w = af.tensor(data((7, 3), 1)).to_global(p, B)
        y = (x * 2 + 1).exp() - x.sin() / (x.abs() + 1)
        m = x @ w  # S(0) x B -> S(0)
        assert m.sbp == (S0,)
        a = af.tensor(data((3, 5), 2)).to_global(p, S1)
        b = af.tensor(data((5, 4), 3)).to_global(p, S0)
        ab = a @ b  # S(1) x S(0) -> P
        assert ab.sbp == (P,)
        parts = [af.parallel.to_local(ab, r).numpy() for r in range(k)]
        v = x.transpose(0, 1)[1:, :].unsqueeze(0).reshape(6, 5)
        return [
            held(kind, y),
            held(kind, m),
            *parts,
            held(kind, ab.to_global(sbp=B)),
            held(kind, x.sum(0)),
            held(kind, x.sum()),
            held(kind, v),
            held(kind, x[:, 2]),
            held(kind, af.softmax(m, dim=1)),
        ]

    got = both(program)
    np.testing.assert_allclose(got[1], data((5, 7)) @ data((7, 3), 1), rtol=1e-5)


@pytest.mark.parametrize("k", [2, 3])
def test_every_boxing_conversion(k):
    sbps = [S0, S1, B, P]

    def program(kind):
        p = af.placement("cpu", ranks=k)
        out = []
        base = af.tensor(data((5, 7), 4))  # 5 and 7 rows/columns: uneven parts
        for src in sbps:
            if src is P:  # a partial sum whose ranks hold different summands
                x = af.tensor(data((5, 3), 5)).to_global(p, S1) @ af.tensor(
                    data((3, 7), 6)
                ).to_global(p, S0)
                assert x.sbp == (P,)
            else:
                x = base.to_global(p, src)
            for dst in sbps:
                y = x.to_global(sbp=dst)
                assert y.sbp == (dst,)
                out.append(held(kind, y))
                out += [af.parallel.to_local(y, r).numpy() for r in range(k)]
        return out

    got = both(program)
    assert np.array_equal(got[0], data((5, 7), 4))


def test_in_place_dynamic_shapes_factories_dtypes():
    def program(kind):
        p = af.placement("cpu", ranks=2)
        x = af.tensor(data((5, 3), 12)).to_global(p, S0)
        x.add_(1)
        x.mul_(x)
        nz = af.nonzero(x.to_global(sbp=B) > 2)  # a shape only the ranks know
        z = af.zeros(5, 4, device=af.sbp.layout(p, (S1,)))
        r = af.arange(7, device=af.sbp.layout(p, (S0,)))
        af.manual_seed(3)
        rn = af.randn(5, 3, device=af.sbp.layout(p, (S0,)))
        drop = af.nn.functional.dropout(x, 0.5, training=True)
        return [
            held(kind, x),
            held(kind, nz),
            held(kind, z),
            held(kind, r),
            held(kind, rn),
            held(kind, drop),
            ((x * 10).to(af.int32) // 3).numpy(),
            (x.to(af.bfloat16) * 3).numpy(),
        ]

    got = both(program)
    assert got[1].shape[1] == 2


def test_large_parts_and_in_place_writes():
    """Parts past the size that goes inside a call (puts and moves through Ray's object
    store): the same bits, and a tensor put on every rank once is each rank's own."""

    def program(kind):
        p = af.placement("cpu", ranks=3)
        big = data((301, 129), 13)
        assert big.nbytes > 2 * W.INLINE
        b = af.tensor(big).to_global(p, B)
        b.add_(1)  # (each rank once)
        s = af.tensor(big).to_global(p, S0)
        t = s.to_global(sbp=S1) * 2
        u = (b + t).to_global(sbp=B)
        return [
            held(kind, b),
            *[af.parallel.to_local(b, r).numpy() for r in range(3)],
            held(kind, t),
            held(kind, u),
        ]

    got = both(program)
    assert np.array_equal(got[0], data((301, 129), 13) + 1)


def test_a_part_sent_to_two_ranks_then_written():
    with use_ranks("ray"):
        p = af.placement("cpu", ranks=3)
        ranks = ranks_of(p)
        big = data((200, 100), 15)
        add_ = op_def("add")
        part = ranks.put(0, af.tensor(big)._impl)
        first = ranks.move(part, 0, 1)
        ranks.call(0, add_, [part, part], {}, [part])  # part += part, after the send
        then = ranks.move(part, 0, 2)  # (written since: sent afresh)
        ranks.call(1, add_, [first, first], {}, [first])
        assert np.array_equal(ranks.get(1, first).array(), big * 2)
        assert np.array_equal(ranks.get(2, then).array(), big * 2)
        assert np.array_equal(ranks.get(0, part).array(), big * 2)


def _mlp():
    af.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def _batches(n=3, batch=11, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (rng.standard_normal((batch, 8)).astype(np.float32), rng.integers(0, 3, batch))
        for _ in range(n)
    ]


def test_data_parallel_training_equals_one_process():
    """An MLP's eager training steps with the batch at S(0) over 2 ranks and the parameters
    at B: the same bits on inline and Ray ranks, and one process's values (within float
    tolerance: the gradients are summed in another order)."""

    def program(kind):
        p = af.placement("cpu", ranks=2)
        model = _mlp().to_global(p)
        opt = af.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        out = []
        for x, y in _batches():
            loss = loss_fn(model(af.tensor(x).to_global(p, S0)), af.tensor(y).to_global(p, S0))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(held(kind, loss))
        for q in model.parameters():
            assert q.sbp == (B,)
            parts = [q.to_local(rank=r).numpy() for r in range(2)]
            assert parts[0].tobytes() == parts[1].tobytes()  # every rank the same
            out.append(held(kind, q))
        return out

    got = both(program)
    local = _mlp()
    opt = af.optim.SGD(local.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for x, y in _batches():
        loss = nn.CrossEntropyLoss()(local(af.tensor(x)), af.tensor(y))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.numpy())
    params = [q.numpy() for q in local.parameters()]
    for a, b in zip(losses + params, got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class Step(nn.Graph):
    def __init__(self, model, opt):
        super().__init__()
        self.model = model
        self.loss = nn.CrossEntropyLoss()
        self.add_optimizer(opt)

    def build(self, x, y):
        loss = self.loss(self.model(x), y)
        loss.backward()
        return loss


def test_graph_step_over_global_parameters():
    def program(kind):
        p = af.placement("cpu", ranks=2)
        model = _mlp().to_global(p)
        step = Step(model, af.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
        out = []
        for x, y in _batches(seed=1):
            loss = step.step(x, y)
            assert loss.is_global
            out.append(held(kind, loss))
        return out + [held(kind, q) for q in model.parameters()]

    both(program)


class Pipe(nn.Graph):
    def __init__(self, stages, opt, micro_batches, **kw):
        super().__init__(stages=stages, micro_batches=micro_batches, **kw)
        self.loss = nn.CrossEntropyLoss()
        self.add_optimizer(opt)

    def build(self, out, y):
        return self.loss(out, y)


@pytest.mark.parametrize("how", ["to_global", "stage_ranks"])
def test_pipeline_stages_on_ray_ranks_train_as_one_process(how):
    """Each stage global on a one-rank placement of Ray ranks computes in its Ray actor (its
    acts one command each there) and trains as the same pipeline on this process's threads,
    each stage holding no more micro-batches than its registers."""

    def train(kind):
        full = _mlp()
        stages = [nn.Sequential(full[0], full[1]), full[2]]
        kw = {}
        if kind is not None and how == "stage_ranks":
            kw["stage_ranks"] = kind
        elif kind is not None:
            with use_ranks(kind):
                for i, s in enumerate(stages):
                    s.to_global(af.placement("cpu", ranks=[i]))
        g = Pipe(stages, af.optim.SGD(full.parameters(), lr=0.1, momentum=0.9), 4, **kw)
        losses = [float(v) for v in g.run(_batches(batch=12))]
        return g, losses, [q.numpy() for q in full.parameters()]

    _, want, params = train(None)
    g, got, mine = train("ray")
    assert [type(r).__name__ for r in g.pipelined.ranks] == ["RayRanks"] * 2
    assert [type(w).__name__ for w in g.pipelined._workers] == ["RankStage"] * 2
    assert g.pipelined.peak_held[0] <= 2 and g.pipelined.peak_held[1] == 1
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    for a, b in zip(params, mine, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    if how == "stage_ranks":
        g.pipelined.close()  # (the stages back here, with their values; the actors ended)
        assert not any(q.is_global for s in g.pipelined.stages for q in s.parameters())
        got = [q.numpy() for s in g.pipelined.stages for q in s.parameters()]
        for a, b in zip(params, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    else:
        for r in g.pipelined.ranks:
            r.close()


def test_an_actor_error_is_raised_at_the_read_and_the_ranks_go_on():
    p = af.placement("cpu", ranks=2)
    idx = np.array([[0], [7], [1], [0]])

    def gather(kind):
        with use_ranks(kind):
            x = af.tensor(data((4, 3))).to_global(p, B)
            bad = af.gather(x, 1, af.tensor(idx).to_global(p, B))  # (no wait: queued)
            after = bad + 1  # a part computed from it holds the error too
            with pytest.raises(IndexOutOfBoundsError) as e:
                after.numpy()
            ok = (x * 3).numpy()  # other parts are fine
            if kind == "inline":  # (the error is also kept for this process's synchronize)
                with pytest.raises(IndexOutOfBoundsError):
                    af.synchronize()
            return e.value, ok

    e_inline, ok_inline = gather("inline")
    e_ray, ok_ray = gather("ray")
    assert type(e_ray) is type(e_inline)
    assert str(e_ray).split("\n")[0] == str(e_inline).split("\n")[0]
    assert "index 7 is out of bounds" in str(e_ray)
    assert ok_ray.tobytes() == ok_inline.tobytes()
    with use_ranks("ray"):  # arguments that do not pickle: that part fails, not the ranks
        ranks = ranks_of(p)
        x = af.tensor(data((4, 3))).to_global(p, B)
        part = parts_of(x._impl)[1]
        bad = ranks.call(1, op_def("add"), [part, part], {"alpha": lambda: 0})[0]
        with pytest.raises(TypeError, match="do not pickle"):
            ranks.get(1, bad)
        assert np.array_equal((x * 2).numpy(), data((4, 3)) * 2)


class LoadsBadly:
    """Pickles here, fails to load in the actor."""

    def __reduce__(self):
        return (operator.attrgetter("no_such_attribute"), (0,))


def test_commands_an_actor_cannot_load_fail_its_rank_with_a_clear_error():
    with use_ranks("ray"):
        p = af.placement("cpu", ranks=[12, 13])
        ranks = ranks_of(p)
        x = af.tensor(data((4, 3))).to_global(p, B)
        part = parts_of(x._impl)[1]
        bad = ranks.call(1, op_def("add"), [part, part], {"alpha": LoadsBadly()})[0]
        with pytest.raises(ActorError, match=r"rank 1 of .*could not load its commands"):
            ranks.get(1, bad)
        y = af.tensor(data((4, 3))).to_global(p, B)  # new actors
        assert np.array_equal((y * 2).numpy(), data((4, 3)) * 2)
        ranks_of(p).close()


def test_part_metas_are_the_actors():
    with use_ranks("ray"):
        p = af.placement("cpu", ranks=3)
        x = af.tensor(data((5, 7))).to_global(p, S1)
        for t in [x * 2, x.transpose(0, 1), x[1:4], x.sum(1), af.nonzero(x.to_global(sbp=B) > 0)]:
            ranks = t._impl.blob.ranks
            for part in parts_of(t._impl):
                want = ranks.meta(part)
                _, shape, strides, offset = ranks._request(part.rank, (W.META, part.id))
                assert (shape, strides, offset) == (want.shape, want.strides, want.offset)


@pytest.mark.parametrize("how", ["ray.kill", "the process killed"])
def test_a_killed_actor_is_an_actor_error_naming_the_rank(how):
    import os
    import signal

    with use_ranks("ray"):
        p = af.placement("cpu", ranks=[4, 5, 6])
        x = af.tensor(data((6, 2))).to_global(p, S0)
        ranks = ranks_of(p)
        assert np.array_equal((x + 1).numpy(), data((6, 2)) + 1)
        actors = ranks.actors
        if how == "ray.kill":
            ray.kill(actors[1])
        else:
            os.kill(ranks.pids[1], signal.SIGKILL)
        with pytest.raises(ActorError) as e:
            for _ in range(3):  # (the death is seen at the next answer awaited)
                (x.to_global(sbp=B) + 1).numpy()
        msg = str(e.value)
        assert "rank 1 of placement(type='cpu', ranks=[4, 5, 6])" in msg, msg
        assert "Ray actor" in msg and "died" in msg
        with pytest.raises(ActorError, match="rank 1"):  # and again at the next use
            (x * 2).numpy()
        assert all(dead(a) for a in actors)  # the other actors were killed
        again = ranks_of(p)  # new actors for the placement
        assert again is not ranks
        y = af.tensor(data((6, 2))).to_global(p, S0)
        assert np.array_equal((y + 1).numpy(), data((6, 2)) + 1)
        again.close()


def test_an_actor_killed_while_another_waits_for_its_part():
    """Rank 1 waits for rank 0's part (a move) when rank 0 is killed: rank 1 is not left
    waiting, and the read names rank 0."""
    with use_ranks("ray"):
        p = af.placement("cpu", ranks=[10, 11])
        x = af.tensor(data((1000, 1000))).to_global(p, S0)
        w = af.tensor(data((1000, 1000), 1)).to_global(p, B)
        ranks = ranks_of(p)
        ranks.synchronize()
        y = (x @ w @ w @ w @ w).to_global(sbp=B)  # (rank 0 busy, then its part moved)
        ranks._flush()
        ray.kill(ranks.actors[0])
        with pytest.raises(ActorError, match=r"rank 0 of placement.*Ray actor .* died"):
            af.parallel.to_local(y, 1)  # (or, if it was sent before the kill, the next op)
            (x + 1).numpy()


def test_close_kills_the_actors_and_the_placement_starts_new_ones():
    p = af.placement("cpu", ranks=[8, 9])
    ranks = RayRanks(p)
    part = ranks.put(0, af.tensor(data((3,)))._impl)
    moved = ranks.move(part, 0, 1)
    assert np.array_equal(ranks.get(1, moved).array(), data((3,)))
    ranks.synchronize()
    assert len(set(ranks.pids)) == 2 and len(ranks.nodes) == 2
    actors = ranks.actors
    ranks.close()
    assert all(dead(a) for a in actors)
    with pytest.raises(DeviceError, match="Ray ranks .* were closed"):
        ranks.put(0, af.tensor(data((3,)))._impl)


def test_use_ranks_selection_and_errors(monkeypatch):
    with use_ranks("ray"):
        assert af.parallel.ranks.KIND[0] == "ray"
        p = af.placement("cpu", ranks=2)
        assert isinstance(ranks_of(p), RayRanks)
    assert af.parallel.ranks.KIND[0] == "inline"
    with pytest.raises(ValueError, match="'inline', 'processes', 'ray'"):
        use_ranks("threads")
    with pytest.raises(DeviceError, match="type 'cpu'"):
        RayRanks(af.placement("null", ranks=2))
    ranks = RayRanks(af.placement("cpu", ranks=2), options={"num_cpus": 64}, start_timeout=1)
    with pytest.raises(DeviceError, match="did not start the 2 actors .* within 1 s"):
        ranks.put(0, af.tensor(data((3,)))._impl)
    assert not ranks.actors  # (the ones made were killed)
    monkeypatch.setitem(sys.modules, "ray", None)  # (as where Ray is not installed)
    with use_ranks("ray"), pytest.raises(ImportError, match=r"pip install 'actorflow\[ray\]'"):
        ranks_of(af.placement("cpu", ranks=[20, 21]))
