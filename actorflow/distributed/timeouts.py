"""``timeout=`` on Ray runs: a call still running is found by its deadline (``timeout``
seconds per piece of its batch, from when its inputs were computed and the calls queued
before it on its process had their time), a piece that took too long by its call's
record; either stops the run with ActorError(TimeoutError)."""

from __future__ import annotations

import time

from ..errors import ActorError


def wait_s(run):
    """Until the first deadline of a call on an actor with ``timeout=`` (None: none)."""
    ends = [e for e in run.deadline.values() if e is not None]
    return None if not ends else max(0.0, min(ends) - time.perf_counter())


def set_deadline(run, a, unit, r: int, ref, n: int) -> None:
    """The deadline of the call ``ref`` just sent for ``a`` on process ``r`` of its unit,
    over ``n`` pieces (None: ``a`` has no ``timeout=``)."""
    if a.timeout is None:
        run.deadline[ref] = None
    elif unit.is_async:  # (its calls run at once)
        run.deadline[ref] = time.perf_counter() + a.timeout * n
    else:  # (after the calls queued before it)
        run.deadline[ref] = max(time.perf_counter(), run.free_at[(unit, r)]) + a.timeout * n
        run.free_at[(unit, r)] = run.deadline[ref]


def timed_out(run, a, piece: int, took: float, node) -> None:
    """A piece's act took longer than ``timeout=`` (found in its call's record; a call
    still running is found by its deadline, ``overran``)."""
    _stop(
        a,
        piece,
        f"took {took:.3g} s on piece {piece}, longer than timeout="
        f"{a.timeout:g} s (on {run.plan.nodes.label_of_id(node)})",
    )


def overran(run) -> None:
    """A call ran past its deadline: ``timeout=`` seconds per piece of its batch, from
    when the call before it on that Ray actor ended (or it was sent)."""
    now = time.perf_counter()
    for ref, end in run.deadline.items():
        if end is not None and end <= now:
            a, j, r = run.pending[ref]
            first = j * run.plan.batch
            node = run.where[run.plan.unit_of[a]][r][1]
            last = first + run.lens.get(j, run.plan.batch) - 1
            _stop(
                a,
                first,
                f"took longer than timeout={a.timeout:g} s per piece on pieces "
                f"{first} to {last} (one Ray call, on {node})",
            )


def _stop(a, piece: int, said: str):
    e = TimeoutError(f"actor {a.name!r} {said}; its Ray actors are killed")
    err = ActorError(a.name, piece, e)
    err.__cause__ = e
    raise err
