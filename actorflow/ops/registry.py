"""OpDef: one op's name, inputs/outputs, attrs, inference, kernels per device and grad rule.

``infer(metas, attrs)`` returns one ``(shape, dtype)`` per output from the inputs'
TensorMetas; it raises ShapeError/DTypeError with a message naming the op and the fix.
A kernel is ``kernel(outs, ins, attrs)``: it writes into the preallocated numpy arrays
``outs`` from ``ins``. A ``dynamic`` op's output shapes are known only after compute: its
kernel returns the output arrays instead (the VM writes them with Access.MUT2). A
``host_only`` op's kernel needs numpy arrays: a CUDA device runs it on host copies.

``fresh`` kernels are an optional fast form for single-output ops: ``fresh(ins, attrs,
dtype)`` returns a new array of the inferred shape in numpy ``dtype`` (numpy allocates it).
The eager interpreter uses one for a small output run on the spot, where allocating first
would cost more than the kernel; it must compute exactly what the kernel computes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import DeviceError

NO_MEMO = (None, None, None, None)  # an op's dispatch memo before its first call


@dataclass(frozen=True, eq=False)
class OpDef:
    name: str
    inputs: tuple
    infer: Callable
    kernels: dict = field(default_factory=dict)
    fresh: dict = field(default_factory=dict)  # device type -> fresh(ins, attrs, dtype)
    outputs: tuple = ("out",)
    attrs: tuple = ()
    dynamic: bool = False
    elementwise: bool = False  # kernel may run on matching slices of outputs and inputs
    # its numpy kernel needs host arrays (a random generator writing into ``out=``): on a
    # device with its own memory it runs on host copies of its operands, its outputs copied
    # back (vm/opcall.DeviceKernel), which the CuPy driver's numpy-over-cupy form cannot do
    host_only: bool = False
    grad: Callable | None = None  # grad rule slot: grad(out_grads, inputs, outputs, attrs)
    # attrs whose type alone decides inference and kernel choice (a scalar operand's): the
    # eager dispatch cache keys them by type, not value (see eager/interpreter.attrs_key)
    typed_attrs: tuple = ()
    # the eager dispatch cache of this op, kept by eager/interpreter: [the latest one-input
    # call's (meta, key, plan), the latest two-input call's (meta, meta, key, plan), a dict
    # signature -> plan]
    plans: list = field(default_factory=lambda: [NO_MEMO, NO_MEMO, {}], compare=False, repr=False)

    def __post_init__(self):
        # the eager interpreter relies on this: it runs a fresh kernel for the one output
        if self.fresh and (len(self.outputs) != 1 or self.dynamic):
            raise ValueError(
                f"op '{self.name}': fresh kernels are for ops with one output "
                f"whose shape is known before compute"
            )

    def kernel_for(self, device_type: str):
        """The op's kernel for ``device_type``: its own, else one ``DERIVED[device_type]``
        makes of the op (made once, kept in ``_DERIVED_KERNELS``; None: it makes none).

        Raises:
            DeviceError: neither (names the device types it runs on)."""
        k = self.kernels.get(device_type)
        if k is None:
            k = _DERIVED_KERNELS.get((self.name, device_type))
        if k is None:
            derive = DERIVED.get(device_type)
            k = None if derive is None else derive(self)
            if k is not None:
                _DERIVED_KERNELS[(self.name, device_type)] = k
                return k
            raise DeviceError(
                f"op '{self.name}' has no kernel for device type "
                f"'{device_type}'; it runs on {', '.join(self.kernels) or 'no device'}; "
                f"move the inputs with .to(...)"
            )
        return k

    def __getstate__(self) -> dict:
        # the dispatch cache is this process's (its plans hold backends, and those hold locks): a
        # copy sent to another process (a Ray worker's program) starts with an empty one, so
        # an unchanged op pickles to the same bytes whatever ran here
        state = dict(self.__dict__)
        state["plans"] = [NO_MEMO, NO_MEMO, {}]
        return state

    def __repr__(self) -> str:
        return f"OpDef({self.name!r}, inputs={self.inputs}, attrs={self.attrs})"


_REGISTRY: dict[str, OpDef] = {}

# device type -> derive(op) -> the op's kernel there, for device types whose kernels are made
# from the ops' own (cuda: the VM wraps each op's numpy kernel as a driver kernel); a layer
# above hands it in. derive raises DeviceError for an op that cannot run there.
DERIVED: dict = {}
_DERIVED_KERNELS: dict = {}


def register(op: OpDef) -> OpDef:
    """Adds an op to the registry; a name may be registered once."""
    if op.name in _REGISTRY:
        raise ValueError(f"op '{op.name}' is already registered")
    _REGISTRY[op.name] = op
    return op


def get(name: str) -> OpDef:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no op named '{name}' is registered") from None


def all_ops() -> dict:
    return dict(_REGISTRY)
