"""The CUDA kernels, checked without a GPU: every kernel source the generator
(actorflow/backends/cuda/kernels.py) can produce for the registry's elementwise ops (each
op, each dtype combination the numpy kernel computes, the float4 forms, fused runs of
several shapes) compiles with NVRTC; a kernel that does not compile raises
KernelCompileError with NVRTC's log and the numbered source; generation is deterministic;
no elementwise op of the registry lacks a generator unless it is listed, with the reason, in
NOT_ON_GPU_YET. Nothing here runs a kernel: that needs a GPU (or the emulated driver, which
runs the numpy reference)."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import actorflow  # noqa: F401 - registers the ops
from actorflow.backends.cuda import kernels as K
from actorflow.backends.cuda import nvrtc
from actorflow.device import device as parse_device
from actorflow.dtype import ALL, from_numpy_dtype
from actorflow.errors import DeviceError, DTypeError, KernelCompileError
from actorflow.ops import registry
from actorflow.ops.elementwise import _common_np
from actorflow.tensor.meta import TensorMeta, contiguous_strides

needs_nvrtc = pytest.mark.skipif(
    not nvrtc.available(),
    reason="NVRTC is not installed: pip install -e '.[nvrtc]' (cuda-bindings 12 and "
    "nvidia-cuda-nvrtc-cu12) to compile the CUDA kernels without a GPU",
)

# Elementwise ops of the registry with no CUDA kernel yet, and why. Empty: a new op must get
# a generator in kernels.py or an entry here.
NOT_ON_GPU_YET: dict = {}

DTYPES = [d.name for d in ALL]
PYTYPES = {"bool": True, "int": 2, "float": 1.5}
CPU = parse_device("cpu")


def _meta(dtype: str, shape=(4,)):
    d = next(x for x in ALL if x.name == dtype)
    return TensorMeta(shape, d, CPU, contiguous_strides(shape))


def _sample(dtype: str, shape=(4,)):
    d = next(x for x in ALL if x.name == dtype)
    if dtype == "bool":
        return np.ones(shape, np.bool_)
    return (np.arange(1, 1 + int(np.prod(shape))).reshape(shape) % 3 + 1).astype(d.np)


def _reference(op: str, in_dtypes, attrs, shapes=None):
    """The registry's answer for ``op`` on these dtypes: the output dtype name, or None when
    the registry refuses the dtypes or its numpy kernel cannot compute them."""
    opdef = registry.get(op)
    shapes = shapes or [(4,)] * len(in_dtypes)
    try:
        ((shape, out),) = opdef.infer(
            [_meta(t, s) for t, s in zip(in_dtypes, shapes, strict=True)], attrs
        )
    except DTypeError:
        return None
    o = np.empty(shape, out.np)
    try:
        with np.errstate(all="ignore"):
            opdef.kernel_for("cpu")(
                [o], [_sample(t, s) for t, s in zip(in_dtypes, shapes, strict=True)], attrs
            )
    except (TypeError, ValueError):
        return None  # numpy has no loop for it (e.g. bool // bool)
    return out.name


def _cases():
    """``(label, op, out dtype or None, kwargs for K.elementwise)`` for every op and dtype
    combination worth a kernel; out dtype None: the registry does not compute it."""
    for op in K.UNARY_OPS:
        for t in DTYPES:
            for approx in ("none", "tanh") if op == "gelu" else (None,):
                attrs = {"approximate": approx} if approx else {}
                yield (
                    f"{op}[{t}{'/' + approx if approx else ''}]",
                    op,
                    _reference(op, (t,), attrs),
                    dict(inputs=(t,), attrs=tuple(attrs.items())),
                )
    for op in K.BINARY_OPS:
        for a in DTYPES:
            for b in DTYPES:
                yield (f"{op}[{a},{b}]", op, _reference(op, (a, b), {}), dict(inputs=(a, b)))
            # a 0-d second operand: read once ("scalar" layout); a comparison's common
            # dtype is then the dimensioned operand's unless the 0-d one's category is higher
            b = "float64" if a != "float64" else "int64"
            out = _reference(op, (a, b), {}, [(4,), ()])
            compute = from_numpy_dtype(_common_np(_sample(a), _sample(b, ()))).name
            yield (
                f"{op}[{a},{b} 0-d]",
                op,
                out,
                dict(
                    inputs=(a, b),
                    layouts=("full", "scalar"),
                    compute=compute
                    if op in ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or")
                    else None,
                ),
            )
        for prefix in ("", "r"):
            name = prefix + op + "_scalar"
            for t in DTYPES:
                for py, v in PYTYPES.items():
                    yield (
                        f"{name}[{t},{py}]",
                        name,
                        _reference(name, (t,), {"scalar": v}),
                        dict(inputs=(t,), scalars=(("scalar", py),)),
                    )
    for t in DTYPES:
        for py in ("int", "float"):
            for which in (("min",), ("max",), ("min", "max")):
                attrs = {"min": None, "max": None}
                attrs.update({w: PYTYPES[py] for w in which})
                yield (
                    f"clamp[{t},{py},{'+'.join(which)}]",
                    "clamp",
                    _reference("clamp", (t,), attrs),
                    dict(inputs=(t,), scalars=tuple((w, py) for w in which)),
                )
        for b in DTYPES:
            for bounds in ("min", "max"):
                yield (
                    f"clamp_tensor[{t},{b},{bounds}]",
                    "clamp_tensor",
                    _reference("clamp_tensor", (t, b), {"bounds": bounds}),
                    dict(inputs=(t, b), attrs=(("bounds", bounds),)),
                )
        yield (
            f"clamp_tensor[{t},both]",
            "clamp_tensor",
            _reference("clamp_tensor", (t, t, t), {"bounds": "both"}),
            dict(inputs=(t, t, t), attrs=(("bounds", "both"),)),
        )
        for u in DTYPES:
            yield (
                f"cast[{t}->{u}]",
                "cast",
                _reference("cast", (t,), {"dtype": _dt(u)}),
                dict(inputs=(t,)),
            )
            yield (
                f"where[{t},{u}]",
                "where",
                _reference("where", ("bool", t, u), {}),
                dict(inputs=("bool", t, u)),
            )
        yield (f"copy[{t}]", "copy", _reference("copy", (t,), {}), dict(inputs=(t,)))
        for py in PYTYPES:
            yield (
                f"where[{t},{py}]",
                "where",
                _reference("where", ("bool", t), {"y": PYTYPES[py]}),
                dict(inputs=("bool", t), scalars=(("y", py),)),
            )
            yield (
                f"where[{py},{py}]",
                "where",
                _reference("where", ("bool",), {"x": PYTYPES[py], "y": PYTYPES[py]}),
                dict(inputs=("bool",), scalars=(("x", py), ("y", py))),
            )


def _dt(name):
    return next(x for x in ALL if x.name == name)


CASES = list(_cases())


def _generate():
    """Every single-op kernel the generator makes for the registry's cases, and the float4
    forms."""
    out = []
    for label, op, dtype, kw in CASES:
        if dtype is None:
            continue
        src = K.elementwise(op, dtype, **kw)
        out.append((label, src))
        run = K.FusedRun(
            tuple(K.Value(f"a{j}", t) for j, t in enumerate(kw["inputs"])),
            (K.Step("out", op, tuple(f"a{j}" for j in range(len(kw["inputs"]))), dtype),),
            ("out",),
        )
        if K.vectorizable(run) and not kw.get("layouts"):
            out.append((label + " float4", K.elementwise(op, dtype, vector=4, **kw)))
    return out


def _runs():
    """Fused runs of the shapes the VM makes: chains over contiguous same-shape values,
    with 0-d operands and Python-number attributes, several outputs, mixed dtypes."""
    S, V = K.Step, K.Value
    f = "float32"
    yield (
        "linear+relu",
        K.FusedRun(
            (V("x", f), V("w", f), V("b", f)),
            (S("t", "mul", ("x", "w"), f), S("u", "add", ("t", "b"), f), S("y", "relu", ("u",), f)),
            ("y",),
        ),
    )
    yield (
        "sgd momentum (two outputs)",
        K.FusedRun(
            (V("p", f), V("g", f), V("buf", f)),
            (
                S("m", "mul_scalar", ("buf",), f, (("scalar", "float"),)),
                S("nb", "add", ("m", "g"), f),
                S("st", "mul_scalar", ("nb",), f, (("scalar", "float"),)),
                S("np_", "sub", ("p", "st"), f),
            ),
            ("np_", "nb"),
        ),
    )
    yield (
        "adam",
        K.FusedRun(
            (V("p", f), V("g", f), V("m", f), V("v", f), V("lr", f, "scalar")),
            (
                S("m1", "mul_scalar", ("m",), f, (("scalar", "float"),)),
                S("g1", "mul_scalar", ("g",), f, (("scalar", "float"),)),
                S("m2", "add", ("m1", "g1"), f),
                S("gg", "mul", ("g", "g"), f),
                S("v1", "mul_scalar", ("v",), f, (("scalar", "float"),)),
                S("v2", "add", ("v1", "gg"), f),
                S("sq", "sqrt", ("v2",), f),
                S("de", "add_scalar", ("sq",), f, (("scalar", "float"),)),
                S("q", "div", ("m2", "de"), f),
                S("st", "mul", ("q", "lr"), f),
                S("p2", "sub", ("p", "st"), f),
            ),
            ("p2", "m2", "v2"),
        ),
    )
    yield (
        "relu backward (mixed dtypes)",
        K.FusedRun(
            (V("x", f), V("g", f)),
            (
                S("pos", "gt_scalar", ("x",), "bool", (("scalar", "int"),)),
                S("y", "where", ("pos", "g"), f, (("y", "int"),)),
            ),
            ("y",),
        ),
    )
    yield (
        "int32 -> float16 chain with a 0-d operand",
        K.FusedRun(
            (V("i", "int32"), V("s", "float16", "scalar")),
            (
                S("h", "cast", ("i",), "float16"),
                S("a", "mul", ("h", "s"), "float16"),
                S("b", "gelu", ("a",), "float16", (), (("approximate", "tanh"),)),
                S("c", "clamp", ("b",), "float16", (("min", "float"), ("max", "float"))),
            ),
            ("c",),
        ),
    )
    yield (
        "int64 division and remainder (zero flag)",
        K.FusedRun(
            (V("a", "int64"), V("b", "int64")),
            (
                S("q", "floor_divide", ("a", "b"), "int64"),
                S("r", "remainder", ("a", "b"), "int64"),
                S("t", "rtrunc_divide_scalar", ("b",), "int64", (("scalar", "int"),)),
                S("z", "add", ("q", "r"), "int64"),
                S("w", "pow", ("z", "t"), "int64"),
                S("e", "eq", ("w", "a"), "bool"),
                S("n", "logical_not", ("e",), "bool"),
            ),
            ("w", "n"),
        ),
    )
    yield (
        "float64 chain",
        K.FusedRun(
            (V("x", "float64"), V("y", "float32")),
            (
                S("a", "exp", ("x",), "float64"),
                S("b", "maximum", ("a", "y"), "float64"),
                S("c", "tanh", ("b",), "float64"),
                S("d", "sigmoid", ("c",), "float64"),
                S("e", "remainder_scalar", ("d",), "float64", (("scalar", "float"),)),
            ),
            ("e",),
        ),
    )
    yield (
        "bool masks",
        K.FusedRun(
            (V("m", "bool"), V("k", "bool"), V("x", "int32")),
            (
                S("a", "logical_and", ("m", "k"), "bool"),
                S("b", "bitwise_xor", ("a", "m"), "bool"),
                S("c", "bitwise_not", ("x",), "int32"),
                S("d", "where", ("b", "c", "x"), "int32"),
                S("e", "abs", ("d",), "int32"),
                S("f", "neg", ("e",), "int32"),
            ),
            ("f",),
        ),
    )


RUNS = list(_runs())


def _run_sources():
    out = []
    for label, run in RUNS:
        out.append((label, K.fused(run)))
        if K.vectorizable(run):
            out.append((label + " float4", K.fused(run, vector=4)))
    return out


# -- generation (no NVRTC needed) -------------------------------------------------------------


def _library_ops() -> dict:
    """The registry's ops that the library defines (a test may register ops of its own)."""
    return {
        n: op
        for n, op in registry.all_ops().items()
        if all(k.__module__.startswith("actorflow.") for k in op.kernels.values())
    }


def test_every_elementwise_op_has_a_generator():
    elementwise = {n for n, op in _library_ops().items() if op.elementwise} | {"where"}
    missing = elementwise - set(K.OPS) - set(NOT_ON_GPU_YET)
    assert not missing, (
        f"elementwise ops with no CUDA kernel generator: {sorted(missing)}; "
        f"add them to actorflow/backends/cuda/kernels.py or to "
        f"NOT_ON_GPU_YET here with the reason"
    )
    assert not set(K.OPS) - set(registry.all_ops()), "the generator names ops the registry lacks"


def test_the_generator_covers_what_the_numpy_kernels_compute():
    """Where the registry computes an op in some dtypes, a kernel is generated; where it
    refuses an op in a dtype (or numpy has no loop for it), the generator refuses with
    DTypeError."""
    assert len(CASES) > 1500
    wrong = []
    for label, op, dtype, kw in CASES:
        if dtype is not None:
            src = K.elementwise(op, dtype, **kw)
            assert src.dtypes[0] == dtype and src.name.startswith("af_"), label
        elif op not in ("cast", "where") and not kw.get("scalars") and len(set(kw["inputs"])) == 1:
            # refused in the inputs' own dtype: the generator refuses it too (a refusal
            # because of the operands' mix, e.g. bool - int, is the inference's, which runs
            # before any kernel is asked for)
            o = kw["inputs"][0]
            try:
                K.elementwise(op, o, **kw)
            except DTypeError:
                continue
            wrong.append(f"{label} (as {o})")
    assert not wrong, f"kernels generated where the registry refuses: {wrong}"


def test_launch_parameters_are_listed_in_order():
    src = K.elementwise("floor_divide_scalar", "int32", ("int32",), scalars=(("scalar", "int"),))
    assert [(p, kind) for p, kind, _ in src.params] == [
        ("out0", "out"),
        ("in_a0", "in"),
        ("s0_scalar", "scalar"),
        ("n", "n"),
        ("zero", "zero"),
    ]
    assert f'extern "C" __global__ void {src.name}(int* out0, ' in src.source
    v = K.elementwise("add", "float32", ("float32", "float32"), vector=4)
    assert v.vector == 4 and "float4" in v.source and "& 15) == 0" in v.source
    assert "float4" not in K.elementwise("add", "float32", ("float32", "float32")).source
    with pytest.raises(ValueError, match="float32"):
        K.elementwise("add", "float64", ("float64", "float64"), vector=4)


def test_a_run_that_reads_a_value_before_it_is_written_is_refused():
    run = K.FusedRun(
        (K.Value("x", "float32"),), (K.Step("y", "add", ("x", "z"), "float32"),), ("y",)
    )
    with pytest.raises(ValueError, match="'z' is not defined"):
        K.fused(run)
    twice = K.FusedRun((K.Value("x", "float32"),), (K.Step("x", "neg", ("x",), "float32"),), ("x",))
    with pytest.raises(ValueError, match="'x' is defined twice"):
        K.fused(twice)
    with pytest.raises(ValueError, match="not an identifier"):
        K.fused(
            K.FusedRun((K.Value("x-1", "float32"),), (K.Step("y", "neg", ("x-1",), "float32"),))
        )
    with pytest.raises(DeviceError, match="no CUDA kernel for op 'matmul'"):
        K.elementwise("matmul", "float32", ("float32", "float32"))


def test_generation_is_deterministic():
    """The same op gives the same text, in this process and in another one with another
    hash seed (the text is a cache key)."""
    a = [s.key for _, s in _generate()[:200]] + [s.key for _, s in _run_sources()]
    b = [s.key for _, s in _generate()[:200]] + [s.key for _, s in _run_sources()]
    assert a == b
    code = (
        "import sys; sys.path.insert(0, 'tests'); import test_cuda_kernels as t; "
        "print(','.join(s.key for _, s in t._run_sources()))"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONHASHSEED="12345", PYTHONPATH=root)
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    assert out.split(",") == [s.key for _, s in _run_sources()]


# -- NVRTC -------------------------------------------------------------------------------------


def _compile_all(named):
    """Compiles ``(label, KernelSource)`` pairs in one NVRTC program per 400 kernels; a
    failure names the case and shows NVRTC's log and the source."""
    named = list(named)
    for i in range(0, len(named), 400):
        chunk = named[i : i + 400]
        try:
            nvrtc.compile_together([s for _, s in chunk])
        except KernelCompileError as e:
            failing = [lbl for lbl, s in chunk if s.name in str(e)]
            pytest.fail(f"kernel of {failing or 'a batch'} does not compile:\n{e}")


@needs_nvrtc
def test_every_single_op_kernel_compiles():
    t0 = time.perf_counter()
    named = _generate()
    assert len(named) > 1500
    _compile_all(named)
    print(f"{len(named)} kernels compiled in {time.perf_counter() - t0:.1f} s")


@needs_nvrtc
def test_every_fused_run_shape_compiles():
    for label, src in _run_sources():
        try:
            ptx = nvrtc.compile_ptx(src)
        except KernelCompileError as e:
            pytest.fail(f"fused run {label!r} does not compile:\n{e}")
        assert f".entry {src.name}(" in ptx.decode(), label


@needs_nvrtc
def test_a_kernel_that_does_not_compile_names_its_line():
    good = K.elementwise("add", "float32", ("float32", "float32"))
    broken = K.KernelSource(
        "af_broken",
        good.source.replace("(float)(v_a0 + v_a1)", "(float)(v_a0 + undefined_x)"),
        good.dtypes,
        good.params,
    )
    line = next(i for i, ln in enumerate(broken.source.splitlines(), 1) if "undefined_x" in ln)
    with pytest.raises(KernelCompileError) as info:
        nvrtc.compile_ptx(broken)
    msg = str(info.value)
    assert "af_broken" in msg and "undefined_x" in msg and "is undefined" in msg
    assert f"af_broken.cu({line}): error" in msg  # NVRTC's log, with the line
    assert f"{line:4d}| " in msg  # the numbered source
    with pytest.raises(KernelCompileError, match="af_broken"):
        nvrtc.compile_together([good, broken])


@needs_nvrtc
def test_ptx_is_cached_by_source():
    src = K.elementwise("sub", "float64", ("float64", "float64"))
    a = nvrtc.compile_ptx(src)
    assert nvrtc.compile_ptx(src) is a and b".target sm_90" in a
    assert b".target sm_80" in nvrtc.compile_ptx(src, arch="compute_80")


# -- semantics on the host -----------------------------------------------------------------
# The same sources, compiled by the host's C++ compiler (the CUDA built-ins stubbed: one
# thread, one block), run on numpy arrays and compared with the registry's numpy kernel. This
# checks what each kernel computes (casts, rounding of float16, integer division, NaN in
# maximum, ...) without a GPU; a GPU still has to confirm NVRTC's math functions.

HOST_SHIM = r"""#include <math.h>
#define __device__
#define __global__
#define __forceinline__ inline
struct af_dim3 { unsigned int x; };
static const af_dim3 gridDim = {1}, blockDim = {1}, blockIdx = {0}, threadIdx = {0};
struct alignas(16) float4 { float x, y, z, w; };
"""
_CXX: list = []


def _cxx() -> str:
    """A host C++ compiler with ``_Float16`` (g++ 12, clang 15 on x86-64), or a skip."""
    if not _CXX:
        import shutil
        import tempfile

        found = None
        for c in ("g++", "clang++"):
            if shutil.which(c):
                with tempfile.TemporaryDirectory() as d:
                    r = subprocess.run(
                        [c, "-x", "c++", "-c", "-", "-o", f"{d}/t.o"],
                        input="_Float16 h(float f) { return (_Float16)f; }",
                        capture_output=True,
                        text=True,
                        timeout=60,
                    )
                if r.returncode == 0:
                    found = c
                    break
        _CXX.append(found)
    if _CXX[0] is None:
        pytest.skip(
            "no host C++ compiler with _Float16 (g++ >= 12 or clang++ >= 15) to run "
            "the kernels' sources on the host"
        )
    return _CXX[0]


def _host_library(sources, tmp_path):
    import ctypes

    cxx = _cxx()
    parts, seen = [HOST_SHIM, K.PRELUDE], set()
    for s in sources:
        if s.key not in seen:
            seen.add(s.key)
            parts.append(s.source[len(K.PRELUDE) :])
    cc = tmp_path / "kernels.cc"
    cc.write_text("".join(parts))
    lib = tmp_path / "kernels.so"
    # -O0: the values are IEEE's either way, and the one large file builds in half the time
    r = subprocess.run(
        [cxx, "-std=c++17", "-O0", "-shared", "-fPIC", "-w", str(cc), "-o", str(lib)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return ctypes.CDLL(str(lib))


N = 37  # not a multiple of 4: the float4 forms run their tail too


def _values(dtype: str, rng, role: str = "", shape=(N,)):
    d = _dt(dtype).np
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int32", "int64"):
        v = rng.integers(-9, 10, shape)
        if role == "divisor":
            v[v == 0] = 3
        if role == "exponent":
            v = np.abs(v) % 6
        return v.astype(d)
    v = (rng.standard_normal(shape) * 3).astype(d)
    if v.ndim and role != "exponent":
        v[:6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 2.0]
    return v


_CTYPE = {
    "bool": "c_bool",
    "int32": "c_int32",
    "int64": "c_int64",
    "float32": "c_float",
    "float64": "c_double",
    "float16": "c_uint16",
}


def _launch(lib, src, outs, ins, scalars):
    import ctypes

    args = [ctypes.c_void_p(a.ctypes.data) for a in outs + ins]
    scalar_params = [p for p in src.params if p[1] == "scalar"]
    for (_, _, t), v in zip(scalar_params, scalars, strict=True):
        if t == "float16":
            v = int(np.array(v, np.float16).view(np.uint16))
        else:
            v = np.array(v).astype(_dt(t).np).item()
        args.append(getattr(ctypes, _CTYPE[t])(v))
    args.append(ctypes.c_longlong(outs[0].size))
    zero = np.zeros(1, np.int32)
    if any(p[1] == "zero" for p in src.params):
        args.append(ctypes.c_void_p(zero.ctypes.data))
    getattr(lib, src.name)(*args)
    return int(zero[0])


def _roles(op):
    base = op[:-7] if op.endswith("_scalar") else op
    rev = base.startswith("r") and base[1:] in K.BINARY_OPS and base not in K.BINARY_OPS
    base = base[1:] if rev else base
    if base in ("floor_divide", "remainder", "trunc_divide"):
        return ("divisor",) if rev else ("", "divisor")
    if base == "pow":
        return ("exponent",) if rev else ("", "exponent")
    return ()


# ops whose float results come from libm (numpy) or CUDA's math library: a few ulp apart;
# every other result must be equal bit for bit (NaN where NaN)
_LIBM = ("exp", "log", "tanh", "sin", "cos", "erf", "sigmoid", "silu", "gelu", "pow")


def _assert_same(got, want, label):
    if want.dtype.kind == "f" and not any(f in label for f in _LIBM):
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        assert same.all(), (
            f"{label}: at {np.flatnonzero(~same)[:5]}: kernel "
            f"{got[~same][:5]}, numpy {want[~same][:5]}"
        )
    elif want.dtype.kind == "f":
        tol = {2: 2e-3, 4: 2e-6, 8: 1e-13}[want.dtype.itemsize]
        np.testing.assert_allclose(
            got.astype(np.float64),
            want.astype(np.float64),
            rtol=tol,
            atol=tol,
            equal_nan=True,
            err_msg=label,
        )
    else:
        np.testing.assert_array_equal(got, want, err_msg=label)


def _attrs_of(op, kw):
    attrs = dict(kw.get("attrs", ()))
    vals = {py: v for py, v in PYTYPES.items()}
    for a, py in kw.get("scalars", ()):
        attrs[a] = vals[py]
    if op == "clamp":
        attrs.setdefault("min", None)
        attrs.setdefault("max", None)
    return attrs


def test_kernels_compute_what_the_numpy_kernels_compute(tmp_path):
    """Every single-op kernel (and its float4 form) on the host against the registry's numpy
    kernel, on values with NaN, infinities, signed zeros and negative integers."""
    rng = np.random.default_rng(0)
    todo = []
    for label, op, dtype, kw in CASES:
        if (
            dtype is None
            or op == "cast"
            and kw["inputs"][0] in ("float16", "float32", "float64")
            and dtype in ("int32", "int64", "bool")
        ):
            continue  # NaN/inf/out-of-range float -> int: undefined (numpy warns)
        todo.append((label, op, dtype, kw))
    forms = []
    for _label, op, dtype, kw in todo:
        f = [K.elementwise(op, dtype, **kw)]
        if f[0].dtypes == ("float32",) * len(f[0].dtypes) and not kw.get("layouts"):
            f.append(K.elementwise(op, dtype, vector=4, **kw))
        forms.append(f)
    t0 = time.perf_counter()
    lib = _host_library([s for f in forms for s in f], tmp_path)
    print(f"host build of {sum(map(len, forms))} kernels: {time.perf_counter() - t0:.1f} s")
    checked = 0
    for (label, op, dtype, kw), f in zip(todo, forms, strict=True):
        roles = _roles(op)
        layouts = kw.get("layouts") or ("full",) * len(kw["inputs"])
        ins = [
            _values(t, rng, roles[j] if j < len(roles) else "", (N,) if lay == "full" else ())
            for j, (t, lay) in enumerate(zip(kw["inputs"], layouts, strict=True))
        ]
        attrs = _attrs_of(op, kw)
        if op == "cast":
            attrs["dtype"] = _dt(dtype)
        want = np.empty(N, _dt(dtype).np)
        try:
            with np.errstate(all="ignore"):
                registry.get(op).kernel_for("cpu")([want], ins, attrs)
        except (ValueError, ZeroDivisionError):
            continue  # numpy refuses these values (e.g. 2 ** -1 on integers)
        scal = [attrs[a] for a, _ in kw.get("scalars", ())]
        for src in f:
            got = np.full(N, 7, _dt(dtype).np)
            zero = _launch(lib, src, [got], [np.ascontiguousarray(a) for a in ins], scal)
            assert zero == 0, label
            _assert_same(got, want, f"{label} vector={src.vector}")
            checked += 1
    assert checked > 1500


def test_fused_runs_compute_what_their_ops_compute_one_by_one(tmp_path):
    """Each fused run on the host against its steps run one by one by the numpy kernels
    (intermediates rounded to their dtypes, as in the VM's runs)."""
    srcs = _run_sources()
    lib = _host_library([s for _, s in srcs], tmp_path)
    rng = np.random.default_rng(1)
    for label, src in srcs:
        run = dict(RUNS)[label.removesuffix(" float4")]
        env = {
            v.name: _values(
                v.dtype,
                rng,
                "divisor" if v.dtype.startswith("int") else "",
                (N,) if v.layout == "full" else (),
            )
            for v in run.inputs
        }
        if label.startswith("int64"):
            env["b"] = np.abs(env["b"]) % 4 + 1  # a small positive exponent for pow
        scal = []
        for s in run.steps:
            attrs = dict(s.attrs)
            for a, py in s.scalars:
                attrs[a] = {"bool": True, "int": 2, "float": 0.75}[py]
                scal.append(attrs[a])
            if s.op == "clamp":
                attrs.setdefault("min", None)
                attrs.setdefault("max", None)
            if s.op == "cast":
                attrs["dtype"] = _dt(s.dtype)
            o = np.empty(N, _dt(s.dtype).np)
            with np.errstate(all="ignore"):
                registry.get(s.op).kernel_for("cpu")([o], [env[a] for a in s.args], attrs)
            env[s.out] = o
        outs = [np.full(N, 7, env[o].dtype) for o in run.outputs]
        ins = [np.ascontiguousarray(env[v.name]) for v in run.inputs]
        assert _launch(lib, src, outs, ins, scal) == 0, label
        for o, got in zip(run.outputs, outs, strict=True):
            _assert_same(got, env[o], f"{label}: {o} ({' '.join(s.op for s in run.steps)})")


def test_integer_division_by_zero_sets_the_flag(tmp_path):
    srcs = [
        K.elementwise(op, t, (t, t))
        for op in ("floor_divide", "remainder", "trunc_divide")
        for t in ("int32", "int64")
    ]
    lib = _host_library(srcs, tmp_path)
    for src in srcs:
        t = _dt(src.dtypes[0]).np
        a, b = np.arange(N).astype(t), np.ones(N, t)
        out = np.empty(N, t)
        assert _launch(lib, src, [out], [a, b], []) == 0
        b[5] = 0
        assert _launch(lib, src, [out], [a, b], []) == 1, src.name
        assert out[5] == 0


def test_without_nvrtc_compiling_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cuda", None)
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)
    src = K.elementwise("mul", "int32", ("int32", "int64"))
    monkeypatch.setattr(nvrtc, "_CACHE", {})
    with pytest.raises(DeviceError, match=r"pip install 'actorflow\[nvrtc\]'"):
        nvrtc.compile_ptx(src)
    assert not nvrtc.available()
