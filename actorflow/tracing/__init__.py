"""Tracing: record a function of tensors as ops, then run it as a graph of actors.

Importing it lets ``ActorGraph.op`` trace: the runtime, below this package, never imports it;
it is handed ``op_program`` here."""

from ..runtime.graph.actor_graph import use_op_tracer
from .build import stateful_graph
from .recording import Recording
from .trace import Traced, op_program, stateful_program, trace

use_op_tracer(op_program)

__all__ = ["Recording", "Traced", "op_program", "stateful_graph", "stateful_program", "trace"]
