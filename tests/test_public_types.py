"""The typed public face: every public callable of the package's faces (``af.*``, ``nn``,
``nn.functional``, ``optim``, ``data``, ``testing``, the actor graphs) annotates each of its
parameters and its return, so an editor and a type checker see what it takes and gives
(``Tensor``'s methods are declared in ``tensor/tensor.pyi``: ``test_tensor_stub.py``)."""

import inspect

import actorflow as af
from actorflow import data, nn, optim, testing
from actorflow.nn import functional as NF
from actorflow.optim import lr_scheduler

FACES = {
    "af": af,
    "nn": nn,
    "nn.functional": NF,
    "optim": optim,
    "optim.lr_scheduler": lr_scheduler,
    "data": data,
    "testing": testing,
}
METHODS = ("__init__", "__call__")


def _unannotated(fn) -> list:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or a C function: nothing to read
        return []
    missing = [
        p.name
        for p in sig.parameters.values()
        if p.annotation is inspect.Parameter.empty
        and p.name not in ("self", "cls")
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def public_callables():
    """(qualified name, function) for each public function of the faces and each public
    method (and __init__/__call__) of their public classes defined in actorflow."""
    seen = set()
    for face, mod in FACES.items():
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        for name in names:
            obj = getattr(mod, name, None)
            if getattr(obj, "__module__", "").split(".")[0] != "actorflow" or id(obj) in seen:
                continue
            seen.add(id(obj))
            if inspect.isfunction(obj):
                yield f"{face}.{name}", obj
            elif inspect.isclass(obj):
                for mname, m in vars(obj).items():
                    if (mname.startswith("_") and mname not in METHODS) or not (
                        inspect.isfunction(m)
                    ):
                        continue
                    yield f"{face}.{name}.{mname}", m


def test_every_public_callable_is_annotated():
    missing = {name: m for name, fn in public_callables() if (m := _unannotated(fn))}
    assert not missing, "\n".join(f"{k}: {', '.join(v)}" for k, v in sorted(missing.items()))


def test_the_walk_finds_the_faces_callables():
    names = {n for n, _ in public_callables()}
    assert {"af.relu", "nn.Module.__init__", "optim.Optimizer.step", "af.ActorGraph.run"} <= names
    assert len(names) > 300
