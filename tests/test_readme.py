"""Every Python block of the README runs as pasted (each in a fresh namespace, exactly as
written: a block indented inside a list item would not paste, so it fails here). A block
may set the environment (the CUDA blocks choose the emulator with ``AF_CUDA``): the
environment and the CUDA drivers are put back after it, as a fresh process would have them."""

import contextlib
import io
import os
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_block_runs_as_pasted(index):
    from actorflow.backends.cuda.selection import use_driver
    code = compile(BLOCKS[index], f"README.md python block {index}", "exec")
    env = dict(os.environ)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(code, {"__name__": "__readme__"})
    finally:
        os.environ.clear()
        os.environ.update(env)
        if "AF_CUDA" in BLOCKS[index]:
            import actorflow as af
            af.synchronize(60)
            use_driver(None)            # the drivers made under the block's AF_CUDA go
