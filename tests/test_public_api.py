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


def test_no_unlisted_public_names_in_the_top_level():
    public = {n for n in dir(af) if not n.startswith("_")}
    extra = {n for n in public - set(af.__all__)
             if not isinstance(getattr(af, n), types.ModuleType)}
    assert not extra, f"public names not in __all__: {sorted(extra)}"
    # the functions af.tensor and af.device are the public names, not the subpackages
    assert callable(af.tensor) and callable(af.device)


def test_the_quickstart_from_the_readme():
    x = af.tensor([[1., -1.], [1., -1.]])
    y = af.relu(x)
    assert repr(y) == "tensor([[1., 0.],\n        [1., 0.]], dtype=actorflow.float32)"
    z = (x @ x.T).sum(dim=1, keepdim=True) + 1
    assert z.numpy().tolist() == [[5.0], [5.0]]
    af.synchronize()
