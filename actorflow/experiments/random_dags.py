"""How often do data-dependency orders deadlock or run out of memory, on random DAGs?

N random DAGs (default 200) with random output sizes; for each, the capacity is drawn
between the smallest peak some order can run in (found exactly: a search over the sets of
finished ops) and the sum of all outputs. Each DAG runs under the naive scheduler with the
fifo, lifo and random policies, with the ``wait`` allocator (counting deadlocks, and how
long the detector took to name them) and the ``fail`` allocator (counting out-of-memory
errors), and on actors with the same capacity as the budget: the actor runtime either runs
(it never deadlocks) or refuses the plan when it is built. Where the registers side by
side exceed the capacity, the planner shares them by lifetime (``share="auto"``); the
second table compares its planned peak with the exact minimum and the measured peak, and
counts the control edges it added.
"""

from __future__ import annotations

import random
from functools import cache

from ..device import device
from ..errors import PlanError
from ..runtime.graph.actor_graph import ActorGraph
from ..runtime.observe.progress import tqdm_class
from ..runtime.plan.spec import Spec
from .common import OUTCOME_COLORS, save, table
from .common import figure as figure_of
from .naive import NaiveOp, NaiveScheduler

UNIT = 1 << 16  # sizes are multiples of 64 KiB
NULL = device("null")


def random_dag(rng: random.Random, n: int):
    ops = []
    for i in range(n):
        k = rng.randint(0, min(2, i)) if i else 0
        inputs = sorted(rng.sample(range(i), k)) if k else []
        ops.append(NaiveOp(f"op{i}", [f"op{j}" for j in inputs], rng.randint(1, 8) * UNIT, 0.0002))
    return ops


def min_peak(ops) -> int:
    """The smallest peak memory of any order that runs one op at a time (exact)."""
    idx = {o.name: i for i, o in enumerate(ops)}
    ins = [[idx[n] for n in o.inputs] for o in ops]
    cons = [[j for j, js in enumerate(ins) if i in js] for i in range(len(ops))]
    full = (1 << len(ops)) - 1

    def held(done):
        total = 0
        for i in range(len(ops)):
            if done >> i & 1 and cons[i] and any(not (done >> c & 1) for c in cons[i]):
                total += ops[i].nbytes
        return total

    @cache
    def best(done):
        if done == full:
            return 0
        h = held(done)
        result = None
        for i in range(len(ops)):
            if done >> i & 1 or any(not (done >> j & 1) for j in ins[i]):
                continue
            peak = max(h + ops[i].nbytes, best(done | 1 << i))
            result = peak if result is None else min(result, peak)
        return result

    return best(0)


def actors(ops, budget) -> ActorGraph:
    g = ActorGraph(memory={"null": budget}, buffers=1)
    node = {}
    for o in ops:
        spec = Spec((o.nbytes // 4,), "float32", "null")
        if not o.inputs:
            node[o.name] = g.source([None], out=spec, name=o.name, inline=True)
        else:
            node[o.name] = g.actor(
                lambda *x: None, *[node[n] for n in o.inputs], out=spec, name=o.name, inline=True
            )
    consumed = {n for o in ops for n in o.inputs}
    for o in ops:
        if o.name not in consumed:
            g.sink(node[o.name], o.name)
    return g


def run(seed: int = 0, n: int = 200, size: int = 8, progress=False) -> dict:
    """``progress``: a tqdm bar over the DAGs (``--progress``)."""
    rng = random.Random(seed)
    counts: dict = {}
    detect = []
    plans: list = []
    dags = range(n)
    if progress:
        dags = tqdm_class()(dags, desc="random DAGs", unit="dag")
    for _ in dags:
        ops = random_dag(rng, rng.randint(3, size))
        lo, hi = min_peak(ops), sum(o.nbytes for o in ops)
        cap = rng.randint(lo // UNIT, hi // UNIT) * UNIT
        for policy in ("fifo", "lifo", "random"):
            seed_p = rng.randrange(1 << 30)  # the same order for both allocators
            for mode in ("wait", "fail"):
                r = NaiveScheduler(
                    ops, cap, policy=policy, mode=mode, seed=seed_p, time_scale=0
                ).run()
                key = (f"naive {policy}", mode)
                c = counts.setdefault(key, {"ok": 0, "deadlock": 0, "oom": 0})
                c[r.status] += 1
                if r.detect_s is not None:
                    detect.append(r.detect_s)
        c = counts.setdefault(("actors", "plan"), {"ok": 0, "deadlock": 0, "oom": 0, "refused": 0})
        rec = {"ops": len(ops), "capacity": cap, "min_peak": lo, "unshared": hi}
        plans.append(rec)
        try:
            g = actors(ops, cap)
            plan = g.plan()
            sharing = plan.sharing
            rec["planned"] = plan.totals[NULL]
            if sharing is not None:
                rec.update(
                    edges=len(sharing.share.edges),
                    exact=sharing.share.exact,
                    plan_ms=sharing.share.seconds * 1e3,
                )
            list(g.run())
            c["ok"] += 1
            m = g.stats().memory["null"]
            rec["measured"] = m["live"] if m.get("live") is not None else m["peak"]
            assert m["peak"] <= cap and rec["measured"] <= rec["planned"]
        except PlanError as e:
            c["refused"] += 1
            rec["refused"] = e.needed
    headers = ["scheduler", "allocator", "ran", "deadlocked", "out of memory", "refused"]
    rows = [
        [k[0], k[1], v["ok"], v["deadlock"], v["oom"], v.get("refused", "-")]
        for k, v in counts.items()
    ]
    data: dict = {
        "dags": n,
        "seed": seed,
        "headers": headers,
        "rows": rows,
        "detect_ms_max": max(detect) * 1e3 if detect else None,
        "detect_ms_mean": sum(detect) / len(detect) * 1e3 if detect else None,
    }
    text = table(headers, rows)
    if detect:
        text += (
            f"\ndeadlocks named in {data['detect_ms_mean']:.3f} ms on average "
            f"(at most {data['detect_ms_max']:.3f} ms) after the last event"
        )
    data["plans"] = plans
    data["plan_headers"], data["plan_row"] = plan_summary(plans)
    data["table"] = text + "\n\n" + table(data["plan_headers"], [data["plan_row"]])
    return data


def plan_summary(plans: list) -> tuple[list, list]:
    """One row on the actors' plans: how many DAGs shared registers (the capacity was
    below the unshared sum), how many planned peaks equal the exact minimum, how many
    measured peaks equal the planned one, the control edges added and the planning time."""
    shared = [p for p in plans if "edges" in p]
    headers = [
        "DAGs",
        "ran",
        "shared registers",
        "planned = exact minimum",
        "measured = planned",
        "refused below the minimum",
        "control edges",
        "planning ms (max)",
    ]
    row = [
        len(plans),
        sum(1 for p in plans if "measured" in p),
        len(shared),
        sum(1 for p in shared if p["planned"] == p["min_peak"]),
        sum(1 for p in shared if p.get("measured") == p["planned"]),
        sum(1 for p in plans if "refused" in p and p["capacity"] < p["min_peak"]),
        sum(p["edges"] for p in shared),
        round(max((p["plan_ms"] for p in shared), default=0.0), 2),
    ]
    return headers, row


def stacks(data: dict) -> list:
    """What the picture draws, one entry per table row: ``(label, {outcome: DAGs})`` with
    the outcomes ran, deadlocked, out of memory and refused (the plan, at build time),
    which add up to every DAG."""
    out = []
    for r in data["rows"]:
        refused = r[5] if isinstance(r[5], int) else 0
        out.append(
            (
                f"{r[0]} / {r[1]}",
                {"ran": r[2], "deadlocked": r[3], "out of memory": r[4], "refused": refused},
            )
        )
    return out


def figure(data: dict):
    """Per scheduler, what happened to the DAGs (as the table): stacked bars of ran,
    deadlocked, out of memory and refused; None without matplotlib."""
    rows = stacks(data)
    ys = list(range(len(rows)))

    def draw(ax):
        left = [0] * len(rows)
        for outcome, color in OUTCOME_COLORS.items():
            widths = [counts[outcome] for _, counts in rows]
            ax.barh(
                ys,
                widths,
                left=left,
                color=color,
                label="refused (plan over budget)" if outcome == "refused" else outcome,
            )
            for y, x0, w in zip(ys, left, widths, strict=True):
                if w:
                    ax.text(
                        x0 + w / 2,
                        y,
                        str(w),
                        ha="center",
                        va="center",
                        color="white",
                        fontsize="small",
                    )
            left = [a + b for a, b in zip(left, widths, strict=True)]
        ax.set_yticks(ys, [label for label, _ in rows])
        ax.invert_yaxis()  # top to bottom as in the table
        ax.set_xlim(0, data["dags"])
        ax.set_xlabel(f"random DAGs (of {data['dags']})")
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=4, frameon=False)

    return figure_of("Random DAGs: what each scheduler did with the same graphs", draw, size=(8, 4))


def plot(data: dict, path) -> bool:
    return save(figure(data), path)
