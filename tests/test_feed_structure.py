"""The structure of what a source, a feed or a stage gives, against its register's: a
traced function of one tensor takes 1-tuples as a function of two takes pairs, and a
mismatch is said in words (what was given, where, what the register holds) with the fix."""

import numpy as np
import pytest

import actorflow as af
from actorflow.runtime.plan.spec import flatten


def pieces(n=3, shape=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


@af.trace
def one(x):
    return af.relu(x) * 2


@af.trace
def two(x, w):
    return af.relu(x @ w)


def test_a_one_input_traced_graph_takes_1_tuples_as_two_inputs_take_pairs():
    xs = pieces()
    want = [np.maximum(x, 0) * 2 for x in xs]
    g = one.actor_graph(af.Spec((3, 4)))
    for feed in ((x for x in xs), ((x,) for x in xs)):  # bare arrays, and 1-tuples
        outs = list(g.run(feed=feed))
        assert len(outs) == 3
        for o, w in zip(outs, want, strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-6)
    # a source of argument tuples (actor_graph(source=...)) too
    g = one.actor_graph(af.Spec((3, 4)), source=[(x,) for x in xs])
    np.testing.assert_allclose(list(g.run())[2], want[2], rtol=1e-6)
    # and the pair form of a two-input function is unchanged
    w = np.eye(4, 2, dtype=np.float32)
    outs = list(two.actor_graph(af.Spec((3, 4)), af.Spec((4, 2))).run(feed=((x, w) for x in xs)))
    np.testing.assert_allclose(outs[1], np.maximum(xs[1] @ w, 0), rtol=1e-6)


def test_a_one_input_traced_graph_matches_torch():
    torch = pytest.importorskip("torch")
    xs = pieces(seed=1)
    outs = list(one.actor_graph(af.Spec((3, 4))).run(feed=((x,) for x in xs)))
    for o, x in zip(outs, xs, strict=True):
        np.testing.assert_allclose(o, (torch.relu(torch.from_numpy(x)) * 2).numpy(), rtol=1e-6)


def test_a_pair_for_a_one_input_function_says_the_difference_and_the_fix():
    x = pieces(1)[0]
    g = one.actor_graph(af.Spec((3, 4)))
    with pytest.raises(af.ActorError) as info:
        list(g.run(feed=[(x, x)]))
    text = str(info.value)
    assert (
        "run(feed=...) item 0 (for 'inputs of one') gave a tuple of 2 where its "
        "declared Spec (out=) is an array"
    ) in text
    assert "give an array, the same structure, for every piece" in text
    assert len(list(g.run(feed=[x]))) == 1  # and the graph runs again


def test_a_bare_array_for_a_two_input_function_says_give_a_tuple_of_2():
    x = pieces(1)[0]
    g = two.actor_graph(af.Spec((3, 4)), af.Spec((4, 2)))
    with pytest.raises(af.ActorError) as info:
        list(g.run(feed=[x]))
    text = str(info.value)
    assert "gave an array where its declared Spec (out=) is a tuple of 2" in text
    assert "give a tuple of 2 (one array per item) for every piece" in text
    assert "but its register holds" not in text  # (the old wording said no more)


def test_a_stage_returning_a_1_tuple_for_an_array_register_says_give_the_array():
    g = af.ActorGraph()
    g.sink(
        g.actor(
            lambda v: (v,), g.source([np.ones(2)] * 2), name="wrap", out=af.Spec((2,), af.float64)
        )
    )
    with pytest.raises(af.ActorError) as info:
        list(g.run())
    text = str(info.value)
    assert (
        "actor 'wrap' (piece 0) gave a tuple of 1 where its declared Spec (out=) is "
        "an array; give the array itself, not a tuple of 1 holding it"
    ) in text
    assert (
        "(got (Spec((2,), actorflow.float64),), the register holds "
        "Spec((2,), actorflow.float64))" in text
    )


def test_a_later_piece_nested_otherwise_says_where_and_what_piece_0_gave():
    calls = []

    def split(v):
        calls.append(1)
        return (v, {"a": v}) if len(calls) == 1 else (v, {"b": v})

    g = af.ActorGraph()
    g.sink(g.actor(split, g.source([np.ones(2)] * 3), name="split"))
    with pytest.raises(af.ActorError) as info:
        list(g.run())
    assert info.value.actor == "split" and info.value.piece == 1
    assert (
        "actor 'split' (piece 1) gave a tuple of 2 whose item [1] is a dict with keys "
        "'b', where piece 0 gave a dict with keys 'a' there"
    ) in str(info.value)


@pytest.mark.parametrize(
    "got, want, said",
    [
        ((np.ones(1),), np.ones(1), ("", "a tuple of 1", "an array")),
        (np.ones(1), [np.ones(1), np.ones(1)], ("", "an array", "a list of 2")),
        ((1, [2, 3]), (1, [2]), ("[1]", "a list of 2", "a list of 1")),
        ({"x": (1,)}, {"x": 1}, ("['x']", "a tuple of 1", "an array")),
        ({"x": 1}, {"y": 1}, ("", "a dict with keys 'x'", "a dict with keys 'y'")),
        ((1, None), (1, 2), ("[1]", "None", "an array")),
    ],
)
def test_structure_difference_in_words(got, want, said):
    from actorflow.runtime.plan.spec import structure_difference

    assert structure_difference(flatten(got)[1], flatten(want)[1]) == said
    assert structure_difference(flatten(want)[1], flatten(want)[1]) is None


def test_structure_words():
    from actorflow.runtime.plan.spec import structure_words

    assert structure_words(flatten({})[1]) == "an empty dict"
    assert structure_words(flatten([1, 2, 3])[1]) == "a list of 3"
