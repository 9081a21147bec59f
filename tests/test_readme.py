"""Every Python block of the README and of the guide (``docs/**/*.md``) runs as pasted, one
test per block with the id ``file:index`` (each block in a fresh namespace, exactly as
written: a block indented inside a list item would not paste, so it fails here). A block
may set the environment (the CUDA blocks choose the emulator with ``AF_CUDA``): the
environment and the CUDA drivers are put back after it, as a fresh process would have them.

A block that is not meant to run says so by its fence language (```text, ```bash): every
fence names one, and a Python fence is spelled ```python, so no block is skipped by accident.

Why this collector and not pytest-markdown-docs (measured: its 0.9.2 runs the same 13
blocks of README.md and docs/ in the same 1.8 s, all passing, with ``--markdown-docs`` and the
paths given): it collects only with that flag and the Markdown paths on the command line,
while the project's test command is ``python -m pytest -q -n 2 --dist loadgroup`` over
``testpaths = ["tests"]``;
it runs every block in the test process with no teardown of its own, so the environment and
the CUDA driver a block selects with ``AF_CUDA`` would stay for the tests after it unless a
hook of ours put them back anyway; and it would be one more test dependency for what is a
few lines here. pytest-examples has this file's shape (a test parametrized over the blocks
its ``find_examples`` yields) plus ruff/black checks these pages do not hold to, so it would
add a dependency for nothing. The parametrized test below gives per-block ids and failures."""

import contextlib
import io
import os
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").rglob("*.md"))
FENCE = re.compile(r"^[ \t]*```(.*)$", re.M)


def python_blocks(path: pathlib.Path) -> list:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


BLOCKS = [(path, index, code) for path in PAGES for index, code in enumerate(python_blocks(path))]


def block_id(path: pathlib.Path, index: int) -> str:
    return f"{path.relative_to(ROOT).as_posix()}:{index}"


def test_the_readme_and_the_guide_have_python_blocks():
    assert len(python_blocks(README)) >= 1
    pages_with_blocks = {path for path, _, _ in BLOCKS}
    for name in ("tensors", "training", "actor-graphs", "deadlocks", "observing", "testing"):
        assert ROOT / "docs" / f"{name}.md" in pages_with_blocks, name


@pytest.mark.parametrize("path", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_fence_says_whether_it_runs(path):
    """Opening fences name a language; Python is always ```python (which runs)."""
    opening = FENCE.findall(path.read_text())[::2]
    assert "" not in [lang.strip() for lang in opening], (
        f"{path.name}: a fence without a language (use ```text for output)"
    )
    for lang in opening:
        assert lang.strip() not in ("py", "python3", "pycon", "Python"), (
            f"{path.name}: ```{lang} would not run in the tests: write ```python"
        )


@pytest.mark.parametrize("path,index,code", BLOCKS, ids=[block_id(p, i) for p, i, _ in BLOCKS])
def test_a_block_runs_as_pasted(path, index, code):
    from actorflow.backends.cuda.selection import use_driver

    compiled = compile(code, f"{block_id(path, index)} (python block)", "exec")
    env = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compiled, {"__name__": "__readme__"})
    finally:
        os.environ.clear()
        os.environ.update(env)
        if "AF_CUDA" in code:
            import actorflow as af

            af.synchronize(60)
            use_driver(None)  # the drivers made under the block's AF_CUDA go
