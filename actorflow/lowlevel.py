"""Power-user names: the VM, instructions, streams, allocators and scheduler settings; the
actor runtime's registers, ports, budgets, planner and credit scheduler; the tracer."""

# (no ``from __future__ import annotations``: its name would be public on this face; the
# annotations below are evaluated once, at import)
from collections.abc import Callable as _Callable
from typing import Any as _Any

from .backends import get_backend
from .backends import loaded_backends as _loaded_backends
from .backends.base import Allocator, AllocatorStats, Backend, Stream
from .device import _DeviceLike
from .device import device as _device
from .eager.interpreter import EagerInterpreter, Interpreter, apply, use_interpreter, use_stream
from .errors import parse_bytes as _parse_bytes
from .experiments.naive import NaiveOp, NaiveResult, NaiveScheduler, ops_from_graph
from .ops import OpDef, all_ops
from .ops import get as get_op
from .ops import register as register_op
from .runtime.observe.watchdog import WaitFor
from .runtime.plan.registers import InPort, MemoryBudget, OutPort, Register
from .runtime.plan.reservation import Plan
from .runtime.plan.sizing import build_plan
from .runtime.sched.credit import CreditScheduler
from .tensor.blob import Blob
from .tensor.impl import TensorImpl
from .tensor.meta import TensorMeta
from .tracing.program import Program
from .tracing.recording import Tracer
from .vm import VM, Access, Instruction, Operand, get_vm


def stream(device: _DeviceLike = "cpu", name: str = "compute") -> Stream:
    """The named in-order stream of a device (made on first use); use with ``use_stream``."""
    return get_backend(_device(device)).stream(name)


def allocator(device: _DeviceLike = "cpu") -> Allocator:
    return get_backend(_device(device)).allocator


def memory_stats(device: _DeviceLike = "cpu") -> AllocatorStats:
    """Bytes in use, peak, cached and the budget of one device's allocator."""
    return allocator(device).stats()


def set_memory_budget(device: _DeviceLike, budget: int | float | str | None) -> None:
    """Caps the bytes a device's allocator hands out (an int, '64MiB', or None for none)."""
    allocator(device).set_budget(None if budget is None else _parse_bytes(budget))


def set_null_latency(latency: float | _Callable[[str, int], float]) -> None:
    """Simulated time of every null-device kernel: seconds, or ``f(op_name, out_bytes)``."""
    get_backend(_device("null")).latency = latency


def vm_stats() -> dict[str, _Any]:
    """Instructions issued / completed / in flight / run inline, and bytes per device."""
    out = get_vm().stats()
    out["devices"] = {str(b.device): b.allocator.stats().__dict__ for b in _loaded_backends()}
    return out


__all__ = [
    "CreditScheduler",
    "InPort",
    "MemoryBudget",
    "NaiveOp",
    "NaiveResult",
    "NaiveScheduler",
    "OutPort",
    "Plan",
    "Program",
    "Register",
    "Tracer",
    "WaitFor",
    "build_plan",
    "ops_from_graph",
    "Access",
    "Allocator",
    "AllocatorStats",
    "Backend",
    "Blob",
    "EagerInterpreter",
    "Instruction",
    "Interpreter",
    "OpDef",
    "Operand",
    "Stream",
    "TensorImpl",
    "TensorMeta",
    "VM",
    "all_ops",
    "allocator",
    "apply",
    "get_backend",
    "get_op",
    "get_vm",
    "memory_stats",
    "register_op",
    "set_memory_budget",
    "set_null_latency",
    "stream",
    "use_interpreter",
    "use_stream",
    "vm_stats",
]
