"""The actor runtime: registers and credits, actors, the graph, the planner, the scheduler."""

from .graph.actor_graph import ActorGraph
from .graph.device_acts import Copy
from .observe.stats import RunStats
from .plan.reservation import Plan
from .plan.spec import Spec

__all__ = ["ActorGraph", "Copy", "Plan", "Spec", "RunStats"]
