"""The training examples run as a user runs them, and say what they promise."""

import importlib.util
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(*args):
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_tiny_model_prints_its_tree_and_trains():
    r = run("examples/tiny_model.py")
    assert r.returncode == 0, r.stderr
    assert "(linear1): Linear(in_features=100, out_features=200, bias=True)" in r.stdout
    assert "step 4: loss" in r.stdout


def test_train_mlp_learns_in_eager_and_graph_mode_with_the_same_losses():
    r = run("examples/train_mlp.py", "--epochs", "2", "--samples", "2048")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "eager and graph mode give the same losses: True" in r.stdout
    acc = [
        float(line.split("test accuracy ")[1].split("%")[0])
        for line in r.stdout.splitlines()
        if line.startswith(("eager:", "graph:"))
    ]
    assert len(acc) == 2 and min(acc) > 60  # 10 classes: chance is 10%


# -- the two model scripts ------------------------------------------------------------------
# Each runs on a small slice (a few seconds) and must show, scaled down, what it promises:
# the loss falls, eager and graph mode give the same losses, and the accuracy clears a floor
# well above chance for the slice.


def has(*modules):
    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_examples_extra = pytest.mark.skipif(
    not has("sklearn", "PIL"),
    reason="the digits example needs scikit-learn and Pillow: pip install -e '.[examples]'",
)


def load_example(name):
    """An example script imported as a module (its main() not run)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
    """One PNG cache for the module's tests (the first to use it writes it)."""
    return tmp_path_factory.mktemp("digits-cache") / "digits"


def final_lines(stdout, *modes):
    return {
        line.split(":")[0]: line
        for line in stdout.splitlines()
        if line.startswith(tuple(f"{m}: " for m in modes))
    }


@needs_examples_extra
def test_digits_are_written_as_png_files_once_and_read_back_with_seeded_shifts(digits_dir):
    ex = load_example("train_digits_cnn")
    paths, labels = ex.digits_as_pngs(digits_dir)
    assert len(paths) == len(labels) == 1797 and set(labels) == set(range(10))
    first = paths[0].stat().st_mtime_ns
    again, labels2 = ex.digits_as_pngs(digits_dir)  # the cache, not written again
    assert again == paths and (labels2 == labels).all()
    assert paths[0].stat().st_mtime_ns == first
    assert [p.name for p in digits_dir.parent.iterdir()] == ["digits"]  # no part left over
    from sklearn.datasets import load_digits

    pixels = ex.read_png(paths[5])
    assert pixels.dtype == np.uint8 and pixels.shape == (8, 8)
    np.testing.assert_array_equal(pixels, np.round(load_digits().images[5] * 255 / 16))

    plain = ex.DigitFiles(paths[:64], labels[:64])
    shifted = ex.DigitFiles(paths[:64], labels[:64], augment=True, seed=3)
    x, y = plain[7]
    assert x.shape == (1, 8, 8) and x.dtype == np.float32 and y == labels[7]
    moved = set()
    for epoch in range(3):
        shifted.set_epoch(epoch)
        for i in range(64):
            dy, dx = shifted.shifts[i]
            assert -1 <= dy <= 1 and -1 <= dx <= 1
            moved.add((int(dy), int(dx)))
            want = ex.normalize(ex.shifted(ex.read_png(paths[i]), dy, dx))[None]
            np.testing.assert_array_equal(shifted[i][0], want)
    assert len(moved) == 9  # every shift occurs
    again = ex.DigitFiles(paths[:64], labels[:64], augment=True, seed=3)
    again.set_epoch(2)
    np.testing.assert_array_equal(again.shifts, shifted.shifts)  # seeded per epoch
    np.testing.assert_array_equal(
        ex.shifted(np.arange(9).reshape(3, 3), 1, -1), [[0, 0, 0], [1, 2, 0], [4, 5, 0]]
    )


@needs_examples_extra
def test_train_digits_cnn_learns_in_eager_and_graph_mode_with_the_same_losses(digits_dir):
    r = run(
        "examples/train_digits_cnn.py",
        "--epochs",
        "2",
        "--samples",
        "640",
        "--data",
        str(digits_dir),
        "--modes",
        "eager,graph,fused",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "eager, graph, fused give the same losses: True" in r.stdout
    lines = final_lines(r.stdout, "eager", "graph", "fused")
    assert len(lines) == 3
    for line in lines.values():
        first, last = (float(v) for v in line.split("loss ")[1].split(",")[0].split(" -> "))
        assert last < first
        assert float(line.split("test accuracy ")[1].split("%")[0]) > 70  # chance is 10%
    assert len(list(digits_dir.glob("*.png"))) == 1797


def test_train_tiny_transformer_learns_in_eager_and_graph_mode_and_samples_text():
    r = run(
        "examples/train_tiny_transformer.py", "--epochs", "2", "--chars", "8000", "--sample", "40"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "eager, graph give the same losses: True" in r.stdout
    lines = final_lines(r.stdout, "eager", "graph")
    assert len(lines) == 2
    for line in lines.values():
        first, last = (float(v) for v in line.split("loss ")[1].split(",")[0].split(" -> "))
        assert last < first
        assert float(line.split("validation loss ")[1].split(",")[0]) < 3.2  # ln 97 = 4.57
    sample = r.stdout.split("seed 0):\n")[1]
    assert sample.startswith("def ") and len(sample.split("\neager, graph")[0]) == 44
