"""The CUDA tests' fixtures and their comparison with cpu, one place for every
tests/test_cuda_*.py (loaded by conftest.py as a plugin):

- ``emu``: cuda:0 on a fresh emulator, for the tests that need what only the emulator has
  (stream delays, injected faults, its queues and logs). ``emu(**kw)`` starts over with
  those options (``delay``, ``seed``, ``limit``...) and returns the driver. A test module
  that sets ``EMU_DRIVER`` (an ``EmuDriver`` subclass, e.g. one that logs its commands) gets
  that class instead.
- ``cuda``: cuda:0 working, on each driver: ``"emu"`` (the module's emulator, as ``emu()``)
  always, ``"cupy"`` (the CuPy driver on the GPU) marked ``gpu``, so ``pytest -m gpu``
  runs the driver-independent tests on a real GPU; skipped with ``gpu_missing()``'s reason
  where there is none. Returns the driver. A GPU-only test takes ``cuda`` under ``ON_GPU``
  (its ``"cupy"`` case only), marked ``gpu`` and ``af_gpu`` itself.
- ``launches``: cuda:0 on a fresh ``EmuDriver``; the list of the kernels launched there.
- ``assert_same``: a device's result against cpu's, exact on the emulator (it runs the
  numpy kernels) and exact on a GPU where IEEE arithmetic makes it so.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import actorflow as af
from actorflow.backends.cuda.emu import EmuDriver, EmuStream
from actorflow.backends.cuda.selection import driver_for, use_driver
from actorflow.errors import KernelError
from actorflow.testing import gpu_missing

CUDA = "cuda:0"

# rtol (and atol) of a comparison that is not exact on a GPU, by dtype: a few ulp of CUDA's
# libm (exp, log, tanh, pow...), another order of a reduction, cuBLAS's matmul
GPU_RTOL = {np.dtype(np.float16): 2e-3, np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}

ON_GPU = pytest.mark.parametrize("cuda", ["cupy"], indirect=True)  # the cupy case only

_ON = {"driver": "emu"}  # the driver the `cuda` fixture put on cuda:0


def settle() -> None:
    """Waits for every device's work (a kernel fault left unreported is dropped) and
    collects the garbage, so the next driver starts with no blob of the last one alive."""
    try:
        af.synchronize(30)
    except KernelError:
        pass
    gc.collect()


def on_emulator() -> bool:
    """Whether cuda:0 is on the emulator in this test (False under ``cuda[cupy]``)."""
    return _ON["driver"] == "emu"


def assert_captures(run, captures: int, replays: int) -> None:
    """``run`` (a compiled step's ``DeviceProgram``) was captured ``captures`` times and
    replayed ``replays`` times. On CuPy a step that calls cuBLAS (a matmul's reference form)
    is the exception, checked as such: CuPy refuses cuBLAS calls while a stream captures, so
    its first capture is refused (``capture_failed`` names cuBLAS) and every later step is
    launched one by one (``uncaptured``)."""
    if on_emulator() or run.capture_failed is None:
        assert (run.captures, run.replays) == (captures, replays), run.capture_failed
    else:
        assert "cuBLAS" in run.capture_failed, run.capture_failed
        assert (run.captures, run.replays, run.uncaptured) == (0, 0, captures + replays - 1)


def assert_same(got, want, exact: bool = True, rtol: float | None = None) -> None:
    """``got`` (computed on cuda:0) equals ``want`` (the same on cpu, or the expected
    values): same dtype and shape, and the same values bit for bit on the emulator (it runs
    the numpy kernels) whatever ``exact`` says. On a GPU (``cuda[cupy]``), bit for bit too
    where ``exact`` (the default): the ops IEEE arithmetic rounds one way - add, sub, mul,
    div, compares, casts, copies, relu, max, min, integer and bool ops; with
    ``exact=False`` (transcendental functions - exp, log, tanh, pow, sigmoid, gelu -,
    reductions and matmul, and what is computed from them) within ``rtol`` (and as much
    ``atol``), by default ``GPU_RTOL`` of the dtype (a few ulp of CUDA's libm, another
    order of a sum, cuBLAS); integer and bool results are exact always. Lists and Python
    numbers compare as arrays."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
    )
    if exact or on_emulator() or want.dtype.kind not in "fc":
        np.testing.assert_array_equal(got, want)
        return
    tol = GPU_RTOL.get(want.dtype, 1e-5) if rtol is None else rtol
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _start(factory):
    settle()
    use_driver(factory)
    return driver_for(CUDA)


@pytest.fixture
def emu(request):
    """``emu(**kw)``: cuda:0 on a fresh emulator (the module's ``EMU_DRIVER``, else
    ``EmuDriver``) with those options; returns the driver. Settled and reset after."""
    cls = getattr(request.module, "EMU_DRIVER", EmuDriver)
    yield lambda **kw: _start(lambda dev: cls(dev, **kw))
    settle()
    use_driver(None)


@pytest.fixture
def launches(emu, monkeypatch):
    """cuda:0 on a fresh emulator; returns the list of kernels launched there, in order."""
    seen = []
    launch = EmuStream.launch

    def counted(self, kernel, args, grid=None, block=None):
        seen.append(kernel)
        return launch(self, kernel, args, grid, block)

    monkeypatch.setattr(EmuStream, "launch", counted)
    emu()
    return seen


@pytest.fixture(params=["emu", pytest.param("cupy", marks=[pytest.mark.gpu, pytest.mark.af_gpu])])
def cuda(request, emu):
    """cuda:0 working on each driver: the emulator (as ``emu()``), and the CuPy driver on
    a GPU (marked ``gpu``; skipped with the reason where there is none). Returns the
    driver."""
    if request.param == "emu":
        yield emu()
        return
    why = gpu_missing()
    if why is not None:
        pytest.skip(why)
    from actorflow.backends.cuda.cupy_driver import CupyDriver

    _ON["driver"] = "cupy"
    try:
        yield _start(lambda dev: CupyDriver(dev))
    finally:
        _ON["driver"] = "emu"


@pytest.fixture
def one_launch_per_op(monkeypatch):
    """Every eager op call its own launch: no runs of queued elementwise calls (whether they
    form depends on how far the caller is ahead of the VM; test_cuda_eager_runs.py tests
    them), for the modules whose tests count, name or fault single launches
    (``pytestmark = pytest.mark.usefixtures("one_launch_per_op")``)."""
    monkeypatch.setattr(af.lowlevel.get_vm().runs, "device_max", 0)
