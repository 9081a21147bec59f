"""What a model's Python code reads by name, found in its bytecode.

A compiled step (``nn.Graph``) ran ``build`` and the modules' ``forward`` once, while
tracing: whatever their Python read then is baked into it. Beside the modules' own
attributes (their ``__dict__``, walked by ``graph._Traced``), a ``forward`` reads
attributes its class holds (``self.scale`` where ``scale = 2.0`` is set on the class) and
globals of its module (a constant, a function it calls); this file finds those, so that
``graph._Traced`` keeps a compiled step only while they hold, and a pipeline stage's worker
is sent the constant ones (``pipeline_ranks``).

What is found: starting from each module class's ``forward``, the code of every function of
the class reached by name from it (``self.helper(x)``, a property's getter, a static or
class method, through ``functools.wraps`` decorators), so a method the training loop calls
(a ``describe()`` printing a counter) is not among them; the attribute names that code
loads, and those ``build``'s Graph loads, looked up on every module class of the tree (a
parent's ``self.inner.factor`` reads the inner class's); and the globals that code loads,
in the function's own module. actorflow's own classes and functions are not read (the
library's class attributes and globals are not the model's). Not found: what a function
outside the class reads (a helper of another module), and a class attribute set later on a
class that had none by that name.
"""

from __future__ import annotations

import dis
import functools
import types
import weakref
from collections.abc import Iterable
from typing import Any

MISSING = object()  # (a name a class, or a namespace, does not hold)
_ATTR_OPS = ("LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR")
_GLOBAL_OPS = ("LOAD_GLOBAL", "LOAD_NAME")

# code object -> {opnames: the names loaded}
_LOADED: weakref.WeakKeyDictionary[types.CodeType, dict[tuple[str, ...], tuple[str, ...]]] = (
    weakref.WeakKeyDictionary()
)


def loaded(code: types.CodeType, opnames: tuple) -> tuple:
    """The names ``code`` (and the code objects inside it: lambdas, comprehensions, inner
    functions) loads with ``opnames``."""
    mine = _LOADED.get(code)
    if mine is None:
        mine = _LOADED[code] = {}
    names = mine.get(opnames)
    if names is None:
        found: list = []
        for ins in dis.get_instructions(code):
            if ins.opname in opnames and ins.argval not in found:
                found.append(ins.argval)
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                found += [n for n in loaded(c, opnames) if n not in found]
        names = mine[opnames] = tuple(found)
    return names


def attribute_names(code: types.CodeType) -> tuple:
    return loaded(code, _ATTR_OPS)


def global_names(code: types.CodeType) -> tuple:
    return loaded(code, _GLOBAL_OPS)


def _library(obj: Any) -> bool:
    """Whether ``obj`` (a class or a function) is actorflow's own."""
    mod = obj.__dict__.get("__module__") if isinstance(obj, type) else obj.__module__
    return isinstance(mod, str) and mod.partition(".")[0] == "actorflow"


def functions_of(entry: Any) -> list:
    """The plain functions behind a class's dict entry: itself, a static or class method's,
    a property's getter, each through the ``__wrapped__`` chain of its decorators; none for
    anything else."""
    if isinstance(entry, (staticmethod, classmethod)):
        entry = entry.__func__
    elif isinstance(entry, property):
        entry = entry.fget
    elif isinstance(entry, functools.partial):
        entry = entry.func
    out = []
    while isinstance(entry, types.FunctionType) and entry not in out:
        out.append(entry)
        entry = entry.__dict__.get("__wrapped__")
    return out


def class_entry(cls: type, name: str) -> tuple:
    """``(the class of cls.__mro__ that holds name, what it holds there)``, as stored (no
    method bound: the same object while nobody sets it again); ``(None, MISSING)`` where
    no class of it holds ``name``."""
    for c in cls.__mro__:
        d = c.__dict__
        if name in d:
            return c, d[name]
    return None, MISSING


def class_value(cls: type, name: str) -> Any:
    return class_entry(cls, name)[1]


# module class -> (attribute names, ((globals, global names) per function)) its code reads
_READS: weakref.WeakKeyDictionary[type, tuple] = weakref.WeakKeyDictionary()


def class_reads(cls: type) -> tuple:
    """What the code reached from ``cls.forward`` reads (see the module doc): ``(attribute
    names, ((globals, global names) per function))``."""
    try:
        got = _READS.get(cls)
    except TypeError:  # (a class its metaclass makes unhashable: not kept)
        got = None
    if got is not None:
        return got
    attrs: list = []
    globs: list = []
    seen: list = []
    todo = ["forward"]
    done = set()
    while todo:
        name = todo.pop()
        if name in done or name.startswith("__"):
            continue
        done.add(name)
        owner, entry = class_entry(cls, name)
        if owner is None or _library(owner):
            continue
        for f in functions_of(entry):
            if f in seen or _library(f):
                continue
            seen.append(f)
            names = attribute_names(f.__code__)
            attrs += [n for n in names if n not in attrs]
            todo += [n for n in names if n not in done]
            g = global_names(f.__code__)
            if g:
                globs.append((f.__globals__, g))
    got = (tuple(attrs), tuple(globs))
    try:
        _READS[cls] = got
    except TypeError:
        pass
    return got


def _classes(modules: Iterable[Any]) -> list:
    """The modules' classes, each once, in the order met, actorflow's own left out."""
    out: list = []
    ids: set = set()
    for m in modules:
        cls = type(m)
        if id(cls) not in ids:
            ids.add(id(cls))
            if not _library(cls):
                out.append(cls)
    return out


def class_state(modules: Iterable[Any], names: Iterable[str] = ()) -> list:
    """``(class, name, value)`` for each attribute name the modules' classes' code reads (and
    ``names``: what the Graph's code reads, a ``build`` reading ``self.model.scale``) that
    one of their classes holds at class level, where a class of the model holds it (the
    methods, properties and constants a ``forward`` reaches), in a stable order. ``value``
    is the class dict's entry: the same object until somebody sets the name again."""
    classes = _classes(modules)
    wanted: set = set(names)
    for cls in classes:
        wanted.update(class_reads(cls)[0])
    out = []
    for cls in classes:
        for name in sorted(wanted):
            if name.startswith("__"):
                continue
            owner, v = class_entry(cls, name)
            if owner is not None and not _library(owner):
                out.append((cls, name, v))
    return out


def module_globals(modules: Iterable[Any]) -> list:
    """``(globals, name, object)`` for each global the modules' classes' code reads in its
    own module (a constant, a function it calls), in a stable order."""
    out: list = []
    seen: set = set()
    for cls in _classes(modules):
        for ns, names in class_reads(cls)[1]:
            for n in names:
                if n in ns and (id(ns), n) not in seen:
                    seen.add((id(ns), n))
                    out.append((ns, n, ns[n]))
    return out
