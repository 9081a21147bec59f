"""CUDA C sources of the elementwise ops and of the VM's fused runs of them, for the CUDA
driver to compile (NVRTC, ``nvrtc.py``) and launch.

What a kernel covers. Every kernel computes ``n`` elements of contiguous outputs, element
``i`` from element ``i`` of each input. An input is ``"full"`` (contiguous, ``n``
elements, read at ``i``) or ``"scalar"`` (one element in device memory, read once: a 0-d
tensor or any tensor of one element broadcast). Python numbers given as attributes
(``add_scalar``'s ``scalar``, clamp's bounds, where's ``x``/``y``) are parameters passed
by value. Any other broadcast (a bias row, a column) is not a kernel's here: the caller
makes it full first (an expand copy) or, as ``vm/opcall.DeviceKernel`` does today, runs the
op's numpy kernel instead (``vm/run_cuts.py`` admits inputs of any broadcast shape).

The IR. ``FusedRun(inputs, steps, outputs)``: ``inputs`` are named ``Value``s (dtype and
layout), each ``Step`` is ``(out, op, args, dtype, ...)`` over names defined before it, with
the op's registry name and the output dtype the registry's inference gave; ``outputs``
names the values written back. Intermediates stay in registers, each rounded to its own
dtype after its step (a float16 intermediate is rounded to half, as the numpy kernels that
run a run step by step round it). One op is a run of one step (``elementwise``).

Semantics: each kernel computes what the op's numpy kernel in ``actorflow/ops/`` computes
(the reference; the emulated driver runs those): the same casts (arithmetic in the output
dtype, comparisons in the operands' common dtype, numpy's weak Python scalars), integer
arithmetic wrapping, NaN propagated by maximum/minimum/clamp, Python's floor division and
remainder (numpy's divmod, float and integer), gelu's erf as the numpy kernel's
Abramowitz-Stegun polynomial for float16/float32. float16 is stored as 16 bits and computed
in float (the numpy half loops do the same). Known differences, not reachable bit for bit:
libm vs CUDA transcendental functions (exp, log, tanh, pow: a few ulp), a float NaN or
out-of-range value cast to an integer (undefined in both; numpy warns). Where numpy raises
from inside its loop the kernel cannot: an integer division by a zero divisor writes 0 and
sets the ``zero`` flag (a launch parameter, an int in device memory) for the driver to raise
DivisionByZeroError after the launch; an integer power with a negative exponent gives
PyTorch's value (0, or +-1 for a base of +-1), as the cpu kernel does (numpy refuses it).

Launch. A grid-stride loop: any grid works (256 threads a block is the suggested size). The
parameters are listed in ``KernelSource.params``, in order. An output may be an input's
memory (an in-place op: each element is read before it is written, by the same thread), so
no pointer is declared ``__restrict__``; partly overlapping operands are not elementwise.
A run whose values are all float32 also has a ``vector=4`` form: a main loop reading and
writing float4 (when every full operand is 16-byte aligned, checked in the kernel, else
everything goes by the scalar loop) and a scalar tail.

Tested without a GPU (tests/test_cuda_kernels.py): every source compiles with NVRTC, and the
same sources built by the host's C++ compiler (CUDA built-ins stubbed) compute what the
numpy kernels compute. No GPU has run them yet.

The text is deterministic: one run gives one source (``KernelSource.key`` is its hash, for
a cache of compiled kernels)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ...dtype import as_dtype, bool_, float64, int64, promote_types
from ...errors import DeviceError, DTypeError

# -- what a kernel is -----------------------------------------------------------------

CTYPE = {
    "bool": "bool",
    "int32": "int",
    "int64": "long long",
    "float16": "af_half",
    "float32": "float",
    "float64": "double",
}
MATH = {"float16": "float", "float32": "float", "float64": "double"}  # float math type
DTYPES = tuple(CTYPE)


@dataclass(frozen=True)
class KernelSource:
    """A kernel to compile: ``name`` (its ``extern "C"`` entry point), ``source`` (the CUDA
    C text, standalone), ``dtypes`` (the dtype of each output, then of each input),
    ``params`` (the launch parameters in order, ``(name, kind, dtype)``; kind ``"out"`` and
    ``"in"`` are device pointers, ``"scalar"`` a value of that dtype (float16: its 16 bits
    as a uint16), ``"n"`` the element count as int64, ``"zero"`` a pointer to an int32 the
    kernel sets to 1 on an integer division by zero) and ``vector`` (elements per thread in
    the main loop: 4 for the float4 form, else 1)."""

    name: str
    source: str
    dtypes: tuple
    params: tuple
    vector: int = 1

    @property
    def entry(self) -> str:
        return self.name

    @property
    def key(self) -> str:
        """The SHA-256 of the source: the key of a cache of compiled kernels."""
        return hashlib.sha256(self.source.encode()).hexdigest()


@dataclass(frozen=True)
class Value:
    """An input of a run: ``name``, ``dtype`` (a dtype name) and ``layout`` (``"full"`` or
    ``"scalar"``)."""

    name: str
    dtype: str
    layout: str = "full"


@dataclass(frozen=True)
class Step:
    """One op of a run: ``out = op(*args)`` in ``dtype`` (the output dtype the registry's
    inference gives). ``scalars``: ``(attr, python type name)`` of each Python-number
    attribute, passed at launch ("bool", "int" or "float": numpy's weak scalars compute by
    it); ``attrs``: the attributes fixed in the source (gelu's ``approximate``,
    clamp_tensor's ``bounds``); ``compute``: a comparison's operand dtype when a 0-d
    operand ranks below a dimensioned one (the caller's ``_common_np``), else None."""

    out: str
    op: str
    args: tuple
    dtype: str
    scalars: tuple = ()
    attrs: tuple = ()
    compute: str | None = None


@dataclass(frozen=True)
class FusedRun:
    """A chain of elementwise ops over named values (see the module docstring)."""

    inputs: tuple
    steps: tuple
    outputs: tuple = field(default=())


# -- the ops covered -----------------------------------------------------------------------
# Binary ops cast their operands to the output dtype (arithmetic, bitwise, integer division:
# floor, remainder, trunc, with the zero flag for integers), or to their common dtype for a
# bool result (comparisons, logical and/or on truth values), as the numpy kernels do.

UNARY_OPS = (
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "tanh",
    "sin",
    "cos",
    "rsqrt",
    "erf",
    "relu",
    "sigmoid",
    "silu",
    "gelu",
    "logical_not",
    "bitwise_not",
)
BINARY_OPS = (
    "add",
    "sub",
    "mul",
    "div",
    "pow",
    "maximum",
    "minimum",
    "eq",
    "ne",
    "lt",
    "le",
    "gt",
    "ge",
    "logical_and",
    "logical_or",
    "floor_divide",
    "remainder",
    "trunc_divide",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
)
_CMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LOGIC = {"logical_and": "&&", "logical_or": "||"}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}
_INTDIV = ("floor_divide", "remainder", "trunc_divide")
COMPARE_OPS = tuple(_CMP) + tuple(_LOGIC)  # binary ops computing in the operands' common dtype
OTHER_OPS = ("clamp", "clamp_tensor", "where", "cast", "copy")
SCALAR_OPS = tuple(p + b + "_scalar" for b in BINARY_OPS for p in ("", "r"))
OPS = UNARY_OPS + BINARY_OPS + SCALAR_OPS + OTHER_OPS


def _unsupported(op, dtype, why="") -> DTypeError:
    return DTypeError(
        f"CUDA kernel for '{op}' in {dtype}: not supported{why}; the numpy "
        f"kernel does not compute it either (see actorflow/ops/)"
    )


class _Emitter:
    """Builds one kernel's element function: a C statement per step, values in registers."""

    def __init__(self, run: FusedRun):
        self.run = run
        self.types: dict = {}  # value name -> dtype name
        self.lines: list = []
        self.params: list = []  # scalar params: (name, dtype)
        self.zero = False  # an integer division: the zero flag is needed
        self.tmp = 0

    def var(self, name: str) -> str:
        return "v_" + name

    def fresh(self) -> str:
        self.tmp += 1
        return f"t{self.tmp}"

    def cast(self, expr: str, src: str, dst: str) -> str:
        return expr if src == dst else f"af_cast<{CTYPE[dst]}>({expr})"

    def math(self, expr: str, dtype: str) -> str:
        """``expr`` (a value of ``dtype``) as its math type (float16 -> float)."""
        return f"af_h2f({expr})" if dtype == "float16" else expr

    def store(self, expr: str, dtype: str) -> str:
        """A math-type expression as a value of ``dtype`` (float16 rounded to half)."""
        return f"af_f2h({expr})" if dtype == "float16" else f"({CTYPE[dtype]})({expr})"

    def scalar(self, k: int, attr: str, dtype: str) -> str:
        name = f"s{k}_{attr}"
        self.params.append((name, dtype))
        return name

    def emit(self) -> None:
        for v in self.run.inputs:
            if v.dtype not in CTYPE or v.layout not in ("full", "scalar"):
                raise DTypeError(
                    f"CUDA kernel input {v.name!r}: dtype {v.dtype!r} / layout "
                    f"{v.layout!r}; dtypes {', '.join(DTYPES)}, layouts full or "
                    f"scalar"
                )
            self._define(v.name, v.dtype, "input")
        for k, s in enumerate(self.run.steps):
            if s.op not in OPS:
                raise DeviceError(
                    f"no CUDA kernel for op '{s.op}': the generator covers "
                    f"the elementwise ops {', '.join(OPS)}; run the op on "
                    f"'cpu'"
                )
            for a in s.args:
                if a not in self.types:
                    raise ValueError(f"run step {k} ({s.op}): value {a!r} is not defined before it")
            if s.dtype not in CTYPE:
                raise DTypeError(
                    f"run step {k} ({s.op}): dtype {s.dtype!r}; the kernels "
                    f"cover {', '.join(DTYPES)}"
                )
            expr = self.step(k, s)
            self._define(s.out, s.dtype, f"step {k} ({s.op})")
            self.lines.append(f"{CTYPE[s.dtype]} {self.var(s.out)} = {expr};")

    def _define(self, name: str, dtype: str, what: str) -> None:
        if not (name.isidentifier() and name.isascii()):
            raise ValueError(
                f"run {what}: value name {name!r} is not an identifier; name "
                f"values with letters, digits and _"
            )
        if name in self.types:
            raise ValueError(
                f"run {what}: value {name!r} is defined twice; each step writes a new value"
            )
        self.types[name] = dtype

    # -- one step -------------------------------------------------------------------------
    def step(self, k: int, s: Step) -> str:
        op, o = s.op, s.dtype
        args = [(self.var(a), self.types[a]) for a in s.args]
        scal = dict(s.scalars)
        if op in UNARY_OPS:
            return self.unary(op, self.cast(args[0][0], args[0][1], o), o, dict(s.attrs))
        if op in ("cast", "copy"):
            return self.cast(args[0][0], args[0][1], o)
        if op.endswith("_scalar"):
            rev = op.startswith("r") and op[1:-7] in BINARY_OPS and op[:-7] not in BINARY_OPS
            base = op[1:-7] if rev else op[:-7]
            ((x, xt),) = args
            pt = scal["scalar"]
            if base in _CMP or base in _LOGIC:
                ct = _weak(xt, pt)
                sv = self.scalar(k, "scalar", ct)
                xa = self.cast(x, xt, ct)
                a, b = (sv, xa) if rev else (xa, sv)
                return self.binary(base, a, b, ct, o)
            sv = self.scalar(k, "scalar", o)
            xa = self.cast(x, xt, o)
            a, b = (sv, xa) if rev else (xa, sv)
            return self.binary(base, a, b, o, o)
        if op in BINARY_OPS:
            (a, at), (b, bt) = args
            if op in _CMP or op in _LOGIC:
                ct = s.compute or promote_types(as_dtype(at), as_dtype(bt)).name
                return self.binary(op, self.cast(a, at, ct), self.cast(b, bt, ct), ct, o)
            return self.binary(op, self.cast(a, at, o), self.cast(b, bt, o), o, o)
        if op == "clamp":
            x = self.cast(args[0][0], args[0][1], o)
            lo = self.scalar(k, "min", o) if "min" in scal else None
            hi = self.scalar(k, "max", o) if "max" in scal else None
            return self.clamp(x, lo, hi, o)
        if op == "clamp_tensor":
            bounds = dict(s.attrs)["bounds"]
            x = self.cast(args[0][0], args[0][1], o)
            rest = [self.cast(v, t, o) for v, t in args[1:]]
            lo = rest[0] if bounds in ("min", "both") else None
            hi = rest[-1] if bounds in ("max", "both") else None
            return self.clamp(x, lo, hi, o)
        if op == "where":
            it = iter(args[1:])
            c = args[0][0]
            if args[0][1] != "bool":
                raise DTypeError(f"where: the condition must be bool, got {args[0][1]}")
            xs = self.scalar(k, "x", o) if "x" in scal else self.cast(*next(it), o)
            ys = self.scalar(k, "y", o) if "y" in scal else self.cast(*next(it), o)
            return f"({c} ? {xs} : {ys})"
        raise AssertionError(op)

    def clamp(self, x, lo, hi, o) -> str:
        t = self.fresh()
        self.lines.append(f"{CTYPE[o]} {t} = {x};")
        if lo is not None:
            self.lines.append(f"{t} = {self.binary('maximum', t, lo, o, o)};")
        if hi is not None:
            self.lines.append(f"{t} = {self.binary('minimum', t, hi, o, o)};")
        return t

    def unary(self, op: str, x: str, o: str, attrs: dict) -> str:
        fl = o in MATH
        if (
            op
            in (
                "exp",
                "log",
                "sqrt",
                "tanh",
                "sin",
                "cos",
                "rsqrt",
                "erf",
                "sigmoid",
                "silu",
                "gelu",
            )
            and not fl
        ):
            raise _unsupported(op, o)
        if op == "neg":
            if o == "bool":
                raise _unsupported(op, o)
            return self.store(f"-{self.math(x, o)}", o) if fl else f"af_neg({x})"
        if op == "abs":
            if o == "bool":
                return x
            return self.store(f"af_abs({self.math(x, o)})", o) if fl else f"af_abs({x})"
        if op in ("exp", "log", "sqrt", "tanh", "sin", "cos"):
            return self.store(f"af_{op}({self.math(x, o)})", o)
        if op == "rsqrt":
            # the numpy kernel: o = sqrt(x); o = 1 / o, each rounded to o
            m = MATH[o]
            t = self.fresh()
            self.lines.append(f"{CTYPE[o]} {t} = {self.store(f'af_sqrt({self.math(x, o)})', o)};")
            return self.store(f"({m})1 / {self.math(t, o)}", o)
        if op == "erf":
            # the numpy kernel: exact in float64, else Abramowitz-Stegun in float32
            if o == "float64":
                return f"erf({x})"
            return self.store(f"af_erf_as({self.math(x, o)})", o)
        if op == "relu":
            if o == "bool":
                raise _unsupported(op, o)
            zero = self.store(f"({MATH[o]})0", o) if fl else f"({CTYPE[o]})0"
            return self.binary("maximum", x, zero, o, o)
        if op == "sigmoid":
            # the numpy kernel: o = -x; o = exp(o); o += 1; o = 1 / o, each rounded to o
            t = self.one_plus_exp_neg(x, o)
            return self.store(f"({MATH[o]})1 / {t}", o)
        if op == "silu":
            # the numpy kernel: t = -x; t = exp(t); t += 1; o = x / t, each rounded to o
            t = self.one_plus_exp_neg(x, o)
            return self.store(f"{self.math(x, o)} / {t}", o)
        if op == "gelu":
            tanh = attrs.get("approximate", "none") == "tanh"
            fn = {"float16": "af_gelu_h", "float32": "af_gelu_f", "float64": "af_gelu_d"}[o]
            return f"{fn}{'_tanh' if tanh else ''}({x})"
        if op == "logical_not":
            return f"!af_truth({x})"
        if op == "bitwise_not":
            if fl:
                raise _unsupported(op, o)
            return f"!{x}" if o == "bool" else f"~{x}"
        raise AssertionError(op)

    def one_plus_exp_neg(self, x: str, o: str) -> str:
        """A temporary holding 1 + exp(-x) in ``o``'s math type, each step rounded to
        ``o`` (sigmoid's and silu's common part, as their numpy kernels compute it)."""
        m = MATH[o]
        t = self.fresh()
        r = (lambda e: f"af_round_h({e})") if o == "float16" else (lambda e: e)
        self.lines.append(f"{m} {t} = {r('-' + self.math(x, o))};")
        self.lines.append(f"{t} = {r(f'af_exp({t})')};")
        self.lines.append(f"{t} = {r(f'{t} + ({m})1')};")
        return t

    def binary(self, op: str, a: str, b: str, ct: str, o: str) -> str:
        """``a op b`` with both operands of dtype ``ct``, the result of dtype ``o``."""
        fl = ct in MATH
        if op in _CMP:
            return f"({self.math(a, ct)} {_CMP[op]} {self.math(b, ct)})"
        if op in _LOGIC:
            return f"(af_truth({a}) {_LOGIC[op]} af_truth({b}))"
        if op in _BITWISE:
            if fl:
                raise _unsupported(op, ct)
            return f"({CTYPE[ct]})({a} {_BITWISE[op]} {b})"
        if op in ("add", "sub", "mul"):
            if fl:
                sym = {"add": "+", "sub": "-", "mul": "*"}[op]
                return self.store(f"{self.math(a, ct)} {sym} {self.math(b, ct)}", ct)
            if ct == "bool":
                if op == "sub":
                    raise _unsupported(op, ct)
                return f"({a} {'||' if op == 'add' else '&&'} {b})"
            return f"af_{op}({a}, {b})"
        if op == "div":
            if not fl:
                raise _unsupported(op, ct, " (div's output is floating)")
            return self.store(f"{self.math(a, ct)} / {self.math(b, ct)}", ct)
        if op == "pow":
            if fl:
                return self.store(f"af_pow({self.math(a, ct)}, {self.math(b, ct)})", ct)
            if ct == "bool":
                return f"({a} || !{b})"
            return f"af_ipow({a}, {b})"
        if op in ("maximum", "minimum"):
            if ct == "bool":
                return f"({a} {'||' if op == 'maximum' else '&&'} {b})"
            if fl:
                return self.store(f"af_{op}({self.math(a, ct)}, {self.math(b, ct)})", ct)
            return f"af_{op}({a}, {b})"
        if op in _INTDIV:
            if ct == "bool":
                raise _unsupported(op, ct, " (numpy has no bool loop for it)")
            if fl:
                return self.store(f"af_{op}({self.math(a, ct)}, {self.math(b, ct)})", ct)
            self.zero = True
            return f"af_{op}({a}, {b}, zero)"
        raise AssertionError(op)


def _weak(xt: str, pytype: str) -> str:
    """The dtype numpy compares a ``xt`` array with a Python ``pytype`` number in (NEP 50:
    the number takes the array's dtype unless its kind is higher: then the default of its
    kind, int64 or float64)."""
    kind = {"bool": bool_, "int": int64, "float": float64}[pytype]
    return xt if kind.category <= as_dtype(xt).category else kind.name


# -- the text ---------------------------------------------------------------------------

PRELUDE = r"""// actorflow elementwise kernels (generated: actorflow/backends/cuda/kernels.py)
struct af_half { unsigned short bits; };
#ifdef __CUDACC_RTC__
__device__ __forceinline__ float af_h2f(af_half h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits)); return f; }
__device__ __forceinline__ af_half af_f2h(float f) {
    af_half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f)); return h; }
__device__ __forceinline__ af_half af_d2h(double d) {
    af_half h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.bits) : "d"(d)); return h; }
#else  // a host compiler with _Float16 (tests/test_cuda_kernels.py runs the kernels on the host)
__device__ __forceinline__ float af_h2f(af_half h) {
    _Float16 x; __builtin_memcpy(&x, &h.bits, 2); return (float)x; }
__device__ __forceinline__ af_half af_f2h(float f) {
    _Float16 x = (_Float16)f; af_half h; __builtin_memcpy(&h.bits, &x, 2); return h; }
__device__ __forceinline__ af_half af_d2h(double d) {
    _Float16 x = (_Float16)d; af_half h; __builtin_memcpy(&h.bits, &x, 2); return h; }
#endif
__device__ __forceinline__ float af_round_h(float f) { return af_h2f(af_f2h(f)); }

template <typename D, typename S> struct af_caster {
    static __device__ __forceinline__ D go(S s) { return (D)s; } };
template <typename S> struct af_caster<af_half, S> {
    static __device__ __forceinline__ af_half go(S s) { return af_f2h((float)s); } };
template <> struct af_caster<af_half, double> {
    static __device__ __forceinline__ af_half go(double s) { return af_d2h(s); } };
template <typename D> struct af_caster<D, af_half> {
    static __device__ __forceinline__ D go(af_half s) { return (D)af_h2f(s); } };
template <> struct af_caster<af_half, af_half> {
    static __device__ __forceinline__ af_half go(af_half s) { return s; } };
template <> struct af_caster<bool, af_half> {
    static __device__ __forceinline__ bool go(af_half s) { return af_h2f(s) != 0.0f; } };
template <typename D, typename S> __device__ __forceinline__ D af_cast(S s) {
    return af_caster<D, S>::go(s); }

__device__ __forceinline__ bool af_truth(bool x) { return x; }
__device__ __forceinline__ bool af_truth(int x) { return x != 0; }
__device__ __forceinline__ bool af_truth(long long x) { return x != 0; }
__device__ __forceinline__ bool af_truth(float x) { return x != 0.0f; }
__device__ __forceinline__ bool af_truth(double x) { return x != 0.0; }
__device__ __forceinline__ bool af_truth(af_half x) { return af_h2f(x) != 0.0f; }

// integers wrap, as numpy's
#define AF_INT_OPS(T, U) \
__device__ __forceinline__ T af_add(T a, T b) { return (T)((U)a + (U)b); } \
__device__ __forceinline__ T af_sub(T a, T b) { return (T)((U)a - (U)b); } \
__device__ __forceinline__ T af_mul(T a, T b) { return (T)((U)a * (U)b); } \
__device__ __forceinline__ T af_neg(T a) { return (T)((U)0 - (U)a); } \
__device__ __forceinline__ T af_abs(T a) { return a < 0 ? af_neg(a) : a; } \
__device__ __forceinline__ T af_maximum(T a, T b) { return a > b ? a : b; } \
__device__ __forceinline__ T af_minimum(T a, T b) { return a < b ? a : b; } \
__device__ __forceinline__ T af_ipow(T a, T b) { \
    if (b < 0) return a == 1 ? (T)1 : (a == -1 ? ((b & 1) ? (T)-1 : (T)1) : (T)0); \
    U r = 1, x = (U)a; \
    while (b) { if (b & 1) r *= x; x *= x; b >>= 1; } \
    return (T)r; } \
__device__ __forceinline__ T af_floor_divide(T a, T b, int* zero) { \
    if (b == 0) { *zero = 1; return 0; } \
    if (b == -1) return af_neg(a); \
    T q = a / b; \
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1; \
    return q; } \
__device__ __forceinline__ T af_remainder(T a, T b, int* zero) { \
    if (b == 0) { *zero = 1; return 0; } \
    if (b == -1) return 0; \
    T r = a % b; \
    if (r != 0 && ((r < 0) != (b < 0))) r += b; \
    return r; } \
__device__ __forceinline__ T af_trunc_divide(T a, T b, int* zero) { \
    if (b == 0) { *zero = 1; return 0; } \
    if (b == -1) return af_neg(a); \
    return a / b; }
AF_INT_OPS(int, unsigned int)
AF_INT_OPS(long long, unsigned long long)

// floats: NaN propagates through maximum/minimum; an equal pair gives b (numpy's loops)
#define AF_FLOAT_OPS(T, SFX) \
__device__ __forceinline__ T af_abs(T a) { return fabs##SFX(a); } \
__device__ __forceinline__ T af_exp(T a) { return exp##SFX(a); } \
__device__ __forceinline__ T af_log(T a) { return log##SFX(a); } \
__device__ __forceinline__ T af_sqrt(T a) { return sqrt##SFX(a); } \
__device__ __forceinline__ T af_tanh(T a) { return tanh##SFX(a); } \
__device__ __forceinline__ T af_sin(T a) { return sin##SFX(a); } \
__device__ __forceinline__ T af_cos(T a) { return cos##SFX(a); } \
__device__ __forceinline__ T af_pow(T a, T b) { return pow##SFX(a, b); } \
__device__ __forceinline__ T af_maximum(T a, T b) { return (a > b || a != a) ? a : b; } \
__device__ __forceinline__ T af_minimum(T a, T b) { return (a < b || a != a) ? a : b; } \
__device__ __forceinline__ T af_divmod(T a, T b, T* modulus) { \
    T mod = fmod##SFX(a, b); \
    if (b == (T)0) { *modulus = mod; return a / b; } \
    T div = (a - mod) / b; \
    if (mod != (T)0) { \
        if ((b < (T)0) != (mod < (T)0)) { mod += b; div -= (T)1; } \
    } else { mod = copysign##SFX((T)0, b); } \
    T fd; \
    if (div != (T)0) { fd = floor##SFX(div); if (div - fd > (T)0.5) fd += (T)1; } \
    else { fd = copysign##SFX((T)0, a / b); } \
    *modulus = mod; return fd; } \
__device__ __forceinline__ T af_floor_divide(T a, T b) { \
    if (b == (T)0) return a / b; \
    T m; return af_divmod(a, b, &m); } \
__device__ __forceinline__ T af_remainder(T a, T b) { \
    if (b == (T)0) return fmod##SFX(a, b); \
    T m; af_divmod(a, b, &m); return m; } \
__device__ __forceinline__ T af_trunc_divide(T a, T b) { return trunc##SFX(a / b); }
AF_FLOAT_OPS(float, f)
AF_FLOAT_OPS(double, )

// gelu as the numpy kernel computes it: erf exact in float64, else Abramowitz-Stegun 7.1.26
__device__ __forceinline__ float af_erf_as(float x) {
    float s = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);
    float a = fabsf(x);
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f
                 + t * (-1.453152027f + t * 1.061405429f))));
    return s * (1.0f - poly * expf(-a * a));
}
__device__ __forceinline__ double af_gelu_d(double x) {
    return 0.5 * x * (1.0 + erf(x / 1.4142135623730951)); }
__device__ __forceinline__ double af_gelu_d_tanh(double x) {
    return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * pow(x, 3.0)))); }
__device__ __forceinline__ float af_gelu_f(float x) {
    return 0.5f * x * (1.0f + af_erf_as(x / 1.41421356f)); }
__device__ __forceinline__ float af_gelu_f_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * powf(x, 3.0f)))); }
__device__ __forceinline__ af_half af_gelu_h(af_half h) {
    float x = af_h2f(h);
    float e = af_erf_as(af_round_h(x / af_round_h(1.41421356f)));
    return af_f2h(af_round_h(0.5f * x) * (1.0f + e)); }
__device__ __forceinline__ af_half af_gelu_h_tanh(af_half h) {
    float x = af_h2f(h);
    float c = af_round_h(0.7978845608028654f), k = af_round_h(0.044715f);
    float x3 = af_round_h(powf(x, 3.0f));
    float in = af_round_h(c * af_round_h(x + af_round_h(k * x3)));
    float r = af_round_h(af_round_h(0.5f * x) * af_round_h(1.0f + af_round_h(tanhf(in))));
    return af_f2h(r); }
"""


def _name(run: FusedRun, vector: int) -> str:
    """A readable, unique entry point: the ops and dtypes, and a short hash of the run."""
    ops = "_".join(s.op for s in run.steps[:3]) + ("_etc" if len(run.steps) > 3 else "")
    h = hashlib.sha256(repr((run, vector)).encode()).hexdigest()[:10]
    return f"af_{ops}_{run.steps[-1].dtype}_{h}" + ("_v4" if vector == 4 else "")


def vectorizable(run: FusedRun) -> bool:
    """Every value of the run is float32 (then the float4 form applies)."""
    return all(v.dtype == "float32" for v in run.inputs) and all(
        s.dtype == "float32" for s in run.steps
    )


def fused(run: FusedRun, vector: int = 1) -> KernelSource:
    """The kernel of a run: one thread computes every step for its elements, intermediates
    in registers. ``vector=4``: the float4 form (``vectorizable(run)`` must hold).

    Raises DeviceError for an op the generator does not cover, DTypeError for a dtype the
    op has no kernel in (naming both), ValueError for a malformed run (a value used before
    it is defined or defined twice, a name that is not an identifier, an unknown output)."""
    if not run.steps:
        raise ValueError("a run needs at least one step")
    outputs = tuple(run.outputs) or (run.steps[-1].out,)
    if vector not in (1, 4) or (vector == 4 and not vectorizable(run)):
        raise ValueError(
            f"vector={vector}: the float4 form is for runs whose values are all "
            f"float32; use vector=1"
        )
    em = _Emitter(run)
    em.emit()
    for o in outputs:
        if o not in em.types:
            raise ValueError(f"run output {o!r} is not a value of the run")
    name = _name(run, vector)
    ins = run.inputs
    full = [v for v in ins if v.layout == "full"]
    # element function: inputs by value, outputs by reference
    sig = (
        [f"{CTYPE[v.dtype]} {em.var(v.name)}" for v in ins]
        + [f"{CTYPE[t]} {p}" for p, t in em.params]
        + [f"{CTYPE[em.types[o]]}& r{j}" for j, o in enumerate(outputs)]
        + ["int* zero"]
    )
    body = [f"static __device__ __forceinline__ void {name}_elem({', '.join(sig)}) {{"]
    body += ["    " + ln for ln in em.lines]
    body += [f"    r{j} = {em.var(o)};" for j, o in enumerate(outputs)]
    body.append("}")
    params = (
        [(f"out{j}", "out", em.types[o]) for j, o in enumerate(outputs)]
        + [(f"in_{v.name}", "in", v.dtype) for v in ins]
        + [(p, "scalar", t) for p, t in em.params]
        + [("n", "n", "int64")]
        + ([("zero", "zero", "int32")] if em.zero else [])
    )
    cparams = []
    for p, kind, t in params:
        if kind == "out":
            cparams.append(f"{CTYPE[t]}* {p}")
        elif kind == "in":
            cparams.append(f"const {CTYPE[t]}* {p}")
        elif kind == "scalar":
            cparams.append(f"{CTYPE[t]} {p}")
        elif kind == "n":
            cparams.append("long long n")
        else:
            cparams.append("int* zero")
    k = [f'extern "C" __global__ void {name}({", ".join(cparams)}) {{']
    k += [
        f"    const {CTYPE[v.dtype]} sc_{v.name} = in_{v.name}[0];"
        for v in ins
        if v.layout == "scalar"
    ]
    if not em.zero:
        k.append("    int* zero = nullptr;")
    k.append("    long long stride = (long long)gridDim.x * blockDim.x;")
    k.append("    long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;")

    def call(index: str, lane: str = "") -> list:
        args = [
            (
                f"in_{v.name}[{index}]"
                if v.layout == "full" and not lane
                else f"x_{v.name}{lane}"
                if v.layout == "full"
                else f"sc_{v.name}"
            )
            for v in ins
        ]
        args += [p for p, _ in em.params]
        if lane:
            args += [f"y{j}{lane}" for j in range(len(outputs))]
        else:
            args += [f"out{j}[{index}]" for j in range(len(outputs))]
        return [f"{name}_elem({', '.join(args + ['zero'])});"]

    start = "first"
    if vector == 4:
        ptrs = [f"out{j}" for j in range(len(outputs))] + [f"in_{v.name}" for v in full]
        k.append("    long long n4 = 0;")
        k.append(
            "    if (((" + " | ".join(f"(unsigned long long){p}" for p in ptrs) + ") & 15) == 0) {"
        )
        k.append("        n4 = n / 4;")
        k.append("        for (long long j = first; j < n4; j += stride) {")
        for v in full:
            k.append(
                f"            float4 x_{v.name} = reinterpret_cast<const float4*>(in_{v.name})[j];"
            )
        for j in range(len(outputs)):
            k.append(f"            float4 y{j};")
        for lane in (".x", ".y", ".z", ".w"):
            k += ["            " + ln for ln in call("", lane)]
        for j in range(len(outputs)):
            k.append(f"            reinterpret_cast<float4*>(out{j})[j] = y{j};")
        k.append("        }")
        k.append("    }")
        start = "4 * n4 + first"
    k.append(f"    for (long long i = {start}; i < n; i += stride) {{")
    k += ["        " + ln for ln in call("i")]
    k.append("    }")
    k.append("}")
    source = PRELUDE + "\n" + "\n".join(body) + "\n\n" + "\n".join(k) + "\n"
    dtypes = tuple(em.types[o] for o in outputs) + tuple(v.dtype for v in ins)
    return KernelSource(name, source, dtypes, tuple(params), vector)


def elementwise(
    op: str,
    dtype: str,
    inputs: tuple,
    layouts: tuple | None = None,
    scalars: tuple = (),
    attrs: tuple = (),
    compute: str | None = None,
    vector: int = 1,
) -> KernelSource:
    """The kernel of one op: ``dtype`` is its output dtype (the registry's inference),
    ``inputs`` the dtype names of its tensor inputs in the registry's order, ``layouts``
    each one's layout (all ``"full"`` by default); ``scalars``, ``attrs`` and ``compute``
    as in ``Step``. Raises what ``fused`` raises (DTypeError where the op has no kernel in
    these dtypes)."""
    layouts = layouts or ("full",) * len(inputs)
    names = [f"a{j}" for j in range(len(inputs))]
    run = FusedRun(
        tuple(Value(nm, t, lay) for nm, t, lay in zip(names, inputs, layouts, strict=True)),
        (Step("out", op, tuple(names), dtype, tuple(scalars), tuple(attrs), compute),),
        ("out",),
    )
    return fused(run, vector)
