"""The checks of what a user gives an actor or a graph: ``buffers``, ``resources``, ``time``.
Each refuses what cannot be right with the reason and the fix."""

from __future__ import annotations

import math
import numbers

from ...errors import PlanError

MAX_BUFFERS = 1024
"""Registers per output at most: each is a buffer of its own, and credits beyond the pieces
that can be in flight at once only sit idle."""


def check_buffers(n, who: str):
    """``buffers=`` as given for ``who``: an int from 1 to MAX_BUFFERS, or "auto" (chosen
    for throughput under the budget when the plan is made: ``autotune.py``)."""
    if n == "auto":
        return n
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise PlanError(
            f"{who}: buffers must be an int >= 1 (registers per output; 2 gives "
            f'double buffering) or "auto", got {n!r}'
        )
    if n > MAX_BUFFERS:
        raise PlanError(
            f"{who}: buffers={n} registers per output is more than the "
            f"{MAX_BUFFERS} a run can use (a register is a buffer of its own, "
            f"and credits beyond the pieces in flight sit idle); use 2 to "
            f"{MAX_BUFFERS}"
        )
    return n


def check_resources(resources, name: str) -> dict:
    out = {}
    for res, n in dict(resources or {}).items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise PlanError(
                f"actor {name!r}: resources={{{res!r}: {n!r}}}: an actor takes a "
                f"whole number >= 1 of each resource it names (leave out those "
                f"it does not take)"
            )
        out[res] = n
    return out


def check_time(t, name: str):
    if t is None or callable(t):
        return t
    return seconds(t, f"actor {name!r}: time=", "")


def seconds(t, what: str, where: str) -> float:
    """Simulated seconds: a finite number >= 0 (an act must end)."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise TypeError(
            f"{what} {t!r}{where}: give seconds as a number >= 0 (or a function "
            f"of the piece returning one)"
        )
    seconds = float(t)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{what} {t!r}{where}: an act takes a finite number of seconds >= 0")
    return seconds


def positive_seconds(t, what: str, meaning: str, fix: str) -> float:
    """A time limit: a finite number of seconds > 0 (0 or less would expire at once).
    ``what`` names the argument (``"timeout="``), ``meaning`` says what the seconds bound,
    ``fix`` what to give instead."""
    if isinstance(t, bool) or not isinstance(t, numbers.Real):
        raise TypeError(f"{what}{t!r}: {meaning} are a number > 0, not a {type(t).__name__}; {fix}")
    s = float(t)
    if not math.isfinite(s) or s <= 0:
        raise ValueError(f"{what}{t!r}: {meaning} must be a finite number > 0; {fix}")
    return s


def check_timeout(timeout, inline, name: str):
    """``timeout=``: finite seconds > 0 one act may take, for an actor on a thread or a task
    (an inline act holds the loop, so nothing could notice it running late)."""
    if timeout is None:
        return None
    t = positive_seconds(
        timeout,
        f"actor {name!r}: timeout=",
        "the seconds one act may take",
        "give e.g. timeout=30, or None for no limit",
    )
    if inline:
        raise ValueError(
            f"actor {name!r}: timeout= needs an actor on a thread; an inline act "
            f"runs on the scheduler's loop and cannot be timed out while it runs"
        )
    return t


def check_replicas(replicas, name: str, inline, timeout) -> int:
    """Threads a stage acts on (1 to 64): its acts overlap, and leave in piece order."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= 64:
        raise ValueError(f"actor {name!r}: replicas must be an int from 1 to 64, got {replicas!r}")
    if replicas > 1 and inline:
        raise ValueError(
            f"actor {name!r}: replicas= runs the stage on several threads; an "
            f"inline stage acts on the scheduler's loop; drop inline=True"
        )
    if replicas > 1 and timeout is not None:
        raise ValueError(
            f"actor {name!r}: timeout= with replicas= is not supported yet; use one or the other"
        )
    return replicas
