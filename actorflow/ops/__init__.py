"""The op registry and one file per op family (importing this registers them all)."""

from . import (  # noqa: F401
    conv,
    elementwise,
    factory,
    index,
    matmul,
    nn,
    ordering,
    padding,
    reduce,
    selection,
    shape,
)
from .registry import OpDef, all_ops, get, register

__all__ = ["OpDef", "all_ops", "get", "register"]
