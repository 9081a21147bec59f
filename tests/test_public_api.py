"""The public face: ``actorflow`` re-exports each public name once; ``lowlevel`` likewise."""

import types

import pytest

import actorflow as af
import actorflow.lowlevel as ll

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("module", [af, ll])
def test_every_public_name_is_exported_once(module):
    names = module.__all__
    assert len(names) == len(set(names)), "a name is listed twice in __all__"
    for name in names:
        assert hasattr(module, name), f"{module.__name__}.__all__ lists missing {name!r}"


@pytest.mark.parametrize("module", [af, ll])
def test_no_unlisted_public_names(module):
    """As trio checks its faces: every name a face shows without an underscore is one it
    exports (submodules aside); a helper it imports for itself is imported as ``_name``."""
    public = {n for n in dir(module) if not n.startswith("_")}
    extra = {
        n
        for n in public - set(module.__all__)
        if not isinstance(getattr(module, n), types.ModuleType)
    }
    assert not extra, f"{module.__name__}: public names not in __all__: {sorted(extra)}"
    # the functions af.tensor and af.device are the public names, not the subpackages
    assert callable(af.tensor) and callable(af.device)


def test_every_public_object_reaches_exactly_one_face():
    """A name is exported by ``actorflow`` or by ``lowlevel``, never both; within a face, one
    object has one name, but for the documented dtype aliases (af.float is af.float32...)."""
    assert not set(af.__all__) & set(ll.__all__)
    aliases = {
        ("bool", "bool_"),
        ("int", "int32"),
        ("long", "int64"),
        ("half", "float16"),
        ("float", "float32"),
        ("double", "float64"),
    }
    seen: dict = {}
    for module in (af, ll):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, types.ModuleType):
                continue
            other = seen.setdefault(id(obj), (module.__name__, name))
            if other != (module.__name__, name):
                pair = tuple(sorted((other[1], name), key=len))
                assert other[0] == module.__name__ and pair in aliases, (
                    f"{other[0]}.{other[1]} and {module.__name__}.{name} are one object"
                )


def test_the_quickstart_from_the_readme():
    x = af.tensor([[1.0, -1.0], [1.0, -1.0]])
    y = af.relu(x)
    assert repr(y) == "tensor([[1., 0.],\n        [1., 0.]], dtype=actorflow.float32)"
    z = (x @ x.T).sum(dim=1, keepdim=True) + 1
    assert z.numpy().tolist() == [[5.0], [5.0]]
    af.synchronize()
