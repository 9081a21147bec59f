"""Tracing: functions of tensors recorded as ops, run as actors, equal to eager mode."""

import numpy as np
import pytest

import actorflow as af


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_issue_example_equals_eager():
    @af.trace
    def forward(x, w):
        return af.softmax(af.relu(x @ w), dim=1)

    w = rand(100, 10, seed=1)
    xs = [rand(64, 100, seed=i + 2) for i in range(5)]
    g = forward.actor_graph(af.Spec((64, 100)), af.Spec((100, 10)))
    names = [r["name"] for r in g.plan(feed=[(x, w) for x in xs]).rows]
    assert names == ["inputs of forward", "matmul", "relu", "softmax"]
    outs = list(g.run())
    assert len(outs) == 5
    for x, y in zip(xs, outs, strict=True):
        ref = forward(af.from_numpy(x), af.from_numpy(w)).numpy()
        np.testing.assert_allclose(y, ref, rtol=1e-6, atol=1e-7)
    assert g.stats().actors["matmul"]["acts"] == 5


def test_views_constants_multiple_outputs_and_scalars():
    W = af.tensor(rand(5, 3, seed=9))

    @af.trace
    def f(x):
        t = x.T  # a view of the input
        y = (t @ af.ones(4, 2)).sum(dim=1) + 1  # a constant made inside
        z = af.tanh(x[1:, ::2]) * 2  # a strided view
        return {"y": y, "z": z, "w": x @ W, "m": af.max(x, dim=0)}

    xs = [rand(4, 5, seed=i) for i in range(3)]
    g = f.actor_graph(af.Spec((4, 5)), source=xs)
    outs = list(g.run())
    for x, out in zip(xs, outs, strict=True):
        ref = f(af.from_numpy(x))
        for k in ("y", "z", "w"):
            np.testing.assert_allclose(out[k], ref[k].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out["m"][0], ref["m"][0].numpy(), rtol=1e-6)
        np.testing.assert_array_equal(out["m"][1], ref["m"][1].numpy())


def test_returning_an_input_view():
    @af.trace
    def f(x):
        return x.T, af.neg(x)

    xs = [rand(2, 3, seed=i) for i in range(2)]
    outs = list(f.actor_graph(af.Spec((2, 3)), source=xs).run())
    for x, (a, b) in zip(xs, outs, strict=True):
        np.testing.assert_array_equal(a, x.T)
        np.testing.assert_array_equal(b, -x)


def test_op_actor_with_several_ops_and_kwargs():
    g = af.ActorGraph()
    src = g.source([rand(3, 4, seed=i) for i in range(4)])
    h = g.op(lambda x, dim: af.log_softmax(af.relu(x) * 2 + 1, dim=dim), src, dim=0, name="fused")
    g.sink(h)
    plan = g.plan()
    row = [r for r in plan.rows if r["name"] == "fused"][0]
    assert row["workspace_bytes"] == 3 * 3 * 4 * 4  # relu, * 2 and + 1 intermediates
    outs = list(g.run())
    for i, y in enumerate(outs):
        x = af.from_numpy(rand(3, 4, seed=i))
        np.testing.assert_allclose(y, af.log_softmax(af.relu(x) * 2 + 1, dim=0).numpy(), rtol=1e-6)


def test_eager_call_still_works():
    @af.trace
    def f(x):
        return x * 3

    np.testing.assert_array_equal(f(af.tensor([1.0, 2.0])).numpy(), [3.0, 6.0])
    assert f.__name__ == "f"


def test_trace_errors_are_clear():
    @af.trace
    def reads(x):
        return x * float(x.sum().item())

    with pytest.raises(af.TraceError, match="being traced"):
        reads.actor_graph(af.Spec((2,)))

    @af.trace
    def inplace(x):
        x.add_(1)
        return x

    with pytest.raises(af.TraceError, match="in-place"):
        inplace.actor_graph(af.Spec((2,)))

    @af.trace
    def dynamic(x):
        return af.nonzero(x)

    with pytest.raises(af.TraceError, match="depends on the values"):
        dynamic.actor_graph(af.Spec((2,)))

    @af.trace
    def constant(x):
        return af.ones(2)

    with pytest.raises(af.TraceError, match="does not depend on its inputs"):
        constant.actor_graph(af.Spec((2,)))

    with pytest.raises(TypeError, match="one af.Spec per argument"):
        constant.actor_graph((2,))

    with pytest.raises(af.ShapeError, match="matmul"):
        af.trace(lambda x, w: x @ w).actor_graph(af.Spec((2, 3)), af.Spec((4, 5)))

    # the eager runtime keeps working after every trace error
    np.testing.assert_array_equal((af.tensor([1.0, 2.0]) + 1).numpy(), [2.0, 3.0])


def test_feed_is_required_and_reusable():
    @af.trace
    def f(x):
        return af.exp(x)

    g = f.actor_graph(af.Spec((3,)))
    assert [r["name"] for r in g.plan().rows] == ["inputs of f", "exp"]  # Specs size it
    with pytest.raises(af.PlanError, match="feed="):
        list(g.run())
    with pytest.raises(af.PlanError, match=r"run\(feed=5\): feed takes the pieces.* got int"):
        list(g.run(feed=5))
    with pytest.raises(af.ActorError, match=r"run\(feed=...\) item 0 \(for 'inputs of f'\)"):
        list(g.run(feed=[rand(4, seed=0)]))
    a = [rand(3, seed=i) for i in range(4)]
    for _ in range(2):
        outs = list(g.run(feed=a))
        np.testing.assert_allclose(np.stack(outs), np.exp(np.stack(a)), rtol=1e-6)


def test_op_actor_from_a_compiled_program():
    # an op actor made from a program compiled beforehand runs that very program, plan
    # after plan, named after its ops unless named
    from actorflow.runtime.graph.actors import OpActor
    from actorflow.runtime.plan.spec import PieceSpec
    from actorflow.tracing import op_program

    program = op_program(lambda x: af.relu(x) * 2, [PieceSpec.from_user(af.Spec((3, 4)))], {})
    xs = [rand(3, 4, seed=i) for i in range(3)]
    g = af.ActorGraph()
    src = g.source(xs)
    a = g.op_program(program, src)
    g.sink(a)
    assert a.name == "relu+mul_scalar"
    for _ in range(2):
        outs = list(g.run())
        assert a.program is program
        for x, y in zip(xs, outs, strict=True):
            np.testing.assert_array_equal(y, np.maximum(x, 0) * 2)
    with pytest.raises(TypeError, match="either build= .* or program="):
        OpActor("op", [src])
    with pytest.raises(TypeError, match="either build= .* or program="):
        OpActor("op", [src], build=lambda specs: program, program=program)
