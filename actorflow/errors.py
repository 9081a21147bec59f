"""Every exception actorflow raises. Each message names the values involved and the fix."""

from __future__ import annotations

import decimal
import traceback
import warnings


class ActorflowError(Exception):
    """Base class of all actorflow errors."""


class DeviceError(ActorflowError, RuntimeError):
    """Tensors on different devices, an unknown device, or a backend that is not available."""


class KernelCompileError(DeviceError):
    """A generated CUDA kernel that NVRTC does not compile: the message has the kernel's
    name, NVRTC's log (with the line) and the numbered source."""


class ShapeError(ActorflowError, ValueError):
    """Shapes that do not fit the op (broadcasting, matmul, reshape, indexing)."""


class DTypeError(ActorflowError, TypeError):
    """A dtype the op does not accept, or a result that cannot be cast to an in-place output."""


class OutOfMemoryError(ActorflowError, MemoryError):
    """An allocation would exceed a device's byte budget, the system refused it, or its size
    is impossible (``impossible``: more bytes, or a longer dimension, than any array can have).

    Attributes: ``device``, ``requested``, ``in_use`` and ``budget`` (bytes), ``impossible``.
    """

    impossible = False

    def __init__(
        self,
        device: str,
        requested: int,
        in_use: int,
        budget: int,
        what: str = "",
        impossible: str = "",
        reason: str = "",
    ) -> None:
        self.device, self.requested, self.in_use, self.budget = device, requested, in_use, budget
        self._made_of = (device, requested, in_use, budget, what, impossible, reason)
        who = f" for {what}" if what else ""
        if impossible:  # what was asked for, e.g. "a tensor of shape ... and dtype ..."
            self.impossible = True
            super().__init__(
                f"{device}: impossible allocation{who}: {impossible} "
                f"({requested:,} bytes, {format_bytes(requested)}{reason}): no "
                f"array can have that size or shape on any machine; check the "
                f"shape (a size computed wrongly?) and use smaller tensors"
            )
            return
        if not budget:  # the system itself refused
            super().__init__(
                f"{device}: out of memory{who}: the system could not provide "
                f"{format_bytes(requested)} ({format_bytes(in_use)} in use by "
                f"actorflow); free tensors or use smaller ones"
            )
            return
        super().__init__(
            f"{device}: out of memory{who}: asked for {format_bytes(requested)}, "
            f"{format_bytes(in_use)} in use of a {format_bytes(budget)} budget "
            f"({format_bytes(max(budget - in_use, 0))} free); free tensors you no longer need "
            f"or raise the budget with actorflow.lowlevel.set_memory_budget({device!r}, ...)"
        )

    def __reduce__(self):
        return (OutOfMemoryError, self._made_of)


class KernelError(ActorflowError, RuntimeError):
    """A kernel failed while running. It surfaces at the next sync point (``numpy()``,
    ``synchronize()``...) and on every tensor computed from the failed op's outputs.

    Attributes: ``op`` (the op's name), ``device``, ``original`` (the exception raised) and
    ``intact`` (the op wrote nothing, and the tensors it writes in place keep their values:
    see InvalidInputError; the error is then noted on them, not poisoning them);
    ``note`` (what the message says in brackets instead of the default, e.g. where the op
    stands in a compiled step) and ``step`` (that op's position in a compiled program, or
    None). On the error ``synchronize()`` raises, ``more_errors`` counts the other kernel errors
    since the last synchronize that it did not raise, and ``dropped_errors`` how many of
    those were not kept (the VM keeps the first ``actorflow.vm.sync.MAX_KEPT_ERRORS``).
    """

    _reported = False  # raised to the user once (then never again)
    intact = False  # the op wrote nothing: see InvalidInputError
    more_errors = dropped_errors = 0
    _dropped_in = None  # the VM's tally of dropped errors, if this one is counted
    _kinds: tuple = ()  # (kind, subclass) pairs: see of_kind
    step: int | None = None  # the op's position in a compiled program
    actor: str  # (a traced step's replay sets it: the op actor that raised it)

    def __new__(
        cls, op: str, device: str, original: BaseException, intact: bool = False, note: str = ""
    ):
        return super().__new__(of_kind(cls, original))

    def __init__(
        self, op: str, device: str, original: BaseException, intact: bool = False, note: str = ""
    ) -> None:
        self.op, self.original = op, original
        self.intact, self.note = intact, note
        take_kind(self, original)
        self.device = device
        self.kernel_traceback = ""  # the kernel's traceback, as text
        what = note or (
            (
                "nothing was written: the tensors it writes in place keep their values"
                if intact
                else "tensors computed from its outputs raise this error too"
            )
            + "; other work goes on"
        )
        Exception.__init__(
            self, f"op '{op}' failed on {device}: {type(original).__name__}: {original} ({what})"
        )

    @classmethod
    def of(
        cls, op: str, device: str, original: BaseException, intact: bool = False, note: str = ""
    ) -> KernelError:
        """The error for a kernel that raised ``original``: its traceback is kept as text
        only (``kernel_traceback``) and taken off ``original`` and the errors it was raised
        from, whose frames hold the kernel's arguments and would pin their memory for as
        long as the error lives."""
        err = cls(op, device, original, intact, note)
        err.kernel_traceback = "".join(
            traceback.format_exception(type(original), original, original.__traceback__)
        )
        e: BaseException | None = original
        seen = set()
        while e is not None and id(e) not in seen:  # (and of the errors it was raised from)
            seen.add(id(e))
            e.__traceback__ = None
            e = e.__cause__ or e.__context__
        err.__cause__ = original
        return err

    def to_raise(self, more_errors: int = 0, dropped_errors: int = 0, kept: int = 0) -> KernelError:
        """A copy to raise at a sync point. The runtime keeps this one; raising the copy
        keeps the caller's frames (and the tensors they hold) off the stored error.
        ``more_errors``/``dropped_errors``: see the class doc (synchronize sets them);
        ``kept``: how many errors the VM keeps."""
        self._reported = True
        tally = self.__dict__.pop("_dropped_in", None)  # (atomic: counted off once)
        if tally is not None:
            tally.reported_one()
        err = KernelError(self.op, self.device, self.original, self.intact, self.note)
        err.kernel_traceback, err.step = self.kernel_traceback, self.step
        err._reported = True
        err.__cause__ = self.original
        if more_errors:
            err.more_errors, err.dropped_errors = more_errors, dropped_errors
            s = "s" if more_errors != 1 else ""
            note = (
                f"{more_errors} more kernel error{s} since the last synchronize "
                f"{'were' if s else 'was'} not raised"
            )
            if dropped_errors:
                note += (
                    f"; {dropped_errors} of them {'were' if dropped_errors != 1 else 'was'}"
                    f" dropped unreported (the VM keeps the first {kept} between "
                    f"synchronize calls)"
                )
            err.args = (f"{err.args[0]}\n({note}; synchronize more often to see each one)",)
        return err

    def __reduce__(self):
        return (
            KernelError,
            (self.op, self.device, self.original, self.intact, self.note),
            self.__dict__,
        )


class InvalidInputError(ActorflowError):
    """Raised by a kernel that checked its inputs' values before writing anything and found
    them invalid. The op wrote nothing, so (when it ran whole, not cut into slices) the
    tensors it writes in place keep their values and stay usable: the error is reported
    once, at their next read or at ``synchronize()``. Its new outputs have no value and
    raise it, as after any kernel error. (Large elementwise ops cut into slices, across
    workers or in a run, may have written other slices: then every output is poisoned.)"""


class IndexOutOfBoundsError(InvalidInputError, IndexError):
    """An index tensor holds an index out of the bounds of the dimension it indexes."""


class DivisionByZeroError(InvalidInputError, ZeroDivisionError, RuntimeError):
    """Integer floor division or remainder by zero (PyTorch raises RuntimeError
    'ZeroDivisionError'; this is both). Float division by zero gives inf/nan instead."""


class VMError(ActorflowError, RuntimeError):
    """Misuse of the virtual machine, e.g. waiting for a result from inside a kernel."""


def format_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    size: float = int(n)  # (an int, then the float n / 1024**k)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def parse_bytes(value) -> int:
    """Bytes from an int or a string: IEC units are powers of 1024 (``'64MiB'``, ``'2 GiB'``),
    SI units powers of 1000 (``'512KB'``, ``'1e6'``, ``'3B'``); a bare ``k``/``m``/``g`` is
    refused as ambiguous, and so is a fractional byte count (``'1.7B'``)."""
    if isinstance(value, bool):
        raise TypeError(f"expected a byte count, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a byte count must be >= 0, got {value}")
        return value
    if isinstance(value, float) and value.is_integer() and 0 <= value < 2**63:
        return int(value)
    if not isinstance(value, str):
        raise TypeError(f"expected a byte count as an int or a string like '64MiB', got {value!r}")
    units = {
        "": 1,
        "b": 1,
        "kb": 10**3,
        "mb": 10**6,
        "gb": 10**9,
        "tb": 10**12,
        "kib": 2**10,
        "mib": 2**20,
        "gib": 2**30,
        "tib": 2**40,
    }
    text = value.strip().lower().replace(" ", "")
    i = len(text)
    while i > 0 and text[i - 1].isalpha():
        i -= 1
    number, unit = text[:i], text[i:]
    if unit in ("k", "m", "g", "t") and number:
        raise ValueError(
            f"{value!r}: a bare {unit!r} could mean 1000 or 1024; write "
            f"{number}{unit.upper()}iB (IEC, powers of 1024) or "
            f"{number}{unit.upper()}B (SI, powers of 1000)"
        )
    if unit not in units or not number:
        raise ValueError(
            f"cannot read {value!r} as a byte count; write e.g. 4096, '64MiB' or '2GiB'"
        )
    try:
        amount = decimal.Decimal(number) * units[unit]
    except decimal.InvalidOperation:
        raise ValueError(
            f"cannot read {value!r} as a byte count; write e.g. 4096, '64MiB' or '2GiB'"
        ) from None
    if not amount.is_finite() or amount >= 2**63:
        raise ValueError(f"{value!r} is more bytes than any device has (at most 2**63 - 1)")
    if amount < 0:
        raise ValueError(f"a byte count must be >= 0, got {value!r}")
    if amount != amount.to_integral_value():
        raise ValueError(f"{value!r} is not a whole number of bytes ({amount} B)")
    return int(amount)


class PlanError(ActorflowError, ValueError):
    """An actor graph cannot be planned: its registers do not fit a device budget, a stage's
    output cannot be sized, or the graph is malformed. Raised when the plan is built, before
    anything runs.

    Attributes: ``device``, ``needed`` and ``budget`` (bytes; None when not a memory refusal),
    ``actors`` (``{name: bytes}`` on that device) and ``fitting_buffers`` (the largest uniform
    ``buffers`` that fits, or None when even one register per output does not).
    """

    def __init__(
        self,
        message: str,
        device: str | None = None,
        needed: int | None = None,
        budget: int | None = None,
        actors: dict | None = None,
        fitting_buffers: int | None = None,
    ) -> None:
        self.device, self.needed, self.budget = device, needed, budget
        self.actors = dict(actors or {})
        self.fitting_buffers = fitting_buffers
        super().__init__(message)


class ActorError(ActorflowError, RuntimeError):
    """An actor's work raised. The run stops; every register is freed.

    Attributes: ``actor`` (its name), ``piece`` (the piece's index, or None when the error was
    not tied to one), ``original`` (the exception raised; also ``__cause__``) and
    ``actor_traceback`` (the original traceback as text, included in the message).
    """

    node: str  # set when it ran on a Ray node (distributed/rayplan.py): the node
    _kinds: tuple = ()  # (kind, subclass) pairs: see of_kind

    def __new__(
        cls, actor: str, piece: int | None, original: BaseException, actor_traceback: str = ""
    ) -> ActorError:
        return super().__new__(of_kind(cls, original))

    def __init__(
        self, actor: str, piece: int | None, original: BaseException, actor_traceback: str = ""
    ) -> None:
        self.actor, self.piece, self.original = actor, piece, original
        take_kind(self, original)
        self.actor_traceback = actor_traceback
        where = f"piece {piece}" if piece is not None else "its setup"
        text = (
            f"actor '{actor}' failed on {where}: {type(original).__name__}: {original}"
            f"\n(the run was stopped; each register is freed once no running act uses it)"
        )
        if actor_traceback:
            text += "\n\nOriginal traceback:\n" + actor_traceback.rstrip()
        Exception.__init__(self, text)

    def __reduce__(self):
        return (ActorError, (self.actor, self.piece, self.original, self.actor_traceback))


# -- an error about another one is also of its kind -------------------------------------------
# A kernel or an actor that failed for lack of memory, on an index out of bounds or on an
# integer division by zero raises KernelError or ActorError (naming the op or the actor),
# and that error is also an OutOfMemoryError, an IndexOutOfBoundsError (an IndexError) or a
# DivisionByZeroError: ``except af.OutOfMemoryError`` (or ``pytest.raises``) catches the
# fault however it was run, eagerly, in a compiled step or in an actor graph.


class KernelOutOfMemoryError(KernelError, OutOfMemoryError):
    """A kernel that failed for lack of memory (``requested``, ``in_use``, ``budget`` and
    ``impossible`` are the allocation's)."""


class KernelIndexOutOfBoundsError(KernelError, IndexOutOfBoundsError):
    """A kernel that failed on an index out of bounds."""


class KernelDivisionByZeroError(KernelError, DivisionByZeroError):
    """A kernel that failed on an integer division by zero."""


class ActorOutOfMemoryError(ActorError, OutOfMemoryError):
    """An actor whose work failed for lack of memory (the allocation's numbers as on
    KernelOutOfMemoryError)."""


class ActorIndexOutOfBoundsError(ActorError, IndexOutOfBoundsError):
    """An actor whose work failed on an index out of bounds."""


class ActorDivisionByZeroError(ActorError, DivisionByZeroError):
    """An actor whose work failed on an integer division by zero."""


KernelError._kinds = (
    (OutOfMemoryError, KernelOutOfMemoryError),
    (IndexOutOfBoundsError, KernelIndexOutOfBoundsError),
    (DivisionByZeroError, KernelDivisionByZeroError),
)
ActorError._kinds = (
    (OutOfMemoryError, ActorOutOfMemoryError),
    (IndexOutOfBoundsError, ActorIndexOutOfBoundsError),
    (DivisionByZeroError, ActorDivisionByZeroError),
)


def of_kind(cls: type[KernelError] | type[ActorError], original: BaseException) -> type:
    """The class an error of class ``cls`` about ``original`` is made as: the subclass of
    ``cls`` that is also ``original``'s kind of fault, or ``cls`` itself."""
    for kind, sub in cls._kinds:
        if isinstance(original, kind):
            return sub if issubclass(sub, cls) else cls
    return cls


def take_kind(err: Exception, original: BaseException) -> None:
    """Copies the numbers an out-of-memory ``original`` carries onto ``err`` (a kernel's or
    an actor's error of that kind)."""
    if isinstance(err, OutOfMemoryError) and isinstance(original, OutOfMemoryError):
        err.device, err.requested = original.device, original.requested
        err.in_use, err.budget = original.in_use, original.budget
        err.impossible = original.impossible


class TraceError(ActorflowError, RuntimeError):
    """Something a traced function did cannot be recorded: reading a traced tensor's values,
    an in-place op on one, or an op whose output shape depends on values."""


class DeadlockError(ActorflowError, RuntimeError):
    """Nothing can progress: every waiting party waits for another. ``cycle`` lists the
    wait-for cycle as ``(waiter, waited_for, reason)`` triples; the message says it in words.
    """

    def __init__(self, message: str, cycle: list) -> None:
        self.cycle = list(cycle)
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.cycle))


def add_note(exc: BaseException, note: str) -> None:
    """``note`` added to ``exc`` (``BaseException.add_note``, Python 3.11+; on 3.10, where
    an error holds no notes, said as a RuntimeWarning): a second error met while the first
    goes on."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:
        warnings.warn(note, RuntimeWarning, stacklevel=3)
