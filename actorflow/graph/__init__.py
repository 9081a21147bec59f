"""Tracing: record a function of tensors as ops, then run it as a graph of actors."""

from .trace import Traced, trace

__all__ = ["Traced", "trace"]
