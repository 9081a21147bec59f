"""One piece check for every engine: what a stage or a source gives is checked against its
register by ``runtime.spec.check_piece``, which the local engine and a Ray process both
call, so a wrong piece is the same error in the same words however the graph runs. Here
the Ray side's stages are made as a Ray run makes them (``Unit.stages``) and checked in
this process; ``test_ray.py`` runs the same graphs on Ray."""

import numpy as np
import pytest

import actorflow as af
from actorflow.distributed.rayplan import Unit


def items(n=6):
    return lambda: (np.full(8, i, np.float32) for i in range(n))


def pair_then_list(x):
    a, b = x[:2], x[2:4]
    return [a, b] if int(x[0]) == 3 else (a, b)


def longer_at_3(x):
    return np.zeros(4 if int(x[0]) == 3 else 3, np.float32)


def float64_at_3(x):
    return x.astype(np.float64) if int(x[0]) == 3 else x


def nothing(x):
    return None


def tensor_at_3(x):
    return af.tensor(x[:2]) if int(x[0]) == 3 else x


CASES = [
    (
        longer_at_3,
        3,
        af.ShapeError,
        "actor 'stage' (piece 3) returned float32[4] but its register holds float32[3]; "
        "return the same shape for every piece, or declare out=af.Spec(...)",
    ),
    (
        float64_at_3,
        3,
        af.DTypeError,
        "actor 'stage' (piece 3) returned float64[8] but its register holds float32[8]; "
        "cast it (.astype(numpy.float32)) or declare out=af.Spec(...)",
    ),
    (
        pair_then_list,
        3,
        TypeError,
        "actor 'stage' (piece 3) gave a list of 2 where piece 0 gave a tuple of 2; give a "
        "tuple of 2, the same structure, for every piece (got [Spec((2,), actorflow.float32), "
        "Spec((2,), actorflow.float32)], the register holds (Spec((2,), actorflow.float32), "
        "Spec((2,), actorflow.float32)))",
    ),
    (
        tensor_at_3,
        3,
        af.ShapeError,
        "actor 'stage' (piece 3) returned float32[2] but its register holds float32[8]; "
        "return the same shape for every piece, or declare out=af.Spec(...)",
    ),
]


def local_error(g) -> af.ActorError:
    with pytest.raises(af.ActorError) as info:
        list(g.run())
    return info.value


@pytest.mark.parametrize("fn, piece, kind, words", CASES, ids=[c[0].__name__ for c in CASES])
def test_a_wrong_stage_output_is_one_error_locally_and_in_a_ray_process(fn, piece, kind, words):
    g = af.ActorGraph()
    stage = g.actor(fn, g.source(items(), name="load"), name="stage")
    g.sink(stage)
    local = local_error(g)
    assert (local.actor, local.piece) == ("stage", piece)
    assert type(local.original) is kind and str(local.original) == words
    remote = Unit("stage", [stage], False).stages(1)[0]  # as a Ray run ships it
    with pytest.raises(kind) as info:
        remote.check(fn(np.full(8, piece, np.float32)), piece)
    assert type(info.value) is kind and str(info.value) == words


def test_none_from_a_stage_is_refused_alike_and_accepted_alike_with_out_nothing():
    g = af.ActorGraph()
    stage = g.actor(
        nothing, g.source(items(), name="load"), name="stage", out=af.Spec((8,), af.float32)
    )
    g.sink(stage)
    local = local_error(g)
    assert type(local.original) is TypeError and "did the function forget to return?" in str(
        local.original
    )
    with pytest.raises(TypeError) as info:
        Unit("stage", [stage], False).stages(1)[0].check(None, local.piece)
    assert str(info.value) == str(local.original)
    h = af.ActorGraph()
    quiet = h.actor(nothing, h.source(items(), name="load"), name="quiet", out=())
    h.sink(quiet)
    assert list(h.run()) == [()] * 6
    assert Unit("quiet", [quiet], False).stages(1)[0].check(None, 1) == ()


def test_a_source_piece_of_another_shape_is_one_error_locally_and_in_a_ray_process():
    g = af.ActorGraph()
    src = g.source([np.zeros(4), np.zeros(4), np.zeros(5)], name="load")
    g.sink(g.actor(lambda x: x * 2, src, name="stage"))
    local = local_error(g)
    words = (
        "source 'load' (piece 2) returned float64[5] but its register holds "
        "float64[4]; return the same shape for every piece, or declare "
        "out=af.Spec(...)"
    )
    assert (local.actor, local.piece) == ("load", 2)
    assert type(local.original) is af.ShapeError and str(local.original) == words
    remote = Unit("load", [src], False).stages(1)[0]
    with pytest.raises(af.ShapeError) as info:
        remote.check(np.zeros(5), 2)
    assert str(info.value) == words
