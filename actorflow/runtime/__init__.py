"""The actor runtime: registers and credits, actors, the graph, the planner, the scheduler."""

from .graph.actor_graph import ActorGraph
from .plan.reservation import Plan
from .plan.spec import Spec
from .observe.stats import RunStats

__all__ = ["ActorGraph", "Plan", "Spec", "RunStats"]
