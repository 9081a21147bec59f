"""af.data.DataLoader: PyTorch's habits (len, a new pass per epoch, seeded shuffle,
drop_last) over an actor graph whose loading stage runs on ``workers`` replicas."""

import threading
import time

import numpy as np
import pytest

import actorflow as af
from actorflow.data import DataLoader, Dataset, IterableDataset, TensorDataset


def dataset(n=10):
    return TensorDataset(np.arange(n, dtype=np.float32).reshape(n, 1) * 10, np.arange(n))


def labels(loader):
    return [y.tolist() for _, y in loader]


def test_len_batches_and_drop_last():
    assert len(DataLoader(dataset(10), batch_size=3)) == 4
    assert len(DataLoader(dataset(10), batch_size=3, drop_last=True)) == 3
    assert labels(DataLoader(dataset(10), batch_size=3)) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert labels(DataLoader(dataset(10), batch_size=5, drop_last=True)) == [
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
    ]
    x, y = next(iter(DataLoader(dataset(10), batch_size=4)))
    assert isinstance(x, af.Tensor) and x.shape == (4, 1) and y.dtype is af.int64
    np.testing.assert_array_equal(x.numpy()[:, 0], [0, 10, 20, 30])


def test_shuffle_is_seeded_new_per_epoch_and_covers_every_sample():
    dl = DataLoader(dataset(20), batch_size=6, shuffle=True, seed=7)
    e1, e2 = labels(dl), labels(dl)
    for e in (e1, e2):
        assert sorted(sum(e, [])) == list(range(20))
    assert e1 != e2
    again = DataLoader(dataset(20), batch_size=6, shuffle=True, seed=7)
    assert labels(again) == e1 and labels(again) == e2
    af.manual_seed(3)
    a = labels(DataLoader(dataset(20), batch_size=6, shuffle=True))
    af.manual_seed(3)
    assert labels(DataLoader(dataset(20), batch_size=6, shuffle=True)) == a


class Slow(Dataset):
    """Each sample takes a while (GIL released), and the dataset counts overlapping calls."""

    def __init__(self, n):
        self.n, self.lock, self.active, self.most = n, threading.Lock(), 0, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        with self.lock:
            self.active += 1
            self.most = max(self.most, self.active)
        time.sleep(0.005)
        with self.lock:
            self.active -= 1
        return np.full(2, i, np.float32), i


def test_workers_load_batches_at_once_and_keep_their_order():
    slow = Slow(24)
    dl = DataLoader(slow, batch_size=2, workers=4, buffers=4)
    assert labels(dl) == [[2 * k, 2 * k + 1] for k in range(12)]
    assert 2 <= slow.most <= 4
    one = Slow(8)
    assert labels(DataLoader(one, batch_size=2)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert one.most == 1


def test_iterable_dataset_and_dict_samples():
    class Stream(IterableDataset):
        def __iter__(self):
            for i in range(7):
                yield {"x": np.full(3, i, np.float32), "y": i}

    dl = DataLoader(Stream(), batch_size=3)
    batches = list(dl)
    assert [b["y"].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5], [6]]
    assert batches[0]["x"].shape == (3, 3)
    assert [b["y"].tolist() for b in DataLoader(Stream(), batch_size=3, drop_last=True)] == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    with pytest.raises(TypeError, match="iterable dataset"):
        len(dl)
    with pytest.raises(ValueError, match="shuffle needs a map-style"):
        DataLoader(Stream(), shuffle=True)


def test_errors_name_the_stage_and_the_loader_runs_again():
    class Bad(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 3 and fail[0]:
                raise KeyError("sample 3 is missing")
            return np.float32(i)

    fail = [True]
    dl = DataLoader(Bad(), batch_size=2)
    with pytest.raises(af.ActorError) as ei:
        list(dl)
    assert ei.value.actor == "load" and ei.value.piece == 1
    fail[0] = False
    assert [b.tolist() for b in dl] == [[0, 1], [2, 3], [4, 5]]
    for _ in dl:  # a pass left early: the next one starts afresh
        break
    assert len(list(dl)) == 3


def test_memory_budget_and_arguments():
    big = TensorDataset(np.zeros((64, 1024), np.float32))
    with pytest.raises(af.PlanError, match="budget"):
        list(DataLoader(big, batch_size=32, memory={"cpu": "64KiB"}))
    assert len(list(DataLoader(big, batch_size=32, memory={"cpu": "2MiB"}))) == 2
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(big, batch_size=0)
    with pytest.raises(ValueError, match="workers"):
        DataLoader(big, workers=-1)
    with pytest.raises(TypeError, match="__getitem__"):
        DataLoader(5)
    with pytest.raises(ValueError, match="first dims differ"):
        TensorDataset(np.zeros(3), np.zeros(4))


def test_passes_may_overlap():
    dl = DataLoader(TensorDataset(np.arange(6.0)), batch_size=2)
    inner = [[b.tolist() for (b,) in dl] for (_,) in dl]
    assert inner == [[[0, 1], [2, 3], [4, 5]]] * 3
    assert [(a.tolist(), b.tolist()) for (a,), (b,) in zip(dl, dl, strict=True)] == [
        ([0, 1], [0, 1]),
        ([2, 3], [2, 3]),
        ([4, 5], [4, 5]),
    ]


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(memory="1MiB"), r"memory takes a byte budget per device, e\.g\. memory=\{'cpu'"),
        (dict(memory={"cpu": "lots"}), "cannot read 'lots' as a byte count"),
        (dict(buffers=0), r"DataLoader: buffers must be an int >= 1 .* or \"auto\""),
        (dict(buffers="many"), "DataLoader: buffers"),
        (dict(shuffle="yes"), "shuffle must be True or False"),
        (dict(drop_last=1), "drop_last must be True or False"),
        (dict(collate_fn=3), "collate_fn must be a function"),
        (dict(seed="x"), "seed must be an int"),
    ],
)
def test_dataloader_arguments_are_checked_by_name(kw, match):
    ds = TensorDataset(np.zeros((10, 2), np.float32))
    with pytest.raises((TypeError, ValueError), match=match):
        DataLoader(ds, batch_size=2, **kw)


def test_dataloader_takes_auto_buffers_and_a_budget_per_device():
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    for kw in (dict(buffers="auto"), dict(buffers="auto", workers=2), dict(memory={"cpu": "1MiB"})):
        got = [b[0].numpy() for b in DataLoader(TensorDataset(x), batch_size=4, **kw)]
        np.testing.assert_array_equal(np.concatenate(got), x)
