"""actorflow: a deep-learning runtime where every op is an actor and memory is an explicit
dependency. This module re-exports the public names only."""

from . import data, distributed, lowlevel, nn, optim, testing
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .creation import (
                       arange,
                       empty,
                       empty_like,
                       from_dlpack,
                       from_numpy,
                       full,
                       full_like,
                       manual_seed,
                       ones,
                       ones_like,
                       rand,
                       rand_like,
                       randn,
                       randn_like,
                       tensor,
                       zeros,
                       zeros_like,
)
from .device import Device, device
from .dtype import (
                       DType,
                       bfloat16,
                       bool_,
                       float16,
                       float32,
                       float64,
                       int32,
                       int64,
                       promote_types,
                       result_type,
)
from .errors import (
                       ActorError,
                       ActorflowError,
                       DeadlockError,
                       DeviceError,
                       DivisionByZeroError,
                       DTypeError,
                       IndexOutOfBoundsError,
                       InvalidInputError,
                       KernelError,
                       OutOfMemoryError,
                       PlanError,
                       ShapeError,
                       TraceError,
                       VMError,
)
from .functional import (
                       abs,
                       add,
                       add_,
                       amax,
                       amin,
                       argmax,
                       argmin,
                       argsort,
                       bitwise_and,
                       bitwise_not,
                       bitwise_or,
                       bitwise_xor,
                       cast,
                       cat,
                       clamp,
                       clone,
                       conv2d,
                       conv_transpose2d,
                       copy_,
                       cos,
                       cumsum,
                       div,
                       div_,
                       eq,
                       erf,
                       exp,
                       fill_,
                       floor_divide,
                       floor_divide_,
                       gather,
                       ge,
                       gelu,
                       gt,
                       is_floating_point,
                       le,
                       log,
                       log_softmax,
                       logical_and,
                       logical_not,
                       logical_or,
                       lt,
                       masked_fill,
                       matmul,
                       max,
                       maximum,
                       mean,
                       min,
                       minimum,
                       mul,
                       mul_,
                       ne,
                       neg,
                       nonzero,
                       pow,
                       relu,
                       remainder,
                       remainder_,
                       rsqrt,
                       scatter_add,
                       sigmoid,
                       sin,
                       softmax,
                       sort,
                       sqrt,
                       stack,
                       std,
                       sub,
                       sub_,
                       sum,
                       tanh,
                       topk,
                       tril,
                       triu,
                       var,
                       where,
                       zero_,
)
from .functional import max_pool2d_values as max_pool2d
from .methods import bind as _bind_tensor_methods  # noqa: F401 - binds Tensor's methods
from .pipeline import Pipeline
from .plots import plot_timeline
from .runtime import ActorGraph, Copy, RunStats, Spec
from .runtime_api import synchronize, synchronize_async
from .serialization import load, save
from .tensor.tensor import Tensor
from .tracing import trace
from .vm.profiler import profile

bool = bool_  # noqa: A001 - af.bool, as torch.bool
float = float32  # noqa: A001
double = float64
half = float16
long = int64
int = int32  # noqa: A001

__version__ = "0.1.0"

__all__ = [
    # tensors and creation
    "Tensor", "tensor", "from_numpy", "from_dlpack", "empty", "zeros", "ones", "full", "arange",
    "rand", "randn", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like",
    "randn_like", "manual_seed",
    # dtypes and devices
    "DType", "bool", "bool_", "int32", "int64", "float16", "bfloat16", "float32", "float64",
    "float",
    "double", "half", "long", "int", "promote_types", "result_type", "Device", "device",
    # ops
    "abs", "add", "add_", "amax", "amin", "argmax", "argmin", "bitwise_and", "bitwise_not",
    "bitwise_or", "bitwise_xor", "cast", "cat", "clamp", "clone", "conv2d", "conv_transpose2d",
    "copy_", "cos", "erf",
    "floor_divide",
    "floor_divide_", "remainder", "remainder_",
    "div", "div_", "eq", "exp", "fill_", "ge", "gelu", "gt", "is_floating_point", "le", "log",
    "log_softmax", "logical_and", "logical_not", "logical_or", "lt", "matmul", "max", "max_pool2d",
    "maximum",
    "mean", "min", "minimum", "mul", "mul_", "ne", "neg", "nonzero", "pow", "relu", "sigmoid",
    "rsqrt", "sin", "softmax", "sqrt", "stack", "std", "sub", "sub_", "sum", "tanh", "var",
    "where", "zero_", "argsort", "cumsum", "gather", "scatter_add", "sort", "topk",
    "masked_fill", "tril", "triu",
    # autograd
    "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled",
    # running
    "synchronize", "synchronize_async", "profile", "lowlevel", "testing", "distributed",
    # training
    "nn", "optim", "data", "save", "load",
    # actor graphs
    "ActorGraph", "Pipeline", "Copy", "Spec", "RunStats", "trace", "plot_timeline",
    # errors
    "ActorError", "ActorflowError", "DeadlockError", "DeviceError", "DivisionByZeroError",
    "DTypeError", "IndexOutOfBoundsError", "InvalidInputError", "KernelError",
    "OutOfMemoryError", "PlanError", "ShapeError", "TraceError", "VMError",
]
