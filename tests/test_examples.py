"""The training examples run as a user runs them, and say what they promise."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def run(*args):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_tiny_model_prints_its_tree_and_trains():
    r = run("examples/tiny_model.py")
    assert r.returncode == 0, r.stderr
    assert "(linear1): Linear(in_features=100, out_features=200, bias=True)" in r.stdout
    assert "step 4: loss" in r.stdout


def test_train_mlp_learns_in_eager_and_graph_mode_with_the_same_losses():
    r = run("examples/train_mlp.py", "--epochs", "2", "--samples", "2048")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "eager and graph mode give the same losses: True" in r.stdout
    acc = [float(line.split("test accuracy ")[1].split("%")[0])
           for line in r.stdout.splitlines() if line.startswith(("eager:", "graph:"))]
    assert len(acc) == 2 and min(acc) > 60          # 10 classes: chance is 10%
