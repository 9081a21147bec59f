"""The actor runtime: registers and credits, actors, the graph, the planner, the scheduler."""

from .graph import ActorGraph
from .plan import Plan
from .spec import Spec
from .stats import RunStats

__all__ = ["ActorGraph", "Plan", "Spec", "RunStats"]
