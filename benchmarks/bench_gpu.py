#!/usr/bin/env python
"""actorflow on a CUDA device against raw CuPy and PyTorch CUDA, in the same run.

The rows, each with its baselines in the same process (interleaved rounds, best of N, every
result checked against numpy):

1. ``chain``: a dependent chain ``t = relu(t + 1)`` of N steps on 1,000 float32, ending in
   a read to the host: per step, actorflow on ``cuda:0`` against CuPy ufuncs (two kernels
   a step), a cached CuPy ``RawKernel`` (one), and torch CUDA. Goal: <= 8 us a step and
   below torch eager.
2. ``bandwidth``: ``relu`` over 256M float32 (16M with ``--quick``), read + write, in TB/s,
   against the device's own copy of the same bytes (``memcpyAsync`` device to device), CuPy's
   ufunc and torch. Goal: actorflow >= 0.9 of the device copy.
3. ``h2d``: 64 MiB from the host to the device, GB/s: actorflow (``x.to('cuda:0')`` of a
   host tensor: a private pinned copy, then the asynchronous copy) against CuPy from a
   pinned buffer on a stream and torch ``pin_memory().to(non_blocking=True)``. Goal: >= 50.
4. ``completion``: the time from issuing a tiny kernel to a coroutine resuming after it,
   median over 200: actorflow ``await af.synchronize_async()`` against CuPy's
   ``launch_host_func`` + ``call_soon_threadsafe``. Goal: <= 40 us.

5. ``pipeline``: ``[host source, Copy("cuda:0"), 4 x (matmul + relu), Copy("cpu")]`` on
   actors with 2 registers an edge, against the ideal overlap max(copy only, compute only),
   each measured the same way; CuPy by hand (two streams, two buffers, events) the same.
   Goal: >= 0.97 of the ideal.
6. ``mlp``: an MLP 784-256-10 training step (SGD with momentum, batch 128): actorflow eager
   and ``nn.Graph`` (a CUDA graph after its first step) against torch eager and torch's whole
   step captured as a CUDA graph. Goals: eager <= torch eager; graph <= torch's graph.

On a machine without a GPU, ``--emu`` runs the actorflow rows on the CPU emulator of the
CUDA driver (``AF_CUDA=emu``): those figures are the host's cost of issuing and completing
CUDA work through the runtime (what launch-ahead and the completion path cost the CPU), not
GPU figures; the baselines are skipped with the reason. Without ``--emu`` and without a GPU
it says so and exits 2.

The JSON (``benchmarks/results/bench_gpu.json``, ``bench_gpu_emu.json`` with ``--emu``)
records the GPU's name, the CuPy, CUDA and torch versions, and every row.

Usage::

    python benchmarks/bench_gpu.py               # on a GPU machine (scripts/gpu_check.sh)
    python benchmarks/bench_gpu.py --quick
    python benchmarks/bench_gpu.py --emu --quick # the host's side, on the emulator
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402 - the shared timing harness, next to this file

CHAIN_GOAL_US = 8.0
BANDWIDTH_GOAL = 0.9
H2D_GOAL_GBS = 50.0
COMPLETION_GOAL_US = 40.0


def gpu_libraries(emu: bool):
    """``(cupy, torch_or_None, why)``: the baselines' libraries on a GPU; on the emulator
    (or without a GPU) cupy is None and ``why`` says why."""
    if emu:
        return None, None, "--emu: the rows run on the CPU emulator, which has no baselines"
    cupy = harness.try_import("cupy")
    if cupy is None:
        return None, None, "CuPy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, None, "CuPy sees no CUDA device"
    except Exception as e:  # noqa: BLE001 - no driver, no device: no GPU here
        return None, None, f"CuPy sees no CUDA device ({type(e).__name__}: {e})"
    torch = harness.try_import("torch")
    if torch is not None and not torch.cuda.is_available():
        torch = None
    return cupy, torch, None


def close(a, b) -> str | None:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    if not np.allclose(a, b, rtol=1e-5, atol=1e-5):
        return f"max abs difference {float(np.max(np.abs(a - b)))}"
    return None


# -- 1. the dependent chain ----------------------------------------------------------------

RELU_ADD1 = r"""
extern "C" __global__ void relu_add1(const float* x, float* y, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = x[i] + 1.0f;
        y[i] = v > 0.0f ? v : 0.0f;
    }
}
"""


def chain_contenders(af, cupy, torch, x0: np.ndarray, steps: int) -> list:
    ref = x0.copy()
    for _ in range(steps):
        ref = np.maximum(ref + np.float32(1), np.float32(0))
    cs = []

    def af_chain():
        t = af.tensor(x0, device="cuda:0")
        for _ in range(steps):
            t = (t + 1).relu()
        return t.numpy()

    cs.append(
        harness.Contender(
            "actorflow cuda:0",
            af_chain,
            close,
            ref=ref,
            note="eager ops on cuda:0, read with numpy()",
        )
    )
    if cupy is not None:

        def cupy_ufuncs():
            t = cupy.asarray(x0)
            for _ in range(steps):
                t = cupy.maximum(t + 1, 0)
            return cupy.asnumpy(t)

        kernel = cupy.RawKernel(RELU_ADD1, "relu_add1")
        n = x0.size

        def cupy_raw():
            a = cupy.asarray(x0)
            b = cupy.empty_like(a)
            for _ in range(steps):
                kernel(((n + 255) // 256,), (256,), (a, b, np.int64(n)))
                a, b = b, a
            return cupy.asnumpy(a)

        cs.append(
            harness.Contender(
                "cupy ufuncs", cupy_ufuncs, close, ref=ref, note="two kernels a step", baseline=True
            )
        )
        cs.append(
            harness.Contender(
                "cupy RawKernel",
                cupy_raw,
                close,
                ref=ref,
                note="one cached kernel a step",
                baseline=True,
            )
        )
    if torch is not None:

        def torch_chain():
            t = torch.from_numpy(x0).cuda()
            for _ in range(steps):
                t = torch.relu(t + 1)
            return t.cpu().numpy()

        cs.append(harness.Contender("torch cuda", torch_chain, close, ref=ref, baseline=True))
    return cs


# -- 2. bandwidth --------------------------------------------------------------------------


def bandwidth_contenders(af, cupy, torch, n: int) -> list:
    rng = np.random.default_rng(0)
    host = rng.standard_normal(n, dtype=np.float32)
    ref = np.maximum(host, 0)
    cs = []
    x = af.tensor(host, device="cuda:0")

    def af_relu():
        y = x.relu()
        af.synchronize()
        return y

    cs.append(
        harness.Contender(
            "actorflow relu",
            af_relu,
            close,
            ref=ref,
            fetch=lambda y: y.numpy(),
            note="a fresh output each run",
        )
    )
    if cupy is not None:
        a = cupy.asarray(host)
        b = cupy.empty_like(a)

        def device_copy():
            cupy.cuda.runtime.memcpyAsync(
                b.data.ptr,
                a.data.ptr,
                a.nbytes,
                cupy.cuda.runtime.memcpyDeviceToDevice,
                cupy.cuda.get_current_stream().ptr,
            )
            cupy.cuda.get_current_stream().synchronize()
            return b

        def cupy_relu():
            cupy.maximum(a, 0, out=b)
            cupy.cuda.get_current_stream().synchronize()
            return b

        cs.append(
            harness.Contender(
                "device copy",
                device_copy,
                close,
                ref=host,
                fetch=cupy.asnumpy,
                note="the ceiling",
                baseline=True,
            )
        )
        cs.append(
            harness.Contender(
                "cupy ufunc", cupy_relu, close, ref=ref, fetch=cupy.asnumpy, baseline=True
            )
        )
    if torch is not None:
        ta = torch.from_numpy(host).cuda()
        tb = torch.empty_like(ta)

        def torch_relu():
            torch.clamp(ta, min=0, out=tb)
            torch.cuda.synchronize()
            return tb

        cs.append(
            harness.Contender(
                "torch relu",
                torch_relu,
                close,
                ref=ref,
                fetch=lambda t: t.cpu().numpy(),
                baseline=True,
            )
        )
    return cs


# -- 3. host to device ---------------------------------------------------------------------


def h2d_contenders(af, cupy, torch, nbytes: int) -> list:
    host = np.arange(nbytes // 4, dtype=np.float32)
    cs = []
    src = af.tensor(host)

    def af_h2d():
        y = src.to("cuda:0")
        af.synchronize()
        return y

    cs.append(
        harness.Contender(
            "actorflow .to('cuda:0')",
            af_h2d,
            close,
            ref=host,
            fetch=lambda y: y.numpy(),
            note="a private pinned copy, then the async copy",
        )
    )
    if cupy is not None:
        pinned = cupy.cuda.alloc_pinned_memory(host.nbytes)
        staged = np.frombuffer(pinned, np.float32, host.size)
        staged[...] = host
        dst = cupy.empty(host.shape, np.float32)
        stream = cupy.cuda.Stream(non_blocking=True)

        def cupy_h2d():
            dst.set(staged, stream=stream)
            stream.synchronize()
            return dst

        cs.append(
            harness.Contender(
                "cupy pinned", cupy_h2d, close, ref=host, fetch=cupy.asnumpy, baseline=True
            )
        )
    if torch is not None:
        th = torch.from_numpy(host).pin_memory()

        def torch_h2d():
            y = th.to("cuda", non_blocking=True)
            torch.cuda.synchronize()
            return y

        cs.append(
            harness.Contender(
                "torch pinned",
                torch_h2d,
                close,
                ref=host,
                fetch=lambda t: t.cpu().numpy(),
                baseline=True,
            )
        )
    return cs


# -- 4. completion into asyncio ------------------------------------------------------------


def completion_latency(af, cupy, count: int) -> dict:
    """Median microseconds from issuing a tiny kernel to the coroutine resuming."""
    out = {}

    async def af_side():
        x = af.tensor(np.zeros(4, np.float32), device="cuda:0")
        await af.synchronize_async()
        times = []
        for _ in range(count):
            t0 = time.perf_counter()
            x = x + 1
            await af.synchronize_async()
            times.append(time.perf_counter() - t0)
        if float(x.numpy()[0]) != count:
            raise AssertionError(f"the chain read {x.numpy()[0]}, not {count}")
        return times

    out["actorflow synchronize_async"] = asyncio.run(af_side())
    if cupy is not None:

        async def cupy_side():
            loop = asyncio.get_running_loop()
            stream = cupy.cuda.Stream(non_blocking=True)
            a = cupy.zeros(4, np.float32)
            times = []
            with stream:
                for _ in range(count):
                    fut = loop.create_future()
                    t0 = time.perf_counter()
                    a += 1
                    stream.launch_host_func(
                        lambda _, fut=fut: loop.call_soon_threadsafe(fut.set_result, None), None
                    )
                    await fut
                    times.append(time.perf_counter() - t0)
            return times

        out["cupy launch_host_func"] = asyncio.run(cupy_side())
    return {
        k: {"median_us": statistics.median(v) * 1e6, "best_us": min(v) * 1e6, "count": len(v)}
        for k, v in out.items()
    }


# -- 5. a copy/compute pipeline on actors --------------------------------------------------


def _compute(x, w):
    """The compute stage: a few matmuls over the piece (x: [rows, 1024], w: [1024, 1024])."""
    for _ in range(4):
        x = (x @ w).relu()
    return x.sum(0)


def pipeline_contenders(af, cupy, pieces: int, rows: int) -> tuple[list, dict]:
    """actorflow: ``[host source, Copy(cuda), compute, Copy(cpu)]`` with 2 registers an edge,
    and the same with only the copy (the compute a tiny op) and only the compute (a one-number
    piece copied over, the compute on a tensor already on the device); the ideal is
    max(copy only, compute only). CuPy by hand: two streams,
    two device buffers, events between them (issue 12 measured 1.004 of the ideal)."""
    rng = np.random.default_rng(1)
    host = [rng.standard_normal((rows, 1024), dtype=np.float32) for _ in range(2)]
    wh = (rng.standard_normal((1024, 1024), dtype=np.float32) / 32).astype(np.float32)
    ref = []
    for i in range(pieces):
        x = host[i % 2]
        for _ in range(4):
            x = np.maximum(x @ wh, 0)
        ref.append(x.sum(0))
    w = af.tensor(wh, device="cuda:0")
    dev = [af.tensor(h, device="cuda:0") for h in host]

    def source():
        for i in range(pieces):
            yield host[i % 2]

    def check(out, want):
        if len(out) != len(want):
            return f"{len(out)} pieces, not {len(want)}"
        for a, b in zip(out, want, strict=True):
            bad = close(np.asarray(a), b) if np.ndim(b) else None
            if bad:
                return bad
        return None

    def run(stages):
        return list(af.Pipeline(stages, buffers=2).run())

    full = harness.Contender(
        "actorflow copy+compute",
        lambda: run([source(), af.Copy("cuda:0"), lambda x: _compute(x, w), af.Copy("cpu")]),
        check,
        ref=ref,
        note="source -> Copy(cuda) -> compute -> Copy(cpu), buffers=2",
    )
    copy_only = harness.Contender(
        "actorflow copy only",
        lambda: run([source(), af.Copy("cuda:0"), lambda x: x[:1, :1] * 1, af.Copy("cpu")]),
        lambda out, _: None if len(out) == pieces else f"{len(out)} pieces",
    )
    compute_only = harness.Contender(
        "actorflow compute only",
        lambda: run(
            [
                (np.array([i % 2], np.int64) for i in range(pieces)),
                af.Copy("cuda:0"),
                lambda _i: _compute(dev[0], w),  # (the piece only paces it)
                af.Copy("cpu"),
            ]
        ),
        lambda out, want: check(out, [want[0]] * len(want)),
        ref=ref,
    )
    cs = [full, copy_only, compute_only]
    if cupy is not None:
        wc = cupy.asarray(wh)
        pinned = [cupy.cuda.alloc_pinned_memory(h.nbytes) for h in host]
        staged = [
            np.frombuffer(p, np.float32, h.size).reshape(h.shape)
            for p, h in zip(pinned, host, strict=True)
        ]
        for s_, h in zip(staged, host, strict=True):
            s_[...] = h
        bufs = [cupy.empty((rows, 1024), np.float32) for _ in range(2)]
        # "compute only" reads them without copying:
        for buf, h in zip(bufs, host, strict=True):
            buf.set(h)  # their values are there before any run
        cupy.cuda.Device().synchronize()

        def cupy_pipeline(copy=True, compute=True):
            cs_, ks = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
            copied = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
            free = [cupy.cuda.Event(disable_timing=True) for _ in range(2)]
            outs = []
            for i in range(pieces):
                b = i % 2
                if copy:
                    cs_.wait_event(free[b]) if i >= 2 else None
                    bufs[b].set(staged[b], stream=cs_)
                    copied[b].record(cs_)
                    ks.wait_event(copied[b])
                if compute:
                    with ks:
                        x = bufs[b]
                        for _ in range(4):
                            x = cupy.maximum(x @ wc, 0)
                        outs.append(x.sum(0))
                free[b].record(ks)
            ks.synchronize()
            cs_.synchronize()
            return [cupy.asnumpy(o) for o in outs] if compute else [None] * pieces

        cs += [
            harness.Contender(
                "cupy copy+compute",
                cupy_pipeline,
                check,
                ref=ref,
                baseline=True,
                note="two streams, two buffers, events",
            ),
            harness.Contender(
                "cupy copy only",
                lambda: cupy_pipeline(compute=False),
                lambda out, _: None,
                baseline=True,
            ),
            harness.Contender(
                "cupy compute only",
                lambda: cupy_pipeline(copy=False),
                check,
                ref=ref,
                baseline=True,
            ),
        ]
    return cs, {"pieces": pieces, "rows": rows}


def overlap_ratios(rows: dict) -> dict:
    """Each side's copy+compute time over max(copy only, compute only): 1.0 is the ideal."""
    out = {}
    for side in ("actorflow", "cupy"):
        t = {
            k: rows.get(f"{side} {k}", {}).get("best_s")
            for k in ("copy+compute", "copy only", "compute only")
        }
        if all(t.values()):
            out[side] = t["copy+compute"] / max(t["copy only"], t["compute only"])
    return out


# -- 6. an MLP training step ---------------------------------------------------------------


def mlp_contenders(af, torch, steps: int, batch: int) -> list:
    """MLP 784-256-10, CrossEntropyLoss, SGD (lr 0.01, momentum 0.9), the same initial
    weights and batch everywhere: ``steps`` steps, then the loss read. actorflow eager and
    ``nn.Graph`` (captured as a CUDA graph after its first step); torch eager and torch's
    whole step captured as a CUDA graph."""
    from actorflow import nn, optim

    rng = np.random.default_rng(2)
    xh = rng.standard_normal((batch, 784), dtype=np.float32)
    yh = rng.integers(0, 10, batch)
    init = [
        (rng.standard_normal((256, 784)) / 28).astype(np.float32),
        np.zeros(256, np.float32),
        (rng.standard_normal((10, 256)) / 16).astype(np.float32),
        np.zeros(10, np.float32),
    ]

    def af_model():
        m = nn.Sequential(
            nn.Linear(784, 256, device="cuda:0"), nn.ReLU(), nn.Linear(256, 10, device="cuda:0")
        )
        with af.no_grad():
            for p, v in zip(m.parameters(), init, strict=True):
                p.copy_(af.tensor(v, device="cuda:0"))
        return m

    class Step(nn.Graph):
        def __init__(self, model, opt):
            super().__init__()
            self.model, self.loss = model, nn.CrossEntropyLoss()
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = self.loss(self.model(x), y)
            loss.backward()
            return loss

    x, y = af.tensor(xh, device="cuda:0"), af.tensor(yh, device="cuda:0")

    def af_eager():
        m = af_model()
        opt, lossf = optim.SGD(m.parameters(), lr=0.01, momentum=0.9), nn.CrossEntropyLoss()
        af.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            loss = lossf(m(x), y)
            loss.backward()
            opt.step()
        out = float(loss)
        return time.perf_counter() - t0, out

    def af_graph():
        m = af_model()
        step = Step(m, optim.SGD(m.parameters(), lr=0.01, momentum=0.9))
        float(step(x, y))  # compiles and captures, outside the clock
        af.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps - 1):
            loss = step(x, y)
        out = float(loss)
        return time.perf_counter() - t0, out

    cs = [
        ("actorflow eager", af_eager, steps),
        ("actorflow graph (CUDA graph)", af_graph, steps - 1),
    ]
    if torch is not None:

        def torch_model():
            m = torch.nn.Sequential(
                torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
            ).cuda()
            with torch.no_grad():
                for p, v in zip(m.parameters(), init, strict=True):
                    p.copy_(torch.from_numpy(v))
            return m

        tx, ty = torch.from_numpy(xh).cuda(), torch.from_numpy(yh).cuda()

        def torch_eager():
            m = torch_model()
            opt, lossf = (
                torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                torch.nn.CrossEntropyLoss(),
            )
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps):
                opt.zero_grad()
                loss = lossf(m(tx), ty)
                loss.backward()
                opt.step()
            out = float(loss)
            return time.perf_counter() - t0, out

        def torch_graph():
            m = torch_model()
            opt, lossf = (
                torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9),
                torch.nn.CrossEntropyLoss(),
            )
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up, as torch's docs ask
                for _ in range(1):
                    opt.zero_grad(set_to_none=True)
                    lossf(m(tx), ty).backward()
                    opt.step()
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(g):
                static_loss = lossf(m(tx), ty)
                static_loss.backward()
                opt.step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(steps - 1):
                g.replay()
            out = float(static_loss)
            return time.perf_counter() - t0, out

        cs += [("torch eager", torch_eager, steps), ("torch CUDA graph", torch_graph, steps - 1)]
    return cs


def run_mlp(contenders: list, repeat: int) -> dict:
    """Best and median microseconds a step over ``repeat`` interleaved rounds (each round a
    fresh model; the clock inside each contender covers its steps and the final read)."""
    times = {name: [] for name, _, _ in contenders}
    losses, errors = {}, {}
    for r in range(repeat + 1):  # round 0: the warm-up
        for name, fn, n in contenders[r % len(contenders) :] + contenders[: r % len(contenders)]:
            if name in errors:
                continue
            try:
                t, loss = fn()
            except Exception as e:  # noqa: BLE001 - recorded, reported
                errors[name] = f"{type(e).__name__}: {e}"
                continue
            if not np.isfinite(loss):
                errors[name] = f"the loss is {loss}"
            losses[name] = loss
            if r:
                times[name].append(t / n)
    return {
        name: (
            {
                "best_us_per_step": min(v) * 1e6,
                "median_us_per_step": statistics.median(v) * 1e6,
                "last_loss": losses.get(name),
                "ok": name not in errors,
            }
            if v
            else {"ok": False, "error": errors.get(name, "no run")}
        )
        for name, v in times.items()
    }


# -- the run -------------------------------------------------------------------------------


def main(argv=None) -> int:
    p = harness.ArgumentParser(__doc__, "smaller sizes and fewer rounds (about a minute)")
    p.add_argument(
        "--emu",
        action="store_true",
        help="run actorflow's rows on the CPU emulator (AF_CUDA=emu): the host's "
        "cost, not GPU figures",
    )
    p.add_repeat(7, 3)
    p.add_sized("--steps", 2000, 300, "chain steps (default {full}, quick {quick})")
    p.add_sized(
        "--elements", 1 << 28, 1 << 24, "bandwidth elements (default {full}, quick {quick})"
    )
    p.add_sized("--h2d-mib", 64, 16, "host-to-device MiB (default {full}, quick {quick})")
    p.add_sized("--pieces", 64, 16, "pipeline pieces (default {full}, quick {quick})")
    p.add_sized("--mlp-steps", 50, 10, "MLP steps a round (default {full}, quick {quick})")
    p.add_out("bench_gpu")
    args = p.parse_args(argv)
    if args.emu:
        os.environ["AF_CUDA"] = "emu"
        if args.out == harness.RESULTS / "bench_gpu.json":
            args.out = harness.RESULTS / "bench_gpu_emu.json"
        args.elements = min(args.elements, 1 << 22)  # numpy on the CPU: keep it short
    cupy, torch, why = gpu_libraries(args.emu)
    if cupy is None and not args.emu:
        print(
            f"no GPU: {why}. On a GPU machine run scripts/gpu_check.sh; here, "
            f"--emu measures the host's side on the emulator."
        )
        return 2
    import actorflow as af

    t_start = time.perf_counter()
    gpu = {"driver": "emulator (AF_CUDA=emu)" if args.emu else "cupy"}
    if cupy is not None:
        props = cupy.cuda.runtime.getDeviceProperties(0)
        gpu.update(
            name=props["name"].decode(),
            cupy=cupy.__version__,
            cuda_runtime=cupy.cuda.runtime.runtimeGetVersion(),
        )
    if torch is not None:
        gpu.update(torch=torch.__version__)
    result = harness.document(
        "bench_gpu",
        argv,
        args.quick,
        "every result compared with numpy's (allclose)",
        steps=args.steps,
        elements=args.elements,
        h2d_mib=args.h2d_mib,
        repeat=args.repeat,
        gpu=gpu,
        baselines_skipped=why,
    )
    everyone = []
    rows = {}

    chain = chain_contenders(
        af, cupy, torch, np.linspace(-1, 1, 1000, dtype=np.float32), args.steps
    )
    harness.run_rounds(chain, args.repeat, "chain")
    rows["chain"] = {c.name: c.summary(per=args.steps, unit="step") for c in chain}
    everyone += chain

    bw = bandwidth_contenders(af, cupy, torch, args.elements)
    harness.run_rounds(bw, args.repeat, "bandwidth")
    moved = 2 * args.elements * 4
    rows["bandwidth"] = {}
    for c in bw:
        s = c.summary()
        if c.times:
            s["tb_per_s"] = moved / min(c.times) / 1e12
        rows["bandwidth"][c.name] = s
    everyone += bw

    h2d = h2d_contenders(af, cupy, torch, args.h2d_mib << 20)
    harness.run_rounds(h2d, args.repeat, "h2d")
    rows["h2d"] = {}
    for c in h2d:
        s = c.summary()
        if c.times:
            s["gb_per_s"] = (args.h2d_mib << 20) / min(c.times) / 1e9
        rows["h2d"][c.name] = s
    everyone += h2d

    rows["completion"] = completion_latency(af, cupy, 50 if args.quick else 200)

    pipe, pipe_params = pipeline_contenders(af, cupy, args.pieces, 256 if args.emu else 8192)
    harness.run_rounds(pipe, args.repeat, "pipeline")
    rows["pipeline"] = {c.name: c.summary() for c in pipe}
    rows["pipeline_params"] = pipe_params
    everyone += pipe

    rows["mlp"] = run_mlp(mlp_contenders(af, torch, args.mlp_steps, 128), args.repeat)
    mlp_failed = [k for k, v in rows["mlp"].items() if not v["ok"]]

    print(f"\nGPU: {gpu}" + (f"\nbaselines skipped: {why}" if why else ""))
    print(
        f"\nchain, {args.steps} dependent steps of relu(t + 1) on 1,000 float32 "
        f"(goal <= {CHAIN_GOAL_US} us a step, below torch):"
    )
    harness.print_table(
        rows["chain"],
        [
            harness.Column("best us/step", 14, "best_us_per_step", ".2f"),
            harness.Column("median", 10, "median_us_per_step", ".2f"),
        ],
        26,
    )
    print(
        f"\nbandwidth, relu over {args.elements:,} float32 (goal >= {BANDWIDTH_GOAL} of "
        f"the device copy):"
    )
    harness.print_table(
        rows["bandwidth"],
        [
            harness.Column("TB/s", 10, "tb_per_s", ".3f"),
            harness.Column("best ms", 10, "best_s", ".3f", scale=1e3),
        ],
        26,
    )
    print(f"\nhost to device, {args.h2d_mib} MiB (goal >= {H2D_GOAL_GBS} GB/s):")
    harness.print_table(
        rows["h2d"],
        [
            harness.Column("GB/s", 10, "gb_per_s", ".1f"),
            harness.Column("best ms", 10, "best_s", ".3f", scale=1e3),
        ],
        26,
    )
    print(f"\ncompletion into asyncio (goal <= {COMPLETION_GOAL_US} us median):")
    for k, v in rows["completion"].items():
        print(f"  {k:<30} median {v['median_us']:8.1f} us   best {v['best_us']:8.1f} us")
    print(
        f"\ncopy/compute pipeline, {args.pieces} pieces (goal >= 0.97 of the ideal, "
        f"i.e. a ratio <= 1.03):"
    )
    harness.print_table(
        rows["pipeline"], [harness.Column("best ms", 10, "best_s", ".2f", scale=1e3)], 26
    )
    overlap = overlap_ratios(rows["pipeline"])
    for side, r in overlap.items():
        print(f"  {side}: copy+compute / max(copy only, compute only) = {r:.3f}")
    print(f"\nMLP 784-256-10 training step, batch 128, {args.mlp_steps} steps:")
    for k, v in rows["mlp"].items():
        print(
            f"  {k:<30} "
            + (
                f"best {v['best_us_per_step']:9.1f} us/step   median "
                f"{v['median_us_per_step']:9.1f}   loss {v['last_loss']:.5f}"
                if v["ok"]
                else f"FAIL {v.get('error')}"
            )
        )
    ratios = {f"overlap_{k}": v for k, v in overlap.items()}
    ch = rows["chain"]
    if (
        "torch cuda" in ch
        and ch["torch cuda"].get("best_s")
        and ch["actorflow cuda:0"].get("best_s")
    ):
        ratios["chain_vs_torch"] = ch["actorflow cuda:0"]["best_s"] / ch["torch cuda"]["best_s"]
    b = rows["bandwidth"]
    if (
        "device copy" in b
        and b["device copy"].get("tb_per_s")
        and b["actorflow relu"].get("tb_per_s")
    ):
        ratios["bandwidth_vs_device_copy"] = (
            b["actorflow relu"]["tb_per_s"] / b["device copy"]["tb_per_s"]
        )
    if ratios:
        print("\nratios: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    if args.emu:
        print(
            "\n(emulator: the host's cost of issuing and completing the work; a GPU "
            "figure needs a GPU)"
        )
    m = rows["mlp"]
    for mine, theirs in (
        ("actorflow eager", "torch eager"),
        ("actorflow graph (CUDA graph)", "torch CUDA graph"),
    ):
        if m.get(mine, {}).get("ok") and m.get(theirs, {}).get("ok"):
            ratios[f"mlp {mine} / {theirs}"] = (
                m[mine]["best_us_per_step"] / m[theirs]["best_us_per_step"]
            )
    status = harness.finish(
        args.out,
        result,
        everyone,
        t_start,
        harness.environment(),
        "computed a wrong result",
        {"rows": rows, "ratios": ratios},
    )
    if mlp_failed:
        print(f"ERROR: MLP rows failed: {mlp_failed}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
