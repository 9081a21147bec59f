"""Actors whose registers are device memory the host never reads (``cuda:N``).

A register on such a device holds one ``Tensor`` per array of its piece, made once over
the register's memory (``register_tensors``): what consumers read and what its producer
writes. Two kinds of actor write them, and both act on the run's loop, issuing device work
and awaiting it (``async`` acts: several in flight, up to their registers):

- ``CopyActor`` (``ActorGraph.copy``, a Pipeline's ``Copy(device)`` entry) copies a piece
  across the host boundary on the device's copy streams: host to device on ``h2d`` from the
  producer's cpu register, device to host on ``d2h`` into its own cpu register. The source
  register is read by the device when the stream gets there, so it is handed back only once
  the copy's event completed (the act ends then): no private staged copy, no host copy per
  piece; two registers per edge overlap one piece's copy with the next one's compute.
- ``DeviceStage`` (a stage whose input is on the device) calls its function with the
  input registers' tensors and stores the tensors it returns into its register by a copy
  on the device's compute stream (the VM's).
- ``DeviceSource`` (``ActorGraph.input`` or ``source`` with ``out=`` on the device) stores
  the device tensors its items hold into its register the same way.
- ``DeviceOpActor`` (``ActorGraph.op_program`` on inputs on the device) hands its input and
  output registers' tensors to a program that issues its work on the compute stream (a
  ``DeviceSteps``: ``nn.Graph.run``'s fused step, or one of its ops or state writers).

An act ends when the device work it issued completed: a copy's driver event
(``Event.then``, handed to the loop with ``call_soon_threadsafe``), a stage's VM
instructions (the VM completes them on their events; ``settled`` awaits them). So a
register sent on holds its values, and a register handed back was read completely: the
producer writes it again only then, with no event per register and no host wait.
``settled`` lives above the runtime (it waits on the VM): ``runtime_api`` hands it in.
"""

from __future__ import annotations

import asyncio
from typing import cast

import numpy as np

from ...backends import get_backend
from ...device import Device
from ...device import device as as_device
from ...errors import DeviceError, DTypeError, PlanError, ShapeError
from ...tensor.blob import Blob
from ...tensor.impl import TensorImpl
from ...tensor.meta import TensorMeta, contiguous_strides
from ...tensor.tensor import Tensor, wrap
from ..plan.registers import EOS
from ..plan.spec import NOTHING, PieceSpec, Spec, check_piece, flatten, unflatten
from ..sched.loop import run_on_graph_loop
from .actors import Actor, OpActor, StageActor
from .source import SourceActor, one_argument

_SETTLED: list = [None, None]  # awaiting / waiting for tensors' pending VM work


def use_settled(wait_async, wait) -> None:
    """Hands in ``wait_async(tensors)``, a coroutine awaiting every instruction issued so
    far that writes or reads those tensors' storage and raising the error that poisoned
    one, and ``wait(tensors)``, the same blocking and raising nothing (``runtime_api``)."""
    _SETTLED[:] = [wait_async, wait]


def release_registers(registers) -> None:
    """Before device registers are freed: waits for the VM work still using their tensors
    (a copy of the last piece out of a sink's register may be pending). Once per run."""
    tensors = [t for r in registers for t in r.arrays if isinstance(t, Tensor)]
    if tensors and _SETTLED[1] is not None:
        _SETTLED[1](tensors)


def device_memory(device) -> bool:
    """Whether ``device``'s arrays are device memory the host does not read (cuda)."""
    b = get_backend(device)
    return b.has_data and not b.host_memory


def register_tensor(array, spec: Spec) -> Tensor:
    """A tensor over one array of a register (``spec``'s shape, dtype and device), made
    once per register. Its storage is the register's: pinned, so the tensor's end never
    frees it (the plan does)."""
    blob = Blob(spec.device, get_backend(spec.device), spec.nbytes)
    blob.array, blob.owned, blob.allocated = array, False, True
    blob.pin()
    meta = TensorMeta(spec.shape, spec.dtype, spec.device, contiguous_strides(spec.shape), 0)
    return wrap(TensorImpl(meta, blob))


def register_arrays(arrays: list, spec: PieceSpec) -> list:
    """A register's arrays as actors use them: a tensor over each one on a device the host
    does not read (``register_tensor``), numpy arrays as they are."""
    out = []
    for a, s in zip(arrays, spec.specs, strict=True):
        if a is not None and not isinstance(a, np.ndarray):
            a = register_tensor(a, s)
        out.append(a)
    return out


def pinned_for(actor):
    """The device backend whose copies read or write ``actor``'s host registers (the
    producer of a copy to a device, a copy to the host), or None. Such registers are the
    driver's pinned host buffers: a copy from or to pageable memory would not be
    asynchronous on a GPU (the host thread would wait for it)."""
    if isinstance(actor, CopyActor):
        return None if actor.h2d else actor.backend
    for c in actor.consumers:
        if isinstance(c, CopyActor) and c.h2d:
            return c.backend
    return None


def placed_on(actors) -> object:
    """The device-memory device the registers of ``actors`` are on (None: the host's).
    Raises DeviceError when they are on two such devices, or mix one with the host's."""
    devs = {getattr(a, "device", None) for a in actors}
    if len(devs) <= 1:
        return next(iter(devs), None)
    names = ", ".join(f"{a.name!r} on {getattr(a, 'device', None) or 'cpu'}" for a in actors)
    raise DeviceError(
        f"the inputs {names} are on different devices; a stage reads all of "
        f"its inputs on one device: add g.copy(x, device) for the others"
    )


async def _reached(event) -> None:
    """Awaits a driver event (``Event.then`` posts to the loop: no polling); raises the
    recording stream's sticky error."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    event.then(lambda: loop.call_soon_threadsafe(_set, fut))
    await fut
    event.query()


def _set(fut) -> None:
    if not fut.done():
        fut.set_result(None)


async def _settled(tensors: list) -> None:
    fn = _SETTLED[0]
    if fn is None:
        raise DeviceError("device actors need actorflow's VM: import actorflow")
    await fn(tensors)


def _host_leaf(x) -> np.ndarray:
    """A host copy of one leaf of piece 0 (planning reads it once)."""
    if isinstance(x, Tensor):
        return np.array(x.numpy(), copy=True)
    return np.array(x, order="C", copy=True)


def device_leaves(actor, value, what: str, fix: str) -> list:
    """The tensors of ``value`` (what ``actor``, whose register is on ``actor.device``,
    stores), each checked to be on that device and, once the register is sized, of its
    shape and dtype. ``fix``: what to do about a leaf elsewhere (``{device}`` and ``{name}``
    filled in)."""
    leaves, structure = flatten(value)
    spec = actor.out_spec
    dev = actor.device
    if spec is not None and structure != spec.structure:
        check_piece(value, spec, what, actor.declared)  # raises, naming the difference
    for i, x in enumerate(leaves):
        # (a tensor's impl has its meta: None is for no Tensor's impl)
        on = cast(TensorMeta, x._impl.meta).device if isinstance(x, Tensor) else None
        if on is not dev:
            got = f"a tensor on {on}" if on is not None else f"a {type(x).__name__}"
            raise DeviceError(
                f"{what} returned {got} (array {i}), but its register is on "
                f"{dev}: " + fix.format(device=dev, name=str(dev))
            )
        if spec is not None:
            s, m = spec.specs[i], x._impl.meta
            if m.shape != s.shape:
                raise ShapeError(
                    f"{what} returned {m.dtype.name}{list(m.shape)} but its "
                    f"register holds {s.dtype.name}{list(s.shape)}; return "
                    f"the same shape for every piece, or declare "
                    f"out=af.Spec(...)"
                )
            if m.dtype is not s.dtype:
                raise DTypeError(
                    f"{what} returned {m.dtype.name}{list(m.shape)} but its "
                    f"register holds {s.dtype.name}{list(s.shape)}; cast it "
                    f"(.to(af.{s.dtype.name})) or declare out=af.Spec(...)"
                )
    return leaves


class CopyActor(Actor):
    """Copies each piece of ``src`` to ``device``: host to device on the device's ``h2d``
    stream into its device registers, or device to host on ``d2h`` into its cpu registers
    (see the module doc). Its register layout is its input's on the other device."""

    kind = "copy"
    is_async = True

    def __init__(self, name, src, device, **kw):
        super().__init__(name, [src], **kw)
        dev = as_device(device)
        here = getattr(src, "device", None)
        to_dev = device_memory(dev)
        if to_dev == (here is not None) or (not to_dev and dev.type != "cpu"):
            frm = here or "the host (cpu)"
            raise DeviceError(
                f"copy {name!r}: {src.name!r} is on {frm}, so a copy to {dev} crosses no "
                f"host boundary; copy host pieces to a device ('cuda:0') and device pieces "
                f"to 'cpu'"
            )
        self.target = dev
        self.device = dev if to_dev else None  # where its registers are (None: host)
        self.h2d = to_dev
        self.backend = get_backend(here or dev)  # the device's backend, either way

    def infer(self) -> None:
        spec = self.inputs[0].out_spec
        if spec is None or self.out_spec is not None:
            return
        if spec is NOTHING:
            self.out_spec = NOTHING
            return
        self.out_spec = PieceSpec(
            spec.structure, [Spec(s.shape, s.dtype, self.target) for s in spec.specs]
        )

    def needs_probe(self) -> bool:
        return False

    def probe(self, ins):
        self.infer()
        leaves, _ = flatten(ins[0])
        return [_host_leaf(x) for x in leaves]

    async def compute_async(self, piece, ins, outs):
        _planned(outs, f"copy {self.name!r}")
        b = self.backend
        caching = b.caching()
        src = self.cached.pop(piece, None)
        if src is None:
            src, _ = flatten(ins[0])
        if self.h2d:
            await _settled([t for t in outs if t is not None])  # reads of the last piece
            stream = b.driver_stream(b.stream("h2d"))
            for dst, x in zip(outs, src, strict=True):
                if dst is None:
                    continue
                block = dst._impl.blob.array
                stream.copy_h2d(block.darray, np.ascontiguousarray(x))
                caching.record_stream(block.block, stream)
        else:
            stream = b.driver_stream(b.stream("d2h"))
            for dst, x in zip(outs, src, strict=True):
                if dst is None:
                    continue
                if isinstance(x, np.ndarray):  # piece 0, computed while planning
                    np.copyto(dst, x, casting="no")
                    continue
                block = x._impl.blob.array
                stream.copy_d2h(dst, block.darray)
                caching.record_stream(block.block, stream)
        await _reached(stream.record())
        return None

    def describe(self) -> str:
        return f"copy to {self.target}"


class DeviceStage(StageActor):
    """A stage on ``device``: ``fn(*pieces)`` gets its inputs' register tensors (read-only:
    writing one is refused) and returns tensors on ``device``, which are copied into its
    register on the device's compute stream. Its act ends when that copy and every read of
    its inputs completed on the device."""

    def __init__(self, name, fn, inputs, device, **kw):
        super().__init__(name, fn, inputs, **kw)
        if self.replicas > 1:
            raise ValueError(
                f"actor {name!r}: replicas= is for stages on threads; a stage on "
                f"{device} issues its work from the loop and has as many acts in "
                f"flight as registers (buffers=)"
            )
        self.device = device
        self.fn_async = self.is_async
        self.is_async = True
        if self.out_spec is not None:  # out=af.Spec(shape, dtype): on the stage's device
            self.out_spec = PieceSpec(
                self.out_spec.structure,
                [
                    Spec(s.shape, s.dtype, device) if s.device.type == "cpu" else s
                    for s in self.out_spec.specs
                ],
            )

    async def _value(self, ins):
        if self.fn_async:
            return await self._call_async(ins)
        return self._call(ins)

    def probe(self, ins):
        # piece 0 while planning: its inputs' host values, put on the device
        dev = str(self.device)
        ins = [
            unflatten(s, [wrap_host(x).to(dev) if isinstance(x, np.ndarray) else x for x in leaves])
            for leaves, s in (flatten(i) for i in ins)
        ]
        value = run_on_graph_loop(self._call_async(ins)) if self.fn_async else self._call(ins)
        self._leaves(value, 0)
        return self._checked_leaves(value, f"actor {self.name!r} (piece 0)")

    def _device(self):
        return self.device

    def _leaves(self, value, piece: int) -> list:
        return device_leaves(
            self,
            value,
            f"actor {self.name!r} (piece {piece})",
            "a stage on {device} returns tensors on it; compute from its "
            "inputs (they are {device} tensors), or move the value with "
            ".to({name!r})",
        )

    async def compute_async(self, piece, ins, outs):
        _planned(outs, f"actor {self.name!r}")
        if await _stored_cached(self, piece, outs):
            return None
        read = [t for i in ins for t in flatten(i)[0] if isinstance(t, Tensor)]
        writes = [t._impl.blob.last_write for t in read]  # (a write in place replaces it)
        leaves = self._leaves(await self._value(ins), piece)
        for dst, x in zip(outs, leaves, strict=True):
            if dst is not None:
                dst.copy_(x)
        await _settled(list(outs) + read)
        for t, w in zip(read, writes, strict=True):
            if t._impl.blob.last_write is not w:
                raise ValueError(
                    f"actor {self.name!r} (piece {piece}) wrote into an input in place, and "
                    f"its inputs are read-only: they are the producers' registers (other "
                    f"actors read them too); compute a new tensor (x = x * 2, not x.mul_(2)) "
                    f"or clone what you change (x = x.clone())"
                )
        return None

    def describe(self) -> str:
        return f"stage on {self.device} {getattr(self.fn, '__name__', type(self.fn).__name__)}"


class DeviceSource(SourceActor):
    """A source whose register is on ``device``: each item holds tensors on it (a fed
    ``run(feed=...)`` of device tensors, ``nn.Graph.run`` over cuda batches), stored into
    its register by a copy on the device's compute stream; its act ends when that copy
    completed. Its layout is declared (``out=``): a device register is sized before the
    run."""

    def __init__(self, name, source, device, **kw):
        super().__init__(name, source, **kw)
        if self.out_spec is None:
            raise PlanError(
                f"source {name!r} on {device}: give out=af.Spec(..., "
                f"device={str(device)!r}) (a device register is sized before the "
                f"run, never from piece 0)"
            )
        self.device = device
        self.is_async = True
        self.items_async = False

    def start(self) -> None:
        if self.it is None:
            super().start()
            self.items_async = self.is_async
            self.is_async = True

    def needs_probe(self) -> bool:
        return False

    async def compute_async(self, piece, ins, outs):
        _planned(outs, f"source {self.name!r}")
        try:
            value = await self.it.__anext__() if self.items_async else next(self.it)
        except (StopIteration, StopAsyncIteration):
            return EOS
        if self.single_argument:
            value = one_argument(value)
        leaves = device_leaves(
            self,
            value,
            self._what(piece),
            "give tensors on {device} (af.tensor(x, device={name!r})), or "
            "host arrays to a source on the host followed by a copy "
            "(g.copy(src, {name!r}))",
        )
        for dst, x in zip(outs, leaves, strict=True):
            if dst is not None:
                dst.copy_(x)
        await _settled(outs)
        return None

    def describe(self) -> str:
        return f"source on {self.device}"


class DeviceOpActor(OpActor):
    """An op actor whose registers are on ``device``: its program (``DeviceSteps``) issues
    one piece's work on the device's compute stream reading its input registers' tensors
    and writing its output register's; the act ends when that work completed (awaited on
    the VM's completion of it: no host wait). A program that writes state across pieces
    acts one piece at a time (``acts_at_once``), so that a piece that failed stops the
    next, as on the host."""

    is_async = True

    def __init__(self, name, inputs, program, device, **kw):
        if not hasattr(program, "submit"):
            raise PlanError(
                f"op actor {name!r}: its inputs are on {device}, but its program "
                f"{getattr(program, 'name', program)!r} runs on the host; an op actor on a "
                f"CUDA device runs a program compiled for it (tracing.device.DeviceSteps, "
                f"what nn.Graph.run makes there); copy its inputs to the host first "
                f"(g.copy(x, 'cpu'))"
            )
        super().__init__(name, inputs, program=program, **kw)
        self.device = device
        self.acts_at_once = 1 if getattr(program, "writes_state", False) else 1 << 30

    def probe(self, ins):
        # piece 0 while planning (the graph reads piece 0 through every actor): its inputs'
        # host values put on the device, the program run, its outputs read back
        self.infer()
        dev = str(self.device)
        read = [[x if isinstance(x, Tensor) else wrap_host(x).to(dev) for x in i] for i in ins]
        outs = [wrap(TensorImpl.new(s.shape, s.dtype, s.device)) for s in self.out_spec.specs]
        self.program.submit(outs, read)
        return [_host_leaf(t) for t in outs]

    async def compute_async(self, piece, ins, outs):
        _planned(outs, f"op actor {self.name!r}")
        if await _stored_cached(self, piece, outs):
            return None
        self.program.submit(list(outs), ins)
        await _settled(list(outs) + [t for i in ins for t in i])
        return None


DEVICE_ACTORS = (CopyActor, DeviceStage, DeviceSource, DeviceOpActor)  # (planned first)


def _planned(outs, what: str) -> None:
    """Raises DeviceError when a device actor acts with no register (``outs`` None)."""
    if outs is None:
        raise DeviceError(
            f"{what}: its registers are not allocated; a graph with device "
            f"actors is planned before it runs"
        )


async def _stored_cached(actor, piece: int, outs: list) -> bool:
    """Piece 0 computed while planning (host arrays), if ``actor`` has it: copied into its
    device register ``outs``; True then."""
    cached = actor.cached.pop(piece, None)
    if cached is None:
        return False
    for dst, x in zip(outs, cached, strict=True):
        if dst is not None:
            dst.copy_(wrap_host(x).to(str(actor.device)))
    await _settled(outs)
    return True


def wrap_host(array: np.ndarray) -> Tensor:
    """A cpu tensor over a host array (planning's piece 0), put on a device with ``.to``."""
    array = np.asarray(array, order="C")  # (0-d stays 0-d)
    spec = Spec(array.shape, array.dtype, "cpu")
    return register_tensor(array, spec)


class Copy:
    """A Pipeline entry that copies each piece to ``device``: ``Copy("cuda:0")`` from the
    host to a device, ``Copy("cpu")`` back (see ``ActorGraph.copy``). The stages after a
    copy to a device run there: they get and return tensors on it.

    Example::

        pipe = af.Pipeline([batches, af.Copy("cuda:0"), lambda x: (x * 2).sum(1),
                            af.Copy("cpu")], buffers=2, memory={"cuda:0": "64MiB"})
    """

    __slots__ = ("device",)

    def __init__(self, device: str | Device) -> None:
        self.device = as_device(device)

    def __repr__(self) -> str:
        return f"Copy({str(self.device)!r})"
