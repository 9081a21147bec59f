"""The Ray cluster as a plan sees it: its nodes in a stable order (``node:0`` is the
driver's), what a placement's ``node`` names, and the budgets per node and per Ray
resource checked against the registers an actor may hold there."""

from __future__ import annotations

from ..errors import PlanError, format_bytes


class Nodes:
    """The cluster's live nodes: ``node:0`` is the driver's, the others follow by address
    and port (a stable order for the same cluster). ``ids[k]`` is node ``k``'s Ray NodeID."""

    def __init__(self, ray):
        here = ray.get_runtime_context().get_node_id()
        alive = [n for n in ray.nodes() if n.get("Alive")]
        alive.sort(
            key=lambda n: (
                n["NodeID"] != here,
                n.get("NodeManagerAddress", ""),
                n.get("NodeManagerPort", 0),
                n["NodeID"],
            )
        )
        self.ids = [n["NodeID"] for n in alive]
        self.addresses = [n.get("NodeManagerAddress", "") for n in alive]
        self.resources = [n.get("Resources", {}) for n in alive]

    def label_of_id(self, node_id) -> str:
        """``node:K`` of a NodeID (a node that joined after the plan: its ID)."""
        return f"node:{self.ids.index(node_id)}" if node_id in self.ids else str(node_id)

    def resolve(self, node, what: str) -> int:
        """The index of the node that ``node`` names: ``"node:K"`` (or K), a NodeID, or an
        IP address (``"node:10.0.0.2"``, Ray's own resource name for it) of one node."""
        text = str(node)
        tail = text[5:] if text.startswith("node:") else text
        if tail.isdigit() and int(tail) < len(self.ids):
            return int(tail)
        if text in self.ids:
            return self.ids.index(text)
        hits = [k for k, a in enumerate(self.addresses) if a and a == tail]
        if len(hits) == 1:
            return hits[0]
        said = (
            f"{len(hits)} nodes have address {tail!r}; name one by node:K or NodeID"
            if hits
            else f"it is not one of this cluster's {len(self.ids)} nodes"
        )
        raise PlanError(
            f"engine='ray': {what}: node {node!r}: {said} (node:0 ... "
            f"node:{len(self.ids) - 1}, node:0 the driver's; "
            f"{self.describe()})"
        )

    def describe(self) -> str:
        return ", ".join(
            f"node:{k} {a} ({i[:8]})"
            for k, (a, i) in enumerate(zip(self.addresses, self.ids, strict=True))
        )


def budget_keys(memory: dict, nodes: Nodes, have: dict) -> dict:
    """``memory=``'s keys as the plan counts them: a node (any name ``resolve`` takes) as
    ``node:K``, else a Ray resource of the cluster (``GPU``, a custom one)."""
    out: dict = {}
    for key, budget in memory.items():
        try:
            label = f"node:{nodes.resolve(key, 'memory=')}"
        except PlanError as e:
            if key in have:
                label = key
            else:
                raise PlanError(
                    f"engine='ray': memory= names {key!r}, which is neither a "
                    f"node nor a Ray resource of the cluster ({e.args[0]}; "
                    f"resources: {sorted(k for k in have if not k.startswith('node:'))})"
                ) from None
        out[label] = budget
    return out


def check_budgets(held: list, budgets: dict, batch: int, when: str) -> dict:
    """``held``: per actor ``(name, buffers, bytes per piece, nodes, resources)``: the
    nodes its registers may lie on (each node of its replicas could hold all of them, so
    each counts them whole) and the Ray resources its processes ask. Returns the bytes
    needed per budget key; a key over its budget is a PlanError naming each actor's share
    and the ``buffers`` that would fit."""
    need: dict = {}
    rows: dict = {}
    for name, buffers, size, where, asks in held:
        for key in set(where) | {r for r, v in asks.items() if v and r in budgets}:
            need[key] = need.get(key, 0) + buffers * batch * size
            rows.setdefault(key, []).append((name, buffers, size))
    for key, budget in budgets.items():
        if need.get(key, 0) <= budget:
            continue
        said = ", ".join(f"{n} {b} x {batch} x {format_bytes(s)}" for n, b, s in rows[key])
        one = sum(batch * s for _, _, s in rows[key])
        fit = budget // one if one else 0
        where = key if key.startswith("node:") else f"the actors asking Ray resource {key!r}"
        raise PlanError(
            f"engine='ray': the registers on {where} need {format_bytes(need[key])} "
            f"({said}), over its {format_bytes(budget)} budget{when}; "
            + (
                f"buffers={fit} would fit"
                if fit
                else "even one register (a batch of pieces) per actor does not fit: raise the "
                "budget, lower batch= or place actors on other nodes"
            ),
            device=key,
            needed=need[key],
            budget=budget,
            fitting_buffers=fit or None,
        )
    return need
