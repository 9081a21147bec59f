"""The functions users call (``af.relu``, ``af.add``...): argument checks with messages
that name the op, the values and the fix, then dispatch to the interpreter. One module per
family: ``elementwise`` (unary, binary and their prebuilt operator functions, in-place
forms, fill/zero/copy, clamp, where, matmul), ``reduce`` (reductions, softmax-like),
``joining`` (cat, stack, cast, to_device, clone, nonzero), ``ordering`` (gather,
scatter_add, cumsum, sort, argsort, topk, pad), ``conv`` (convolution and
pooling over NCHW), on ``common``'s checks.

Every function takes tensors and returns new tensors unless it ends in ``_`` or takes
``inplace=True``, which write the first argument and return it.

A function named like one of PyTorch's takes PyTorch's arguments: the same positions and
keyword names (and PyTorch's numpy spellings ``axis=`` / ``keepdims=``), ``out=`` taken and
refused by name. ``tests/test_torch_signatures.py`` compares the signatures with PyTorch's and
lists, with reasons, what is not taken yet.
"""

from .conv import (
                          adaptive_avg_pool2d,
                          avg_pool2d,
                          conv2d,
                          conv_transpose2d,
                          fold,
                          max_pool2d,
                          max_pool2d_values,
                          unfold,
)
from .elementwise import (
                          abs,
                          add,
                          add_,
                          bitwise_and,
                          bitwise_not,
                          bitwise_or,
                          bitwise_xor,
                          clamp,
                          clamp_,
                          clip,
                          clip_,
                          copy_,
                          cos,
                          div,
                          div_,
                          divide,
                          eq,
                          erf,
                          exp,
                          fill_,
                          floor_divide,
                          floor_divide_,
                          ge,
                          gelu,
                          gt,
                          le,
                          log,
                          logical_and,
                          logical_not,
                          logical_or,
                          lt,
                          masked_fill,
                          matmul,
                          maximum,
                          minimum,
                          mul,
                          mul_,
                          multiply,
                          ne,
                          neg,
                          pow,
                          prebuilt_operator,
                          relu,
                          remainder,
                          remainder_,
                          rsqrt,
                          sigmoid,
                          silu,
                          sin,
                          sqrt,
                          sub,
                          sub_,
                          subtract,
                          tanh,
                          tril,
                          triu,
                          true_divide,
                          where,
                          zero_,
)
from .joining import cast, cat, clone, is_floating_point, nonzero, stack, to_device
from .ordering import (
                          Sort,
                          TopK,
                          argsort,
                          cumsum,
                          gather,
                          pad,
                          scatter_add,
                          scatter_add_,
                          sort,
                          topk,
)
from .reduce import (
                          MinMax,
                          amax,
                          amin,
                          argmax,
                          argmin,
                          log_softmax,
                          max,
                          mean,
                          min,
                          softmax,
                          std,
                          sum,
                          var,
)

__all__ = [
    "abs", "add", "add_", "amax", "amin", "argmax", "argmin", "bitwise_and", "bitwise_not",
    "bitwise_or", "bitwise_xor", "cast", "cat", "clamp", "clamp_", "clip", "clip_", "clone",
    "copy_", "cos", "div", "div_", "divide", "eq", "erf", "exp", "fill_", "floor_divide",
    "floor_divide_", "ge", "gelu", "gt", "is_floating_point", "le", "log", "log_softmax",
    "logical_and", "logical_not", "logical_or", "lt", "matmul", "max", "maximum", "mean", "min",
    "minimum", "MinMax", "mul", "mul_", "multiply", "ne", "neg", "nonzero", "pow",
    "prebuilt_operator", "relu", "remainder", "remainder_", "rsqrt", "sigmoid", "silu", "sin",
    "softmax", "sqrt", "stack", "std", "sub", "sub_", "subtract", "sum", "tanh", "to_device",
    "true_divide", "var", "where", "zero_",
    "Sort", "TopK", "argsort", "cumsum", "gather", "pad", "scatter_add", "scatter_add_", "sort",
    "topk",
    "masked_fill", "tril", "triu",
    "adaptive_avg_pool2d", "avg_pool2d", "conv2d", "conv_transpose2d", "fold", "max_pool2d",
    "max_pool2d_values", "unfold",
]
