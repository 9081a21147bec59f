"""Global tensors on process ranks (each rank a kept worker process): the same programs give
the same bits as on inline ranks; errors in a worker come back as the same exception at the
read of the part; a killed worker is an ActorError naming its rank; nothing is left in
/dev/shm and nothing hangs."""

import gc
import operator
import os
import pickle
import signal
import subprocess
import sys

import numpy as np
import pytest

import actorflow as af
from actorflow.errors import ActorError, DeviceError, IndexOutOfBoundsError
from actorflow.ops import get as op_def
from actorflow.parallel import InlineRanks, ProcessRanks, ranks_of, use_ranks
from actorflow.parallel import workers as W
from actorflow.parallel.interpreter import parts_of

pytestmark = pytest.mark.timeout(60)

S0, S1, B, P = af.sbp.split(0), af.sbp.split(1), af.sbp.broadcast, af.sbp.partial_sum
KINDS = {"inline": InlineRanks, "processes": ProcessRanks}


@pytest.fixture(scope="module", autouse=True)
def made():
    """Shared-memory blocks made by name in this process meanwhile (each must be gone from
    /dev/shm); the process ranks closed at the end."""
    from multiprocessing import shared_memory

    names, base = [], shared_memory.SharedMemory

    class Recorded(base):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            names.append(self.name)

    shared_memory.SharedMemory = Recorded
    yield names
    shared_memory.SharedMemory = base
    for (kind, _), g in list(af.parallel.ranks._GROUPS.items()):
        if kind == "processes":
            g.close()
    assert not [n for n in names if os.path.exists(f"/dev/shm/{n.lstrip('/')}")]


def memfds(pid):
    """The memfds process ``pid`` holds a descriptor of."""
    out = []
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            out.append(os.readlink(f"/proc/{pid}/fd/{f}"))
        except FileNotFoundError:  # (closed meanwhile: the listing's own)
            pass
    return [f for f in out if "memfd:" in f]


def both(program, *args):
    """``program(kind, *args)`` (a list of numpy arrays) on inline and on process ranks: the
    same dtypes, shapes and bits."""
    got = {}
    for kind in KINDS:
        with use_ranks(kind):
            got[kind] = program(kind, *args)
    a, b = got["inline"], got["processes"]
    assert len(a) == len(b) > 0
    for n, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.dtype == y.dtype and x.shape == y.shape, n
        assert x.tobytes() == y.tobytes(), (n, x, y)
    return b


def held(kind, t):
    """Checks ``t`` is on ranks of ``kind``; returns its whole value."""
    assert isinstance(t._impl.blob.ranks, KINDS[kind])
    return t.numpy()


def data(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("k", [2, 3])
def test_elementwise_matmul_sum_views(k):
    def program(kind):
        p = af.placement("cpu", ranks=k)
        x = af.tensor(data((5, 7))).to_global(p, S0)
        w = af.tensor(data((7, 3), 1)).to_global(p, B)
        y = (x * 2 + 1).exp() - x.sin() / (x.abs() + 1)
        m = x @ w  # S(0) x B -> S(0)
        a = af.tensor(data((3, 5), 2)).to_global(p, S1)
        b = af.tensor(data((5, 4), 3)).to_global(p, S0)
        ab = a @ b  # S(1) x S(0) -> P
        assert ab.sbp == (P,)
        parts = [af.parallel.to_local(ab, r).numpy() for r in range(k)]
        ab_b = ab.to_global(sbp=B)
        v = x.transpose(0, 1)[1:, :].unsqueeze(0).reshape(6, 5)
        return [
            held(kind, y),
            held(kind, m),
            *parts,
            held(kind, ab_b),
            held(kind, x.sum(0)),
            held(kind, x.sum(1)),
            held(kind, x.sum()),
            held(kind, v),
            held(kind, x[:, 2]),
            held(kind, af.softmax(m, dim=1)),
        ]

    both(program)


@pytest.mark.parametrize("k", [2, 3])
def test_every_boxing_conversion(k):
    sbps = [S0, S1, B, P]

    def program(kind):
        p = af.placement("cpu", ranks=k)
        out = []
        base = af.tensor(data((5, 7), 4))
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

    both(program)


def test_autograd_mlp_and_sgd_step():
    def program(kind):
        p = af.placement("cpu", ranks=3)
        x = af.tensor(data((7, 4), 7)).to_global(p, S0)
        target = af.tensor(data((7, 2), 8)).to_global(p, S0)
        w1 = af.tensor(data((4, 6), 9)).to_global(p, B).requires_grad_()
        b1 = af.tensor(data((6,), 10)).to_global(p, B).requires_grad_()
        w2 = af.tensor(data((6, 2), 11)).to_global(p, B).requires_grad_()
        opt = af.optim.SGD([w1, b1, w2], lr=0.1, momentum=0.9)
        out = []
        for _ in range(2):
            opt.zero_grad()
            h = (x @ w1 + b1).relu()
            loss = ((h @ w2 - target) ** 2).mean()
            loss.backward()
            assert w1.grad.sbp == (B,)
            out += [held(kind, loss), w1.grad.numpy(), b1.grad.numpy(), w2.grad.numpy()]
            opt.step()
            out += [held(kind, w1), b1.numpy(), w2.numpy()]
        return out

    both(program)


def test_a_conversion_of_transposed_parts_shares_no_storage_with_its_source():
    """B -> P keeps rank 0's part as it is: through the transposed path (a matrix seen as
    .T) it still comes back a copy where the conversion must not alias."""

    def program(kind):
        p = af.placement("cpu", 2)
        a = np.arange(15, dtype=np.float32).reshape(5, 3)
        x = af.tensor(np.ascontiguousarray(a.T)).to_global(p, B).T  # (transposed parts)
        y = x.to_global(sbp=P)
        y.mul_(3.0)
        out = [x.numpy()]
        x.zero_()
        return out + [y.numpy()]

    got = both(program)
    a = np.arange(15, dtype=np.float32).reshape(5, 3)
    np.testing.assert_array_equal(got[0], a)
    np.testing.assert_array_equal(got[1], 3 * a)


def test_an_eager_training_loop_keeps_no_part_of_past_steps_on_the_workers():
    """What autograd saved for backward (a relu's output) and let go of after it is freed
    on the workers too: a global program submits no local work, which is where those
    blobs were collected, so without it every step left its saved outputs behind."""
    with use_ranks("processes"):
        p = af.placement("cpu", 2)
        af.manual_seed(0)
        model = af.nn.Sequential(af.nn.Linear(8, 6), af.nn.ReLU(), af.nn.Linear(6, 3))
        model.to_global(p)
        opt = af.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = af.tensor(data((10, 8), 12)).to_global(p, S0)
        y = af.tensor(np.arange(10) % 3).to_global(p, S0)
        ranks = ranks_of(p)
        held_by_rank = []
        for step in range(1, 13):
            loss = af.nn.CrossEntropyLoss()(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            del loss
            if step in (4, 12):
                ranks.synchronize()
                held_by_rank.append([ranks._request(r, (W.PING,))[1] for r in range(2)])
        assert held_by_rank[0] == held_by_rank[1]


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
        i = (x * 10).to(af.int32) // 3
        h = x.to(af.bfloat16) * 3
        return [
            held(kind, x),
            held(kind, nz),
            held(kind, z),
            held(kind, r),
            held(kind, rn),
            held(kind, drop),
            i.numpy(),
            h.numpy(),
        ]

    got = both(program)
    assert got[1].shape[1] == 2


def test_large_parts_through_shared_memory():
    """Parts past the size that goes down the pipes (puts, moves and gets through memfds):
    the same bits, and a tensor put on every rank once is each rank's own (an in-place
    write on one rank's part is not seen by another's)."""

    def program(kind):
        p = af.placement("cpu", ranks=3)
        big = data((301, 129), 13)
        assert big.nbytes > 2 * W.INLINE
        b = af.tensor(big).to_global(p, B)
        b.add_(1)  # (each rank once: a shared map would add 3)
        s = af.tensor(big).to_global(p, S0)
        t = s.to_global(sbp=S1) * 2
        u = (b + t).to_global(sbp=B)
        v = s.transpose(0, 1).to_global(sbp=S0)
        return [
            held(kind, b),
            *[af.parallel.to_local(b, r).numpy() for r in range(3)],
            held(kind, t),
            held(kind, u),
            held(kind, v),
        ]

    got = both(program)
    assert np.array_equal(got[0], data((301, 129), 13) + 1)


@pytest.mark.parametrize("shape", [(4, 3), (301, 129)])
def test_a_tensor_written_between_two_puts_is_read_again(shape):
    def program(kind):
        p = af.placement("cpu", ranks=2)
        x = af.tensor(data(shape, 14))
        a = x.to_global(p, B)
        x.add_(1)
        b = x.to_global(p, B)
        c = x.to_global(p, S0)
        return [held(kind, a), held(kind, b), held(kind, c)]

    got = both(program)
    assert not np.array_equal(got[0], got[1])


def test_a_part_sent_to_two_ranks_is_each_ranks_own():
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=3)
        ranks = ranks_of(p)
        big = data((200, 100), 15)
        part = ranks.put(0, af.tensor(big)._impl)
        on1, on2 = ranks.move(part, 0, 1), ranks.move(part, 0, 2)  # (one memfd, two maps)
        add_ = op_def("add")
        ranks.call(1, add_, [on1, on1], {}, [on1])  # on1 += on1
        assert np.array_equal(ranks.get(1, on1).array(), big * 2)
        assert np.array_equal(ranks.get(2, on2).array(), big)
        other = ranks.put(0, af.tensor(big)._impl)
        first = ranks.move(other, 0, 1)
        ranks.call(0, add_, [other, other], {}, [other])
        then = ranks.move(other, 0, 2)  # (written since the first send: sent afresh)
        assert np.array_equal(ranks.get(1, first).array(), big)
        assert np.array_equal(ranks.get(2, then).array(), big * 2)


def test_an_answer_given_up_on_is_skipped():
    """A request whose answer was never read (the wait interrupted, e.g. by Ctrl-C): the
    next request skips that answer (a memfd in it closed) and reads its own."""
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=2)
        ranks = ranks_of(p)
        big = af.tensor(data((300, 100))).to_global(p, B)
        part = parts_of(big._impl)[0]
        for _ in range(2):  # (sent, not read)
            ranks._asked += 1
            ranks._issue(0, (W.GET, part.id, ranks._asked))
            ranks._flush()
        assert np.array_equal(ranks.get(0, part).array(), data((300, 100)))
        ranks.synchronize()
        # (a part's memfd: none left; the channels between this process and each worker,
        # one each way, mapped once by both, are kept)
        for pid in ranks.pids:
            fds = memfds(pid)
            assert all("actorflow-channel" in f for f in fds) and len(fds) <= 2, fds
        assert all("actorflow-channel" in f for f in memfds("self"))  # (every group's)
        assert big.numpy().sum() == data((300, 100)).sum()  # (big still alive)


def test_puts_and_gets_through_the_channels_keep_every_byte():
    """Parts between INLINE and CHANNEL_MAX bytes go through each worker's channels: many
    puts in a row without a wait (the ring wraps around, fills up while the worker is
    behind and those parts go in memfds of their own), a part larger than the ring (a new,
    larger one), one past CHANNEL_MAX (a memfd), dtypes of every width; every byte comes back,
    and each worker maps at most one channel each way."""
    from actorflow.creation import from_numpy

    rng = np.random.default_rng(5)
    with use_ranks("processes"):
        ranks = ProcessRanks(af.placement("cpu", ranks=[7]), threads=1)
        try:
            sizes = [W.INLINE // 4 + 1, 200_000, 70_001, 300_000] * 6 + [3_000_000, 90_000]
            arrays = [rng.standard_normal(n).astype(np.float32) for n in sizes]
            arrays += [
                rng.integers(-(2**40), 2**40, 50_000),  # int64
                rng.standard_normal(300_001).astype(np.float16),
                rng.standard_normal(30_001),  # float64
                rng.standard_normal(40_000) > 0,  # bool
                rng.standard_normal((5, W.CHANNEL_MAX // 20 + 1)).astype(np.float32),
            ]
            parts = [ranks.put(0, from_numpy(a)._impl) for a in arrays]
            for a, p in zip(arrays, parts, strict=True):
                got = ranks.read(0, p)
                assert got.dtype == a.dtype and got.shape == a.shape
                assert got.tobytes() == a.tobytes()
                assert ranks.get(0, p).array().tobytes() == a.tobytes()
            assert ranks._downs[0].gen >= 2 and ranks._ups[0].gen >= 2  # (grown)
            ranks.synchronize()
            fds = memfds(ranks.pids[0])
            assert all("actorflow-channel" in f for f in fds) and len(fds) <= 2, fds
        finally:
            ranks.close()
    assert ranks._downs == [None] and ranks._ups == [None]


def test_a_channel_ring_places_parts_where_the_worker_consumed():
    """The ring down to a worker (1024 bytes here) writes a part only over bytes the worker
    consumed (its count covers every lap), never cut in two at the end."""
    ch = W.Channel(W.HEADER + 1024, 1)
    h = W.HEADER
    try:
        assert ch.place(300) == (h, 320)  # (in 64-byte steps)
        assert ch.place(300) == (h + 320, 640)
        assert ch.place(400) is None  # (from the start: over parts not consumed)
        ch.consumed[0] = 320
        assert ch.place(400) is None  # (the second part not consumed yet)
        ch.consumed[0] = 640
        assert ch.place(400) == (h, 1024 + 448)  # (the tail skipped)
        assert ch.place(64) == (h + 448, 1024 + 512)
        assert ch.place(2000) is None  # (larger than the ring)
        assert ch.place(600) is None  # (the parts at 0..512 not consumed)
        ch.consumed[0] = 1024 + 448
        assert ch.place(600) is None
        ch.consumed[0] = 1024 + 512
        assert ch.place(600) == (h, 2048 + 640)  # (over the skipped tail: no part there)
        # (over the previous lap's skipped tail, but the count passes the tail only with
        # the part after it: a part here waits for that one; meanwhile a memfd of its own)
        assert ch.place(384) is None
        ch.consumed[0] = 2048 + 640
        assert ch.place(384) == (h + 640, 2048 + 1024)
        assert ch.place(64) == (h, 3072 + 64)  # (over the consumed part at 0..640)
        assert ch.place(640) is None  # (over the part at 640..1024: not consumed)
    finally:
        ch.close()


def test_part_metas_are_the_workers():
    """The metas this process works out for a call's outputs and a view's are those of the
    tensors the workers hold."""
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=3)
        x = af.tensor(data((5, 7))).to_global(p, S1)
        ts = [
            x,
            x * 2,
            x.transpose(0, 1),
            x[1:4],
            x.unsqueeze(1).expand(5, 2, 7),
            x.sum(1),
            x @ af.tensor(data((7, 2))).to_global(p, S0),
            af.nonzero(x.to_global(sbp=B) > 0),
        ]
        for t in ts:
            ranks = t._impl.blob.ranks
            for part in parts_of(t._impl):
                want = ranks.meta(part)
                _, shape, strides, offset = ranks._request(part.rank, (W.META, part.id))
                assert (shape, strides, offset) == (want.shape, want.strides, want.offset)


def test_a_worker_error_is_raised_at_the_read_and_the_ranks_go_on():
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
    e_proc, ok_proc = gather("processes")
    assert type(e_proc) is type(e_inline)
    assert str(e_proc).split("\n")[0] == str(e_inline).split("\n")[0]
    assert "index 7 is out of bounds" in str(e_proc)
    assert ok_proc.tobytes() == ok_inline.tobytes()
    with use_ranks("processes"):  # a dtype error: raised when the call is made, as inline
        x = af.tensor(data((4, 3))).to_global(p, S0)
        with pytest.raises(TypeError, match="gather"):
            af.gather(x, 1, af.tensor(idx.astype(np.float32)).to_global(p, B))
        assert np.array_equal((x + 1).numpy(), data((4, 3)) + 1)


def test_an_asked_part_is_answered_later_whatever_came_between():
    """``ask`` sends a part's read without waiting; ``answer`` returns it later, after
    other reads and commands (answers that come first are kept, a channel-up one copied
    out); an asked part holding an error raises it at ``answer``; a forgotten ask's
    answer is let go."""
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=2)
        ranks = ranks_of(p)
        small = af.tensor(data((4, 3))).to_global(p, B)
        big = af.tensor(data((512, 256))).to_global(p, B)  # (through the channel up)
        a, b = parts_of(small._impl)[1], parts_of(big._impl)[1]
        bad = ranks.call(1, op_def("add"), [a, a], {"alpha": lambda: 0})[0]
        t_small, t_big, t_bad = ranks.ask(1, a), ranks.ask(1, b), ranks.ask(1, bad)
        t_gone = ranks.ask(1, a)
        ranks.forget(t_gone)
        twice = (big * 2).numpy()  # (a read, answered after the asks' answers)
        assert np.array_equal(twice, data((512, 256)) * 2)
        ranks.call(1, op_def("mul"), [b, b], {}, [b])  # (b written after it was asked)
        with pytest.raises(TypeError, match="do not pickle"):
            ranks.answer(1, t_bad)
        assert np.array_equal(ranks.answer(1, t_big), data((512, 256)))
        assert np.array_equal(ranks.answer(1, t_small), data((4, 3)))
        assert ranks._early == {}  # (nothing kept of the forgotten one)
        assert np.array_equal(ranks.read(1, b), data((512, 256)) ** 2)


def test_arguments_that_do_not_pickle_fail_the_part_not_the_ranks():
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=2)
        ranks = ranks_of(p)
        x = af.tensor(data((4, 3))).to_global(p, B)
        part = parts_of(x._impl)[1]
        bad = ranks.call(1, op_def("add"), [part, part], {"alpha": lambda: 0})[0]
        with pytest.raises(TypeError, match="do not pickle"):
            ranks.get(1, bad)
        assert np.array_equal((x * 2).numpy(), data((4, 3)) * 2)


class LoadsBadly:
    """Pickles here, fails to load in the worker."""

    def __reduce__(self):
        return (operator.attrgetter("no_such_attribute"), (0,))


def test_commands_a_worker_cannot_load_end_it_with_a_clear_error():
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=[12, 13])
        ranks = ranks_of(p)
        x = af.tensor(data((4, 3))).to_global(p, B)
        part = parts_of(x._impl)[1]
        bad = ranks.call(1, op_def("add"), [part, part], {"alpha": LoadsBadly()})[0]
        with pytest.raises(ActorError, match=r"rank 1 of .*exit code 1 \(an error in the"):
            ranks.get(1, bad)
        y = af.tensor(data((4, 3))).to_global(p, B)  # new workers
        assert np.array_equal((y * 2).numpy(), data((4, 3)) * 2)


def test_workers_hold_no_named_shared_memory_and_no_leaked_descriptors():
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=3)
        x = af.tensor(data((300, 200))).to_global(p, S0)  # parts past INLINE: memfd moves
        w = af.tensor(data((200, 200), 1)).to_global(p, S0)
        for _ in range(3):
            y = (x.to_global(sbp=B) * 2).to_global(sbp=S1)
            assert np.array_equal(y.numpy(), data((300, 200)) * 2)
            z = (x.to_global(sbp=S1) @ w).to_global(sbp=S1)  # (P -> S: pieces sent once)
            z = z + (x.to_global(sbp=S1) @ w).to_global(sbp=B)  # (P -> B)
        del y, z
        ranks = ranks_of(p)
        ranks.synchronize()
        kept = W._Outbox.SLOTS * ranks.size  # (the collectives' buffers: this rank's, and
        for pid in ranks.pids:  # its map of every other rank's, reused by every collective)
            maps = open(f"/proc/{pid}/maps").read().splitlines()
            shared = [m for m in maps if "/dev/shm/" in m or "memfd:" in m]
            kinds = ("memfd:actorflow-collective", "memfd:actorflow-channel")
            assert all(any(k in m for k in kinds) for m in shared), shared
            assert len({m.split()[4] for m in shared}) <= kept + 2  # (by inode; + channels)
            fds = memfds(pid)
            assert all(any(k in f for k in kinds) for f in fds), fds
            assert len(fds) <= kept + 2, fds


def test_a_killed_worker_is_an_actor_error_naming_the_rank():
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=[4, 5, 6])
        x = af.tensor(data((6, 2))).to_global(p, S0)
        ranks = ranks_of(p)
        pids = ranks.pids
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(ActorError) as e:
            for _ in range(3):  # (the death may be seen at the next send or the read)
                (x + 1).numpy()
        msg = str(e.value)
        assert "rank 1 of placement(type='cpu', ranks=[4, 5, 6])" in msg
        assert "exit code -9" in msg and "SIGKILL" in msg
        for pid in pids:  # the other workers were shut down
            assert (
                not os.path.exists(f"/proc/{pid}/status")
                or "zombie" in open(f"/proc/{pid}/status").read()
            )
        with pytest.raises(ActorError, match="rank 1"):  # and again at the next use
            (x * 2).numpy()
        again = ranks_of(p)  # new workers for the placement
        assert again is not ranks and set(again.pids).isdisjoint(pids) or not again.pids
        y = af.tensor(data((6, 2))).to_global(p, S0)
        assert np.array_equal((y + 1).numpy(), data((6, 2)) + 1)
        assert set(again.pids).isdisjoint(pids)


def test_a_worker_killed_while_another_waits_for_its_part():
    """Rank 1 waits for rank 0's part (a move) when rank 0 is killed: rank 1 is not left
    waiting, and the read names rank 0."""
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=[10, 11])
        x = af.tensor(data((1000, 1000))).to_global(p, S0)
        w = af.tensor(data((1000, 1000), 1)).to_global(p, B)
        ranks = ranks_of(p)
        ranks.synchronize()
        y = (x @ w @ w @ w @ w).to_global(sbp=B)  # (rank 0 busy, then its part moved)
        os.kill(ranks.pids[0], signal.SIGKILL)
        with pytest.raises(ActorError, match=r"rank 0 of placement.*exit code -9"):
            af.parallel.to_local(y, 1)  # (or, if it was sent before the kill, the next op)
            (x + 1).numpy()


def test_use_ranks_selection_and_errors():
    assert af.parallel.ranks.KIND[0] == "inline"
    with use_ranks("processes"):
        assert af.parallel.ranks.KIND[0] == "processes"
        with use_ranks("inline"):
            assert af.parallel.ranks.KIND[0] == "inline"
        assert af.parallel.ranks.KIND[0] == "processes"
    assert af.parallel.ranks.KIND[0] == "inline"
    with pytest.raises(ValueError, match="'inline', 'processes'"):
        use_ranks("threads")
    with pytest.raises(DeviceError, match="type 'cpu'"):
        ProcessRanks(af.placement("null", ranks=2))
    with pytest.raises(DeviceError, match="more than 64"):
        ProcessRanks(af.placement("cpu", ranks=65))
    p = af.placement("cpu", ranks=2)
    x = af.tensor(data((4, 2))).to_global(p, S0)  # inline
    with use_ranks("processes"):
        y = af.tensor(data((4, 2), 1)).to_global(p, S0)
        z = x.to_global(sbp=B)  # a global tensor keeps its ranks
        assert isinstance(z._impl.blob.ranks, InlineRanks)
        big = af.tensor(data((40, 2), 2)).to_global(p, S0)
        small = af.tensor(data((1, 2), 3)).to_global(p, B)
    mixed = x + y  # different ranks: brought onto the larger input's
    assert np.array_equal(mixed.numpy(), data((4, 2)) + data((4, 2), 1))
    bridged = af.tensor(data((1, 2), 3)).to_global(p, B) + big  # (the small one moves)
    assert isinstance(bridged._impl.blob.ranks, ProcessRanks)
    assert np.array_equal(bridged.numpy(), data((1, 2), 3) + data((40, 2), 2))
    assert np.array_equal((small * 2).numpy(), data((1, 2), 3) * 2)


def test_backward_after_the_block_stays_on_the_process_ranks():
    """Autograd's seed made after a ``with use_ranks("processes")`` block (on inline ranks)
    joins the process ranks of what it differentiates."""
    p = af.placement("cpu", ranks=2)
    with use_ranks("processes"):
        w = af.tensor(data((3, 2))).to_global(p, B).requires_grad_()
        x = af.tensor(data((4, 3), 1)).to_global(p, S0)
    loss = (x @ w).sum()
    loss.backward()
    assert isinstance(w.grad._impl.blob.ranks, ProcessRanks)
    want = data((4, 3), 1).sum(0)[:, None] * np.ones((1, 2), np.float32)
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6)


def test_closed_ranks_end_their_workers():
    p = af.placement("cpu", ranks=[8, 9])
    ranks = ProcessRanks(p)
    part = ranks.put(0, af.tensor(data((3,)))._impl)
    ranks.put(1, af.tensor(data((3,)))._impl)
    moved = ranks.move(part, 0, 1)
    assert np.array_equal(ranks.get(1, moved).array(), data((3,)))
    pids = ranks.pids
    ranks.close()
    for pid in pids:
        assert (
            not os.path.exists(f"/proc/{pid}/status")
            or "zombie" in open(f"/proc/{pid}/status").read()
        )
    with pytest.raises(DeviceError, match="closed"):
        ranks.put(0, af.tensor(data((3,)))._impl)
    ranks = ProcessRanks(p)  # collected: its workers end
    ranks.put(0, af.tensor(data((3,)))._impl)
    pids = ranks.pids
    del ranks
    gc.collect()
    for pid in pids:
        assert (
            not os.path.exists(f"/proc/{pid}/status")
            or "zombie" in open(f"/proc/{pid}/status").read()
        )


EXITING = """
import numpy as np
import actorflow as af

if __name__ == "__main__":
    af.parallel.use_ranks("processes")
    p = af.placement("cpu", ranks=2)
    x = af.tensor(np.ones((300, 100), np.float32)).to_global(p, af.sbp.split(0))
    y = (x * 2).to_global(sbp=af.sbp.broadcast)
    print(float(y.sum().numpy()), *af.parallel.ranks_of(p).pids, flush=True)
    z = x + 1  # (left queued and held at the exit)
"""


def test_the_interpreter_exits_with_workers_running(tmp_path):
    script = tmp_path / "exiting.py"
    script.write_text(EXITING)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=40, env=env
    )
    assert done.returncode == 0, done.stderr
    total, *pids = done.stdout.split()
    assert float(total) == 60000.0 and len(pids) == 2
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr
    for pid in pids:
        assert (
            not os.path.exists(f"/proc/{pid}/status")
            or "zombie" in open(f"/proc/{pid}/status").read()
        )
    assert pickle.loads(pickle.dumps(W.PeerGone("x"))).args == ("x",)


@pytest.fixture
def native(monkeypatch):
    """The process ranks' native collectives called (counted by name)."""
    calls = {"all_reduce": 0, "all_gather": 0, "reduce_scatter": 0, "all_to_all": 0}
    for name in calls:
        original = getattr(ProcessRanks, name)

        def counted(self, *a, _name=name, _original=original, **kw):
            calls[_name] += 1
            return _original(self, *a, **kw)

        monkeypatch.setattr(ProcessRanks, name, counted)
    return calls


def partial_sum(p, summands: list):
    """A partial sum on ``p`` whose rank r holds ``summands[r]``."""
    from actorflow.parallel import interpreter as gi
    from actorflow.tensor.tensor import wrap

    ranks = ranks_of(p)
    impls = [ranks.put(r, af.tensor(x)._impl) for r, x in enumerate(summands)]
    x = summands[0]
    return wrap(gi.make(ranks, impls, x.shape, af.tensor(x).dtype, P))


@pytest.mark.parametrize("k", [2, 3])
def test_native_collectives_give_the_bits_of_inline_ranks(k, native):
    """All-reduce (P -> B), all-gather (S -> B), reduce-scatter (P -> S) and all-to-all
    (S -> S) through the workers' shared buffers:
    parts small (in the message) and large (shared memory), growing and shrinking (the
    buffers grown and reused), uneven splits, several dtypes; every rank's part the same
    bits as inline ranks'."""
    shapes = [(4, 5), (300, 70), (40, 9), (700, 301), (300, 70), (2, 9000), (1000, 513)]

    def program(kind):
        p = af.placement("cpu", ranks=k)
        out = []
        for n, shape in enumerate(shapes):
            for dt in (np.float32, np.float64, np.float16, np.int64):
                x = data(shape, n, np.float64)
                if dt is np.int64:
                    x = (x * 100).astype(np.int64)
                a = af.tensor(x.astype(dt))
                # a partial sum whose ranks hold different summands (the order they are
                # added in shows in the bits)
                part = partial_sum(p, [data(shape, 10 * n + r).astype(dt) for r in range(k)])
                out += [held(kind, part.to_global(sbp=B))]
                out += [held(kind, part.T.to_global(sbp=B))]  # (transposed views)
                out += [held(kind, part.to_global(sbp=S0)), held(kind, part.to_global(sbp=S1))]
                out += [held(kind, a.to_global(p, S1).to_global(sbp=B))]
                out += [held(kind, a.to_global(p, S0).to_global(sbp=B))]
                out += [held(kind, a.to_global(p, S0).T.to_global(sbp=B))]
                out += [held(kind, a.to_global(p, S0).to_global(sbp=S1))]
                out += [held(kind, a.to_global(p, S1).to_global(sbp=S0))]
            b = af.tensor(data(shape, n)).to(af.bfloat16).to_global(p, S0)
            y = b.to_global(sbp=P).to_global(sbp=B)
            out += [held(kind, y.float()), af.parallel.to_local(y, k - 1).float().numpy()]
        return out

    both(program)
    assert native["all_reduce"] >= len(shapes) * 5 and native["all_gather"] >= len(shapes) * 8
    assert native["reduce_scatter"] >= len(shapes) * 8 and native["all_to_all"] >= len(shapes) * 8


def test_a_collective_over_a_part_holding_an_error(native):
    """A rank's part holds an error (here an index out of bounds on rank 1 alone): the
    collective's output holds it on every rank (raised at the read, as inline), and the
    ranks go on (the buffers of the ranks that wrote theirs are given back)."""
    p = af.placement("cpu", ranks=2)
    n = 3000  # (parts past the message size: shared memory)
    idx = np.zeros((n, 10), np.int64)
    idx[n - 1, 3] = 99  # (in rank 1's rows)

    def program(kind):
        with use_ranks(kind):
            x = af.tensor(data((n, 10))).to_global(p, S0)
            bad = af.gather(x, 1, af.tensor(idx).to_global(p, S0))
            errors = []
            for y in (bad.to_global(sbp=B), bad.to_global(sbp=P).to_global(sbp=B)):
                for r in range(2):
                    with pytest.raises(IndexOutOfBoundsError) as e:
                        af.parallel.to_local(y, r).numpy()
                    errors.append(str(e.value).split("\n")[0])
            if kind == "inline":  # (an error kept for this process's synchronize, if any)
                try:
                    af.synchronize()
                except IndexOutOfBoundsError:
                    pass
            for _ in range(3):  # (the buffers reused after the failed collectives)
                ok = (x * 2).to_global(sbp=B).numpy()
                assert np.array_equal(ok, data((n, 10)) * 2)
            return errors

    inline = program("inline")
    procs = program("processes")
    assert procs == inline and "index 99 is out of bounds" in procs[0]
    assert native["all_gather"] >= 4 and native["all_reduce"] >= 1


@pytest.mark.parametrize("conversion", ["all_reduce", "all_gather"])
def test_a_worker_killed_during_a_collective(conversion, native):
    """Rank 1 waits in a collective for rank 0's part when rank 0 is killed: rank 1 is not
    left waiting, the read is an ActorError naming rank 0, and the placement starts new
    workers at its next use."""
    with use_ranks("processes"):
        p = af.placement("cpu", ranks=[20, 21])
        w = af.tensor(data((1000, 1000), 1)).to_global(p, B)
        if conversion == "all_reduce":
            x = af.tensor(data((1000, 1000))).to_global(p, S1) @ af.tensor(
                data((1000, 1000), 2)
            ).to_global(p, S0)
            assert x.sbp == (P,)
        else:
            x = af.tensor(data((1000, 1000))).to_global(p, S0)
        ranks = ranks_of(p)
        ranks.synchronize()
        y = (x @ w @ w @ w @ w).to_global(sbp=B)  # (rank 0 busy, then the collective)
        assert native[conversion] == 1
        os.kill(ranks.pids[0], signal.SIGKILL)
        with pytest.raises(ActorError, match=r"rank 0 of placement.*exit code -9"):
            af.parallel.to_local(y, 1).numpy()
            (x + 1).numpy()
        z = af.tensor(data((8, 8))).to_global(p, S0)  # new workers
        assert np.array_equal(z.to_global(sbp=B).numpy(), data((8, 8)))


def test_a_collective_keeps_the_layout_of_transposed_parts(native):
    """A weight's gradient of ``x @ w.T`` is made transposed (a view of a contiguous block):
    its all-reduce gives transposed views of contiguous sums, so ``w.grad`` is made from it
    with no transposed copy, and the all-reduce's values are inline ranks' bits. (The
    gradient's own bits also depend on each process's BLAS threads: OpenBLAS gives other
    bits for these products on 1 and 2 threads on some CPUs, and a worker may run another
    count than this process: compared within rounding.)"""

    def program(kind):
        p = af.placement("cpu", ranks=2)
        w = af.tensor(data((300, 200), 1)).to_global(p, B).requires_grad_()
        x = af.tensor(data((64, 200), 2)).to_global(p, S0)
        ((x @ w.T) ** 2).sum().backward()
        y = partial_sum(p, [data((200, 300), r) for r in range(2)]).T.to_global(sbp=B)
        if kind == "processes":
            made = ranks_of(p)
            for part in parts_of(y._impl):
                m = made.meta(part)
                assert m.shape == (300, 200) and m.strides == (1, 300)
        return [held(kind, w.grad), held(kind, y)]

    got = {}
    for kind in KINDS:
        with use_ranks(kind):
            got[kind] = program(kind)
    (g_in, y_in), (g_pr, y_pr) = got["inline"], got["processes"]
    np.testing.assert_allclose(g_pr, g_in, rtol=1e-5, atol=1e-3)
    assert y_pr.dtype == y_in.dtype and y_pr.tobytes() == y_in.tobytes()
    assert native["all_reduce"] >= 2


TRACED = """
import numpy as np
import actorflow as af

if __name__ == "__main__":
    with af.parallel.use_ranks("processes"):
        p = af.placement("cpu", ranks=2)
        x = af.tensor(np.ones((400, 100), np.float32)).to_global(p, af.sbp.split(0))
        print(float((x * 2).to_global(sbp=af.sbp.broadcast).sum().item()))
        q = af.placement("cpu", ranks=[1])  # (a worker of its own, rank 0 of q)
        y = af.tensor(np.ones(3, np.float32)).to_global(q, af.sbp.broadcast)
        assert float((y - 1).sum().item()) == 0.0
"""


def test_the_workers_trace_their_commands_where_asked(tmp_path):
    """``AF_RANKS_TRACE=<prefix>``: each worker writes a line per command (its start and
    time in ms, what it was) to ``<prefix>.<rank>``, or ``<prefix>.<rank>.<pid>`` where
    another placement's worker of the same rank number wrote that file (each keeps its
    own); with ``AF_RANKS_TRACE_SYNC=1`` too."""
    script = tmp_path / "traced.py"
    script.write_text(TRACED)
    for sync in ("", "1"):
        prefix = tmp_path / f"trace{sync}"
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(sys.path),
            AF_RANKS_TRACE=str(prefix),
            AF_RANKS_TRACE_SYNC=sync,
        )
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=40, env=env
        )
        assert done.returncode == 0, done.stderr
        assert float(done.stdout) == 80000.0
        for r in range(2):
            lines = (tmp_path / f"trace{sync}.{r}").read_text().splitlines()
            calls = [ln.split() for ln in lines if " CALL mul_scalar " in ln]
            assert len(calls) == 1 and float(calls[0][1]) >= 0.0, lines
            assert any(" COLLECT" in ln for ln in lines) and any("combined" in ln for ln in lines)
        (other,) = tmp_path.glob(f"trace{sync}.0.*")  # (q's worker)
        lines = other.read_text().splitlines()
        assert lines[0].startswith("# rank 0, pid ") and any(" sub_scalar " in ln for ln in lines)


def test_writes_into_tensors_made_on_process_ranks_after_the_block():
    """fill_, zero_, copy_ and an optimizer's zero_grad into tensors made inside a
    use_ranks("processes") block, used after it: the new values are made on the tensor's
    own ranks (not the current kind's)."""
    p = af.placement("cpu", 2)
    with use_ranks("processes"):
        g = af.ones(4, 3).to_global(p, af.sbp.split(0))
        m = af.nn.Linear(3, 2).to_global(p)
    g.fill_(2.0)
    np.testing.assert_array_equal(g.numpy(), np.full((4, 3), 2.0))
    g.zero_()
    g.copy_(af.ones(4, 3).to_global(p, af.sbp.broadcast))  # (made on inline ranks)
    np.testing.assert_array_equal(g.numpy(), np.ones((4, 3)))
    assert isinstance(g._impl.blob.ranks, ProcessRanks)
    opt = af.optim.SGD(m.parameters(), lr=0.1)
    x = af.ones(4, 3).to_global(p, af.sbp.split(0))
    for _ in range(2):
        opt.zero_grad(set_to_none=False)
        m(x).sum().backward()
        opt.step()
    assert isinstance(m.weight._impl.blob.ranks, ProcessRanks)


def test_data_parallel_training_survives_a_killed_rank_by_resuming_from_its_checkpoint(
    tmp_path,
):
    """Train on process ranks, checkpoint, train on; a rank is killed: the step raises an
    ActorError naming it; new ranks, the model and optimizer loaded from the checkpoint,
    the lost steps again: the parameters equal an uninterrupted run's."""
    rng = np.random.default_rng(0)
    batches = [
        (rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)) for _ in range(5)
    ]

    def model():
        af.manual_seed(0)
        return af.nn.Sequential(af.nn.Linear(4, 8), af.nn.ReLU(), af.nn.Linear(8, 3))

    def train(m, opt, p, items):
        lf = af.nn.CrossEntropyLoss()
        for x, y in items:
            xs, ys = (af.tensor(a).to_global(p, S0) for a in (x, y))
            opt.zero_grad()
            lf(m(xs), ys).backward()
            opt.step()

    with use_ranks("processes"):
        p = af.placement("cpu", 2)
        want = model().to_global(p)  # the uninterrupted run
        train(want, af.optim.Adam(want.parameters(), lr=0.01), p, batches)
        want_params = [q.numpy() for q in want.parameters()]
        ranks_of(p).close()

        m = model().to_global(p)
        opt = af.optim.Adam(m.parameters(), lr=0.01)
        train(m, opt, p, batches[:3])
        af.save(m.state_dict(), tmp_path / "model.npz")
        af.save(opt.state_dict(), tmp_path / "opt.npz")
        os.kill(ranks_of(p).pids[1], signal.SIGKILL)
        with pytest.raises(ActorError, match="rank 1"):
            train(m, opt, p, batches[3:])
            m[0].weight.numpy()
        m = model().to_global(p)  # new workers, the checkpoint loaded
        opt = af.optim.Adam(m.parameters(), lr=0.01)
        m.load_state_dict(af.load(tmp_path / "model.npz"))
        opt.load_state_dict(af.load(tmp_path / "opt.npz"))
        train(m, opt, p, batches[3:])
        for a, b in zip(want_params, m.parameters(), strict=True):
            np.testing.assert_allclose(b.numpy(), a, rtol=1e-6, atol=1e-7)


def test_a_put_reads_no_tensor_another_thread_is_writing():
    """A put reads a host tensor with nothing pending at once, but as one of the
    runtime's inline calls: under its lock, so a write running inline on another thread
    (which holds that lock) is done first, never half-read."""
    import threading

    from actorflow.creation import from_numpy
    from actorflow.vm.scheduler import get_vm

    x = from_numpy(np.ones(300_000, np.float32))
    vm = get_vm()
    with use_ranks("processes"):
        ranks = ProcessRanks(af.placement("cpu", ranks=[6]), threads=1)
        try:
            ranks.synchronize()
            inside, done = threading.Event(), threading.Event()

            def writer():
                with vm._lock:  # (as an inline kernel writing x runs)
                    inside.set()
                    done.wait(0.3)  # (the put waits for the lock meanwhile)
                    x._impl.blob.array[:] = 2.0

            t = threading.Thread(target=writer)
            t.start()
            inside.wait(10)
            part = ranks.put(0, x._impl)
            done.set()
            t.join(10)
            got = ranks.read(0, part)
            assert float(got.min()) == float(got.max()) == 2.0  # (all after the write)
        finally:
            ranks.close()


@pytest.mark.parametrize("opt_name", ["Adam", "SGD", "Adagrad"])
def test_an_optimizer_state_stays_on_its_parameters_ranks_after_the_block(opt_name):
    """A model made global inside ``use_ranks("processes")`` and trained after the block:
    each state tensor is made on the parameter's process ranks (not this thread's kind,
    inline after the block), so it is where its parameter is and stays the same tensor
    step after step, and a state loaded back lands there too."""
    make = {
        "Adam": lambda ps: af.optim.Adam(ps, lr=0.01),
        "SGD": lambda ps: af.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.1),
        "Adagrad": lambda ps: af.optim.Adagrad(ps, lr=0.1),
    }[opt_name]
    af.manual_seed(0)
    m = af.nn.Linear(4, 2)
    with use_ranks("processes"):
        m.to_global(af.placement("cpu", ranks=[0]))
    opt = make(m.parameters())
    w = m.weight
    x = af.tensor(np.ones((3, 4), np.float32)).to_global(w.placement, af.sbp.broadcast)

    def tensors():
        return {k: v for k, v in opt.state.get(w, {}).items() if isinstance(v, af.Tensor)}

    seen = None
    for _ in range(3):
        opt.zero_grad()
        m(x).sum().backward()
        opt.step()
        now = tensors()
        assert now and all(isinstance(v._impl.blob.ranks, ProcessRanks) for v in now.values())
        assert all(af.functional.is_where(v, w) for v in now.values())
        if seen is not None:
            assert all(now[k] is v for k, v in seen.items())  # (not moved again)
        seen = now
    opt.load_state_dict(opt.state_dict())
    assert all(isinstance(v._impl.blob.ranks, ProcessRanks) for v in tensors().values())
