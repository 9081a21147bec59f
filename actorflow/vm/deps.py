"""Orders instructions by operand access and by stream.

A blob's ``reads`` is None when no read is recorded since its last write.
A read waits for the last write of its blob; a write waits for the last write and for every
read issued since; an instruction waits for the one issued before it on its stream.
Callers hold the VM lock.
"""

from __future__ import annotations

_PRUNE_AT = 8


def record(instr) -> int:
    """Links ``instr`` after its unfinished predecessors; returns how many it waits for."""
    n = 0
    for b in instr.consts:
        w = b.last_write
        if w is not None and not w.done:
            w.dependents.append(instr)
            n += 1
        reads = b.reads
        if reads is None:
            b.reads = [instr]
            continue
        n_reads = len(reads)
        if n_reads >= _PRUNE_AT and not n_reads & (n_reads - 1):
            # prune finished reads at lengths 8, 16, 32...: amortized O(1) even when every
            # read is still pending (a tensor read by a long queue of ops)
            reads[:] = [r for r in reads if not r.done]
        reads.append(instr)
    for b in instr.muts:
        w = b.last_write
        if w is not None and not w.done:
            w.dependents.append(instr)
            n += 1
        if b.reads:
            for r in b.reads:
                if not r.done and r is not instr:
                    r.dependents.append(instr)
                    n += 1
            b.reads = None
        b.last_write = instr
    s = instr.stream
    t = s.tail
    if t is not None and not t.done:
        t.dependents.append(instr)
        t.next = instr
        n += 1
    s.tail = instr
    instr.pending = n
    return n


def first_error(instr):
    """The error of the first operand blob whose writer failed, or None."""
    return first_error_of(instr.consts, instr.muts)


def first_error_of(consts, muts):
    for b in consts:
        if b.error is not None:
            return b.error
    for b in muts:
        if b.error is not None:
            return b.error
    return None
