"""What a model's Python code reads by name, found in its bytecode.

A compiled step (``nn.Graph``) ran ``build`` and the modules' ``forward`` once, while
tracing: whatever their Python read then is baked into it. Beside the modules' own
attributes (their ``__dict__``, walked by ``graph._Traced``), that code reads attributes a
class holds (``self.scale`` where ``scale = 2.0`` is set on the class) and globals of its
module (a constant, a function it calls); this file finds those (``ModelReads``), so that
``nn.graph._Traced`` keeps a compiled step only while they hold, and another process (a
pipeline stage's worker, ``nn/pipeline_ranks.py``; a Ray run's, ``distributed/procs.py``)
is sent the constant ones, which it would otherwise take from its own import of the
module (the file's values, not what was set since).

What is found: starting from the ``forward`` of the modules' classes and the Graph's
``build``, the code of every function a class of the model (or a base of one) holds under a
name reached from it (``self.helper(x)``, ``super().forward(x)``, a child's
``self.inner.project(x)``, a property's getter, a static or class method, through
``functools.wraps`` and ``lru_cache``; on the Graph's class only what its own code reaches,
a helper method ``build`` calls), of the global functions that code calls (a helper of the
same script), and of the functions held as instance attributes (``self.act = my_act``, a
``functools.partial``) whose names it reaches; a method only the training loop calls (a
``describe()`` printing a counter) is not among them. Of that code: the attribute names it
loads, looked up on every class of the model (a parent's ``self.inner.factor`` reads the
inner class's), and the globals it loads, in the function's own module. actorflow's own
classes and functions are not read (the library's class attributes and globals are not the
model's). Not found: another module's globals read as its attributes (``helpers.SCALE``),
the attributes of a class that is not the model's (a config class's), a name given to
``getattr``, a callable object's ``__call__``, a function held in a list, a class attribute
set later on a class that had none by that name, and what a dict, list or config object
holds (compared by identity: a change in place to one is not seen). Code reached that reads
a name the loop sets every step (a helper reading a ``step`` counter, even behind a flag
that is off) makes every step compile anew: ``Graph`` warns at the third compile such a name
causes.
"""

from __future__ import annotations

import dis
import functools
import importlib
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


def _module_of(obj: Any) -> Any:
    """The name of the module ``obj`` (a class: its own, not a base's; a function) was
    made in, or whatever stands there (None, or nothing)."""
    if isinstance(obj, type):
        return obj.__dict__.get("__module__")
    return getattr(obj, "__module__", None)


def _library(obj: Any) -> bool:
    """Whether ``obj`` (a class or a function) is actorflow's own."""
    mod = _module_of(obj)
    return isinstance(mod, str) and mod.partition(".")[0] == "actorflow"


def functions_of(entry: Any) -> list:
    """The plain functions behind a class's dict entry: itself, a static or class method's,
    a property's getter, each through the ``__wrapped__`` chain of its decorators
    (``functools.wraps``, ``lru_cache``); none for anything else."""
    if isinstance(entry, (staticmethod, classmethod)):
        entry = entry.__func__
    elif isinstance(entry, property):
        entry = entry.fget
    elif isinstance(entry, functools.partial):
        entry = entry.func
    out: list = []
    while entry is not None and not any(entry is f for f in out):
        if isinstance(entry, types.FunctionType):
            out.append(entry)
            entry = entry.__dict__.get("__wrapped__")
        elif isinstance(entry, functools._lru_cache_wrapper):
            entry = entry.__wrapped__
        else:
            break
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


def _user_function(v: Any) -> Any:
    """``v`` (a method: its function) where it is a function of the model's own (one
    ``functions_of`` reads, not actorflow's), else None."""
    if isinstance(v, types.MethodType):
        v = v.__func__
    return v if functions_of(v) and not _library(v) else None


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


def tree_reads(classes: list, graph: type | None = None, held: Iterable[tuple] = ()) -> tuple:
    """What the model's code reads: ``(names, graph names, [(where, function, global
    names)])``. From the module ``classes``' ``forward`` and the ``graph`` class's ``build``,
    a name the code loads is looked up on every module class and each of its bases that
    holds it (a ``super().forward`` reaches the base's too, a parent's
    ``self.inner.project(x)`` the inner class's), and on the graph class only where the
    Graph's own code loads it (a helper method ``build`` calls; not a method of the Graph
    that only the loop calls, whatever the model's code names alike); ``held``: ``(on the
    graph, name, value)`` per function held as an instance attribute, read once its name is
    reached; a global function the code calls is read too (a helper of the same script);
    actorflow's own are left out. ``names``: every name reached; ``graph names``: those the
    Graph's code reached. ``where``: ``("method", class, name, k)`` for the ``k``-th of
    ``functions_of`` a class's entry, ``("function", obj, k)`` for the ``k``-th of a
    global or held object's. Computed afresh each time (a method set since is read)."""
    globs: list = []
    seen: set = set()  # (id(function), on the graph's side)
    done: dict = {False: set(), True: set()}
    names: dict = {False: [], True: []}
    todo: list = [("forward", False)] + ([("build", True)] if graph is not None else [])
    held = list(held)
    funcs: list = [  # (the functions given to be read whatever is reached: name None)
        (("function", v, k), f, on_graph)
        for on_graph, hname, v in held
        if hname is None
        for k, f in enumerate(functions_of(v))
    ]

    def read(where: tuple, f: Any, mine: bool) -> None:
        if (id(f), mine) in seen or _library(f):
            return
        seen.add((id(f), mine))
        todo.extend((n, mine) for n in attribute_names(f.__code__))
        g = global_names(f.__code__)
        if g:
            if (id(f), not mine) not in seen:
                globs.append((where, f, g))
            ns = f.__globals__
            for n in g:
                h = ns.get(n)
                if isinstance(h, (types.FunctionType, functools._lru_cache_wrapper)):
                    funcs.extend(
                        (("function", h, k), w, mine) for k, w in enumerate(functions_of(h))
                    )

    while todo or funcs:
        while funcs:
            read(*funcs.pop())
        if not todo:
            break
        name, mine = todo.pop()
        if name in done[mine] or name.startswith("__"):
            continue
        done[mine].add(name)
        names[mine].append(name)
        for cls in [*classes, graph] if mine else classes:
            if cls is None:
                continue
            for owner in cls.__mro__:
                entry = owner.__dict__.get(name, MISSING)
                if entry is not MISSING and not _library(owner):
                    for k, f in enumerate(functions_of(entry)):
                        read(("method", owner, name, k), f, cls is graph)
        for on_graph, hname, v in held:
            if hname == name and (mine or not on_graph):
                for k, f in enumerate(functions_of(v)):
                    read(("function", v, k), f, on_graph)
    everything = tuple(dict.fromkeys(names[False] + names[True]))
    return everything, tuple(names[True]), globs


class ModelReads:
    """What the code of a model reads (``tree_reads``), found once: ``modules``, and
    ``graph`` (an ``nn.Graph``, or None), whose ``build`` reaches more (its helper methods,
    its class attributes), and ``functions`` (read from the start: an actor graph's stage
    functions). Functions held as instance attributes (``self.act = my_act``, a
    ``functools.partial``, a ``forward`` set on one instance) are read where their name is
    reached."""

    def __init__(
        self, modules: Iterable[Any] = (), graph: Any = None, functions: Iterable[Any] = ()
    ) -> None:
        modules = list(modules)
        self.classes = _classes(modules)
        self.graph = type(graph) if graph is not None and not _library(type(graph)) else None
        held: list = []
        for v in functions:  # (read whatever is reached: a Ray run's stage functions)
            while isinstance(v, functools.partial):
                v = v.func
            if isinstance(v, types.MethodType):  # (a bound method: its class's too)
                owner = type(v.__self__)
                if not _library(owner) and owner not in self.classes:
                    self.classes.append(owner)
            f = _user_function(v)
            if f is not None:
                held.append((False, None, f))
        for o, on_graph in [*((m, False) for m in modules), (graph, True)]:
            for k, v in getattr(o, "__dict__", {}).items() if o is not None else ():
                f = _user_function(v)  # (a forward set on one instance: a method)
                if f is not None:
                    held.append((on_graph, k, f))
        self.names, self.graph_names, self.globs = tree_reads(self.classes, self.graph, held)

    def class_state(self) -> list:
        """``(class, name, value)`` for each name reached that one of the classes holds at
        class level (a method, a property, a constant: ``forward`` itself too; on the
        Graph's class, what its own code reached), in a stable order. ``value`` is the
        class dict's entry: the same object until somebody sets the name again."""
        out = []
        for cls, names in [
            *((c, self.names) for c in self.classes),
            (self.graph, self.graph_names),
        ]:
            if cls is None:
                continue
            for name in sorted(names):
                if not name.startswith("__"):
                    owner, v = class_entry(cls, name)
                    if owner is not None:
                        out.append((cls, name, v))
        return out

    def module_globals(self) -> list:
        """``(where, globals, name, object)`` for each global the code reached reads in its
        own module (a constant, a function it calls), in a stable order, but those it also
        sets itself (``global cache; cache = ...``: state it keeps, not a setting);
        ``where``: the function that reads it (``tree_reads``), by which a worker finds the
        same namespace (a script's, run as ``__main__``, is another module's there)."""
        stored = {
            (id(f.__globals__), n)
            for _, f, _ in self.globs
            for n in loaded(f.__code__, ("STORE_GLOBAL", "DELETE_GLOBAL"))
        }
        out: list = []
        seen: set = set(stored)
        for where, f, names in self.globs:
            ns = f.__globals__
            for n in names:
                if n in ns and (id(ns), n) not in seen:
                    seen.add((id(ns), n))
                    out.append((where, ns, n, ns[n]))
        return out


def set_shared(module: str, qualname: str, entry: Any, name: str, value: Any) -> None:
    """Sets in this process what the controller's model reads besides itself
    (``shared_constants``): on ``qualname`` of ``module`` (a class, or a function), the attribute
    ``name`` of that class (``entry`` None), or the global ``name`` where the ``k``-th
    function (``functions_of``: through decorators) of that function (``entry``
    ``("", k)``) or of the class's entry ``e`` (``entry`` ``(e, k)``) reads it: in the
    namespace it reads here (a script's too). What this worker cannot find by name is left
    alone (the stage's module loaded without it)."""
    try:
        owner: Any = importlib.import_module(module)
        for part in qualname.split("."):
            owner = getattr(owner, part)
        if entry is None:
            setattr(owner, name, value)
        else:
            held = owner.__dict__[entry[0]] if entry[0] else owner
            functions_of(held)[entry[1]].__globals__[name] = value
    except Exception:  # noqa: BLE001 - (see the doc)
        pass


def shared_constants(model: ModelReads) -> list:
    """What the model's code reads besides the model itself that another process keeps a
    copy of (a pipeline stage's worker, a Ray process), where it holds a constant (a
    number, a string, bytes, None or a tuple of those; other values are not sent: the
    other process's are its own), as ``set_shared``'s arguments: classes and functions
    named, not pickled (one made inside a function is named by nothing: left out)."""
    out = []
    for cls, k, v in model.class_state():
        where = _named(class_entry(cls, k)[0])
        if where is not None and _plain(v):
            out.append((*where, None, k, v))
    for found, _, k, v in model.module_globals():
        where = _named(found[1])
        entry: tuple = (found[2], found[3]) if found[0] == "method" else ("", found[2])
        if where is not None and _plain(v):
            out.append((*where, entry, k, v))
    return out


def _named(obj: Any) -> tuple | None:
    """``(module name, qualname)`` a worker finds ``obj`` (a class or a function) by, or
    None (made inside a function)."""
    mod, qual = _module_of(obj), getattr(obj, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qual, str) or "<locals>" in qual:
        return None
    return mod, qual


PLAIN = (type(None), bool, int, float, complex, str, bytes)  # (compared by value)


def _plain(v: Any) -> bool:
    return isinstance(v, PLAIN) or (type(v) is tuple and all(_plain(x) for x in v))
