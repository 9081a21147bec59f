"""Actor graphs beyond one process: ``g.run(engine="ray")`` or
``g.run(engine=af.distributed.RayEngine(placement=..., memory=...))`` runs each stage
replica in a Ray actor process, with the graph's credits and budgets kept across
processes (``ray_engine.py``). Ray is imported only when a run starts (the ``ray`` extra).
"""

from __future__ import annotations

from ..runtime.graph.actor_graph import register_engine
from .ray_engine import RayEngine

register_engine("ray", RayEngine)

__all__ = ["RayEngine"]
