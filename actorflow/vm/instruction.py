"""Instruction: a unit of work for the VM, with the blobs it reads and writes and its stream."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, NamedTuple


class Access(enum.IntEnum):
    """How an instruction uses a blob: read it (CONST), write it (MUT), or write it with a
    shape known only after compute (MUT2: consumers must wait for compute to learn it)."""

    CONST = 0
    MUT = 1
    MUT2 = 2


class Operand(NamedTuple):
    blob: object
    access: Access


OP_CALL = "op_call"
ACCESS = "access_blob_by_callback"
RELEASE = "release"

# An OP_CALL's ``args``: a plain tuple (the per-op path builds one per call, and a tuple
# literal is the cheapest thing to build), read by these names, never by bare numbers:
# ``(kernel, inputs, outputs, attrs, dynamic, name)``: the kernel, the input TensorImpls,
# the output TensorImpls, the attrs dict, whether the outputs' shapes are known only after
# compute (their blobs are also the instruction's ``mut2``), the op's name.
KERNEL, INPUTS, OUTPUTS, ATTRS, DYNAMIC, NAME = range(6)


class Named:
    """What a kernel error names when no Instruction was made (the inline path): an op's
    name and its stream."""

    __slots__ = ("name", "stream")

    def __init__(self, name, stream):
        self.name, self.stream = name, stream


class Split:
    """What an instruction's ``split`` is: ``split(instr, n, first_share)`` cuts it into
    ``n`` callables run on the workers (the first, ``first_share`` of the work, may run on
    the loop thread); ``planner(head)`` starts planning a run of queued instructions led by
    ``head`` (``vm/runs.py``), or returns None when it cannot lead one."""

    __slots__ = ()

    def __call__(self, instr, n: int, first_share: float = 0.0) -> list:
        raise NotImplementedError

    def planner(self, head):
        return None


class Instruction:
    """One instruction. ``run(instr)`` does its work on the thread the VM picks; ``cost`` (in
    elements) lets the VM run tiny ones inline and split large ones across cores.

    Dependence fields are owned by the VM: ``pending`` counts unfinished predecessors,
    ``dependents`` are the instructions waiting on this one. On a launch-ahead device
    (``deps.py``): ``after`` lists the predecessors on the same device it may be issued
    ahead of (None elsewhere), ``issued`` is ``(driver stream, event)`` once its work is
    issued there, until it completes.
    """

    __slots__ = (
        "kind",
        "name",
        "stream",
        "consts",
        "muts",
        "mut2",
        "run",
        "args",
        "cost",
        "split",
        "pending",
        "dependents",
        "done",
        "error",
        "waiters",
        "result",
        "next",
        "after",
        "issued",
    )

    def __init__(
        self,
        kind: str,
        name: str,
        stream,
        consts: tuple,
        muts: tuple,
        run,
        args,
        cost: int = 0,
        mut2: tuple = (),
        split=None,
    ):
        self.kind = kind
        self.name = name
        self.stream = stream
        self.consts = consts  # blobs read
        self.muts = muts  # blobs written (MUT2 ones are in mut2 too)
        self.mut2 = mut2
        self.run = run
        self.args = args
        self.cost = cost
        self.split = split  # a Split, or None: the instruction runs whole
        self.pending = 0
        self.dependents: list[Instruction] = []
        self.done = False
        self.error = None
        self.waiters: list[Callable[[], object]] | None = None  # called once it completed
        self.result: Any = None  # what its kernel returned (or RAN_ON_FAILED)
        self.next = None  # the instruction issued after this one on its stream
        self.after: list[Instruction] | None = None  # (device work: see deps.py)
        self.issued: tuple | None = None  # (device work) its (driver stream, event)

    @property
    def operands(self) -> list:
        """Every (blob, Access) pair of this instruction, for inspection."""
        out = [Operand(b, Access.CONST) for b in self.consts]
        out += [Operand(b, Access.MUT2 if b in self.mut2 else Access.MUT) for b in self.muts]
        return out

    def __repr__(self) -> str:
        state = (
            "done"
            if self.done
            else "issued"
            if self.issued is not None
            else f"pending={self.pending}"
        )
        return f"Instruction({self.kind} {self.name!r} on {self.stream}, {state})"
