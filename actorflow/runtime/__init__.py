"""The actor runtime: registers and credits, actors, the graph, the planner, the scheduler."""

from .graph.actor_graph import ActorGraph
from .graph.device_acts import Copy
from .plan.reservation import Plan
from .plan.spec import Spec
from .observe.stats import RunStats

__all__ = ["ActorGraph", "Copy", "Plan", "Spec", "RunStats"]
