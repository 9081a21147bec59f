"""Orders instructions by operand access and by stream.

A blob's ``reads`` is None when no read is recorded since its last write.
A read waits for the last write of its blob; a write waits for the last write and for every
read issued since; an instruction waits for the one issued before it on its stream.

What "waits for" means depends on where the two run and what links them. On a device whose
driver orders the work itself (``Stream.launches_ahead``: cuda), an instruction may be issued as
soon as a predecessor is issued on a driver stream (``launched``) when both are on that
device and the link is the stream order or a blob in that device's memory: the device keeps
the order (the same driver stream: stream order; another stream: it waits on the event
recorded after the predecessor, on the device, never on the host). Such a predecessor is
kept in the later one's ``after``: its event waits when it is issued, and it completes only
once they completed. Every other link waits for the predecessor to complete, as on the CPU:
a predecessor on the host or on another device, and a link through a blob in host memory
even between two instructions of the same device (a copy to the host writes its blob from
a host function, after its instruction was issued; a copy from the host reads its blob on
the host when it is issued). A pair linked both ways waits for the completion, and the
predecessor is then not in ``after``. A RELEASE of a device blob is issued
once every use of the blob is issued: the device's caching allocator orders the block's
reuse after those uses (stream order, or events recorded at the free), as CUDA's
stream-ordered allocators do; it completes once they completed.

Callers hold the VM lock.
"""

from __future__ import annotations

from ..errors import InvalidInputError
from ..tensor.meta import contiguous_strides, numel
from .instruction import INPUTS, OUTPUTS

_PRUNE_AT = 8


def record(instr) -> int:
    """Links ``instr`` after its unfinished predecessors; returns how many it waits for
    (a predecessor already issued on the same launch-ahead device, linked by the stream or
    that device's memory, is not waited for: it goes to ``instr.after`` only)."""
    s = instr.stream
    after = None
    if s.launches_ahead:
        after = instr.after = []
    n = 0
    for b in instr.consts:
        w = b.last_write
        if w is not None and not w.done and (after is None or _behind(w, instr, after, b)):
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
        if w is not None and not w.done and (after is None or _behind(w, instr, after, b)):
            w.dependents.append(instr)
            n += 1
        if b.reads:
            for r in b.reads:
                if not r.done and r is not instr and (after is None or _behind(r, instr, after, b)):
                    r.dependents.append(instr)
                    n += 1
            b.reads = None
        b.last_write = instr
    t = s.tail
    if t is not None and not t.done:
        t.next = instr
        if after is None or _behind(t, instr, after):
            t.dependents.append(instr)
            n += 1
    s.tail = instr
    instr.pending = n
    return n


def _behind(pred, instr, after, blob=None) -> bool:
    """For a launch-ahead ``instr`` (``after``: its list): whether it must wait for
    unfinished ``pred`` to be issued or to complete (True: the caller links them), or may
    be issued now (``pred`` is issued on the same device already). ``blob``: the blob that
    links them (None: the stream order). A predecessor on the same device goes to ``after``
    unless the pair is linked through other memory (see the module doc): ``launched``
    releases at issue only the dependents whose ``after`` holds it."""
    backend = instr.stream.backend
    if pred.after is None or pred.stream.backend is not backend:
        return True  # on the host or another device: its completion
    if blob is not None and blob.backend is not backend:
        while pred in after:  # through host memory: its completion, for every
            after.remove(pred)  # link of the pair
        return True
    if pred not in after:
        deps = pred.dependents
        if deps and deps[-1] is instr:  # (linked above through host memory: record holds
            return True  #  the lock, so the last dependent is this one)
    after.append(pred)
    return pred.issued is None


def issued_uses(blob) -> bool:
    """Whether every unfinished use of ``blob`` is issued on a launch-ahead device, so its
    block may be freed now, stream-ordered (the device's caching allocator keeps the reuse
    after them), as a RELEASE issued then would (see the module doc)."""
    w = blob.last_write
    if w is not None and not w.done and w.issued is None:
        return False
    reads = blob.reads
    if reads:
        for r in reads:
            if not r.done and r.issued is None:
                return False
    return True


def launched(instr, ready) -> None:
    """``instr`` was issued on its device's driver stream: each dependent linked to it at
    issue (on the same launch-ahead device, by the stream or the device's memory: its
    ``after`` holds ``instr``, see ``record``) has one predecessor fewer, and goes to
    ``ready`` when it waits for nothing more; the others (host work, another device, a link
    through host memory) stay for ``instr``'s completion."""
    keep = []
    for d in instr.dependents:
        a = d.after
        if a is not None and instr in a:
            d.pending -= 1
            if d.pending == 0 and not d.done:
                ready.append(d)
        else:
            keep.append(d)
    instr.dependents = keep


def settled(stream, consts, muts) -> bool:
    """Whether work reading ``consts`` and writing ``muts`` on ``stream`` would wait for
    nothing: the stream's last instruction, every write of a read blob and every use of a
    written blob are done. The same rules as ``record``, for the inline path: work that waits
    for nothing may run at once and leave no record, since a finished instruction constrains
    no later one. (The records of finished uses of ``muts`` are dropped on the way.)"""
    t = stream.tail
    if t is not None and not t.done:
        return False
    for b in consts:
        w = b.last_write
        if w is not None and not w.done:
            return False
    for b in muts:
        if b.last_write is not None or b.reads is not None:  # (fresh outputs: none)
            if not b.idle():
                return False
            b.last_write = b.reads = None
    return True


# ``result`` of an instruction failed by ``failed_before``: its work ran whole on values that
# failed, so everything it wrote keeps the error (a compiled step's state too: its write-back
# ran, unlike a step that faulted, whose later commands the device skipped).
RAN_ON_FAILED = "ran on failed values"


def failed_before(instr):
    """For a device instruction about to complete without an error of its own: the error of
    a predecessor it was issued ahead of (in ``after``) that failed once ``instr`` was
    issued (an error known at completion: a zero flag, a fault the device did not pass on)
    and poisoned a blob ``instr`` reads or writes, else None. ``instr`` computed from those
    values, so it fails with that error, as on the CPU it would not have run (the caller
    sets its ``result`` to ``RAN_ON_FAILED``)."""
    after = instr.after
    if not after:
        return None
    for blobs in (instr.consts, instr.muts):
        for b in blobs:
            e = b.error
            if e is not None and not e.intact:
                for p in after:
                    if p.error is e:
                        return e
    return None


def first_error(instr):
    """The error of the first operand blob whose writer failed, or None. (An ``intact``
    error is only a note on a blob the failed op left as it was: it does not count.)"""
    return first_error_of(instr.consts, instr.muts)


def first_error_of(consts, muts):
    for b in consts:
        e = b.error
        if e is not None and not e.intact:
            return e
    for b in muts:
        e = b.error
        if e is not None and not e.intact:
            return e
    return None


def error_to_run(consts, muts, args):
    """``first_error_of`` for an op call about to run whole (not in a run): a poisoned blob
    that the call ``args`` overwrites entirely without reading it does not stop it, and is
    cleared here (the op gives it a value; if the op fails, that poisons it again). The
    caller uses the blob exclusively (the VM's ordering), so clearing it first is safe."""
    for b in muts:
        if b.error is not None and overwrites(b, args):
            b.error = None
    return first_error_of(consts, muts)


def overwrites(blob, args) -> bool:
    """True when the op call ``args`` (``(kernel, ins, outs, ...)``) writes every element of
    ``blob`` and reads none: no input is on it and an output covers all of it. (An op that
    does not read its output defines all of it: fill_, zero_, copy_, x[...] = v.)"""
    if args is None or type(args[OUTPUTS]) is not list:  # (a fresh kernel's args: new outputs)
        return False
    for i in args[INPUTS]:
        if i.blob is blob:
            return False
    for o in args[OUTPUTS]:
        if o.blob is blob:
            m = o.meta
            return (
                m.shape is not None
                and not m.offset
                and m.strides == contiguous_strides(m.shape)
                and numel(m.shape) * m.dtype.itemsize == blob.nbytes
            )
    return False


def wrote_nothing(e, muts, args) -> bool:
    """True when an op call that ran whole raised an InvalidInputError (it checks its inputs
    before writing) and every blob it writes is one it also reads: those keep their values,
    so the error is only noted on them (``intact``) instead of poisoning them. New outputs
    (not read by the op) have no value: a failure poisons them."""
    if not isinstance(e, InvalidInputError) or not muts or args is None:
        return False
    read = [i.blob for i in args[INPUTS]]
    for b in muts:
        if b not in read:
            return False
    return True
