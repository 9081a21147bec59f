"""Compiling generated kernels (``kernels.KernelSource``) to PTX with NVRTC, which needs no
GPU and no driver: CI compiles every kernel the CUDA driver can generate on CPU-only
machines (tests/test_cuda_kernels.py).

NVRTC comes from the ``nvrtc`` extra: ``cuda-bindings`` (``from cuda.bindings import
nvrtc``, imported lazily, on the first compile) and the ``nvidia-cuda-nvrtc-cu12`` wheel,
whose shared library cuda-bindings finds itself (through cuda-pathfinder). The kernels
include no header (the wheel ships none: float16 is the sources' own 16-bit type, converted
with PTX instructions), so no include path is needed."""

from __future__ import annotations

import os
import threading

from ...errors import DeviceError, KernelCompileError

_CACHE: dict = {}  # (source key, arch) -> PTX bytes
_LOCK = threading.Lock()
_CACHE_MAX = 4096
_CHECKED: set = set()  # (source key, arch) compiled in a batch of compile_together


def _nvrtc():
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as e:  # noqa: BLE001 - ImportError, or the library not found
        raise DeviceError(
            f"NVRTC is not available ({type(e).__name__}: {e}); install the nvrtc extra: "
            f"pip install 'actorflow[nvrtc]' (cuda-bindings 12 and nvidia-cuda-nvrtc-cu12)"
        ) from e
    return nvrtc


def available() -> bool:
    """Whether NVRTC can be loaded here (the nvrtc extra is installed)."""
    try:
        _nvrtc()
    except DeviceError:
        return False
    return True


def version() -> tuple:
    """NVRTC's (major, minor)."""
    nvrtc = _nvrtc()
    _, major, minor = nvrtc.nvrtcVersion()
    return major, minor


def _check(nvrtc, result, what: str):
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise DeviceError(f"NVRTC {what} failed: {err.name}")
    return result[1:]


def numbered(source: str) -> str:
    """The source with line numbers, as NVRTC's log counts them."""
    return "\n".join(f"{i:4d}| {ln}" for i, ln in enumerate(source.splitlines(), 1))


def compile_ptx(src, arch: str = "compute_90") -> bytes:
    """The PTX of kernel ``src`` (a ``KernelSource``) for virtual architecture ``arch``;
    cached by the source's hash in this process.

    Raises KernelCompileError (the kernel's name, NVRTC's log, the numbered source) when the
    source does not compile, DeviceError when NVRTC is not installed."""
    key = (src.key, arch)
    ptx = _CACHE.get(key)
    if ptx is not None:
        return ptx
    nvrtc = _nvrtc()
    filename = f"{src.name}.cu".encode()
    (prog,) = _check(
        nvrtc,
        nvrtc.nvrtcCreateProgram(src.source.encode(), filename, 0, [], []),
        "nvrtcCreateProgram",
    )
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17"]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            (size,) = _check(nvrtc, nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
            log = b" " * size
            _check(nvrtc, nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
            log = log.rstrip(b"\x00 ").decode(errors="replace")
            raise KernelCompileError(
                f"CUDA kernel {src.name} does not compile for {arch} ({result.name}); "
                f"NVRTC's log:\n{log}\nsource ({src.name}.cu):\n{numbered(src.source)}\n"
                f"This is a bug in the kernel generator "
                f"(actorflow/backends/cuda/kernels.py); please report it with this message"
            )
        (size,) = _check(nvrtc, nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    ptx = ptx.rstrip(b"\x00")
    with _LOCK:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[key] = ptx
    return ptx


def compile_together(sources, arch: str = "compute_90") -> None:
    """Compiles many kernels as NVRTC programs of many kernels each (their shared prelude
    once per program): a check that each of them compiles, much faster than one program
    each. The programs compile on threads, one per CPU up to 4 (NVRTC works outside the
    interpreter lock: two threads take about half the time on two cores). On an error, the
    kernels of the program that failed compile one by one, so that the KernelCompileError
    names the kernel and its own source. A kernel this process compiled already for
    ``arch`` (alone, or in an earlier batch) is not compiled again.

    Raises what ``compile_ptx`` raises."""
    from concurrent.futures import ThreadPoolExecutor

    from .kernels import PRELUDE, KernelSource

    todo, seen = [], set()
    for s in sources:
        if s.key in seen or (s.key, arch) in _CACHE or (s.key, arch) in _CHECKED:
            continue
        seen.add(s.key)
        if not s.source.startswith(PRELUDE):
            compile_ptx(s, arch)
            continue
        todo.append(s)
    if not todo:
        return
    n = max(1, min(4, os.cpu_count() or 1, len(todo) // 64))
    chunks = [todo[k::n] for k in range(n)]

    def check(k: int) -> None:
        chunk = chunks[k]
        together = KernelSource(
            f"af_batch_{k}_{len(chunk)}",
            PRELUDE + "".join(s.source[len(PRELUDE) :] for s in chunk),
            (),
            (),
        )
        try:
            compile_ptx(together, arch)
        except KernelCompileError:
            for s in chunk:
                compile_ptx(s, arch)
            raise
        with _LOCK:
            _CACHE.pop((together.key, arch), None)
            if len(_CHECKED) + len(chunk) > _CACHE_MAX * 4:
                _CHECKED.clear()
            _CHECKED.update((s.key, arch) for s in chunk)

    if n == 1:
        check(0)
        return
    with ThreadPoolExecutor(n) as pool:
        for f in [pool.submit(check, k) for k in range(n)]:
            f.result()
