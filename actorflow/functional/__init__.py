"""The functions users call (``af.relu``, ``af.add``...): argument checks with messages
that name the op, the values and the fix, then dispatch to the interpreter. One module per
family: ``elementwise`` (unary, binary and their prebuilt operator functions, in-place
forms, fill/zero/copy, clamp, where, matmul), ``reduce`` (reductions, softmax-like),
``joining`` (cat, stack, cast, to_device, clone, nonzero), ``conv`` (convolution and
pooling over NCHW), on ``common``'s checks.

Every function takes tensors and returns new tensors unless it ends in ``_`` or takes
``inplace=True``, which write the first argument and return it.

A function named like one of PyTorch's takes PyTorch's arguments: the same positions and
keyword names (and PyTorch's numpy spellings ``axis=`` / ``keepdims=``), ``out=`` taken and
refused by name. ``tests/test_torch_signatures.py`` compares the signatures with PyTorch's and
lists, with reasons, what is not taken yet.
"""

from .elementwise import (abs, add, add_, bitwise_and, bitwise_not, bitwise_or, bitwise_xor,
                          clamp, clamp_, clip, clip_, copy_, div, div_, divide, eq, exp, fill_,
                          floor_divide, floor_divide_, ge, gelu, gt, le, log, logical_and,
                          logical_not, logical_or, lt, matmul, maximum, minimum, mul, mul_,
                          multiply, ne, neg, pow, prebuilt_operator, relu, remainder,
                          remainder_, sigmoid, sqrt, sub, sub_, subtract, tanh, true_divide,
                          where, zero_)
from .conv import (adaptive_avg_pool2d, avg_pool2d, conv2d, conv_transpose2d, fold,
                   max_pool2d, max_pool2d_values, unfold)
from .joining import cast, cat, clone, is_floating_point, nonzero, stack, to_device
from .reduce import (MinMax, amax, amin, argmax, argmin, log_softmax, max, mean, min,
                     softmax, sum)

__all__ = [
    "abs", "adaptive_avg_pool2d", "add", "add_", "amax", "amin", "argmax", "argmin", "bitwise_and", "bitwise_not",
    "bitwise_or", "bitwise_xor", "avg_pool2d", "cast", "cat", "clamp", "clamp_", "clip", "clip_",
    "clone", "conv2d", "conv_transpose2d", "copy_", "fold", "max_pool2d", "max_pool2d_values",
    "unfold", "div", "div_", "divide", "eq", "exp", "fill_", "floor_divide", "floor_divide_",
    "ge", "gelu", "gt", "is_floating_point", "le", "log", "log_softmax", "logical_and",
    "logical_not", "logical_or", "lt", "matmul", "max", "maximum", "mean", "min", "minimum",
    "MinMax", "mul", "mul_", "multiply", "ne", "neg", "nonzero", "pow", "prebuilt_operator",
    "relu", "remainder", "remainder_", "sigmoid", "softmax", "sqrt", "stack", "sub", "sub_",
    "subtract", "sum", "tanh", "to_device", "true_divide", "where", "zero_",
]
