"""nn.Graph never gives stale or raw results: a compiled step is kept only while what build
read when traced still holds (parameters, buffers, modules, the Graph's attributes, the
optimizers' groups, the names build reads, the class attributes and globals the modules'
methods read), captured tensors are read live, in-place ops in
build are refused saying why, a failing op raises the error eager mode raises (and the state
stays as it was), and run() takes ActorGraph.run's arguments."""

import functools
import time
import types
import warnings

import numpy as np
import pytest

import actorflow as af
from actorflow import nn, optim
from actorflow.nn import graph as graph_module

X = np.ones((2, 3), np.float32)


class Sum(nn.Graph):
    """``build(x) = model(x).sum()`` on the model it is given."""

    def __init__(self, model):
        super().__init__()
        self.m = model

    def build(self, x):
        return self.m(x).sum()


class Train(nn.Graph):
    """A training step: ``build(x)`` backpropagates ``model(x).sum()`` into ``opt``."""

    def __init__(self, model, opt):
        super().__init__()
        self.m = model
        self.add_optimizer(opt)

    def build(self, x):
        loss = self.m(x).sum()
        loss.backward()
        return loss


def both(g, x=X):
    """What step() and run() (an actor per op, and fused) give for ``x``."""
    return (
        float(g.step(af.tensor(x))),
        float(next(iter(g.run([x])))),
        float(next(iter(g.run([x], fused=True)))),
    )


def eager(model, x=X):
    with af.no_grad():
        return float(model(af.tensor(x)).sum())


@pytest.fixture
def counted(monkeypatch):
    """``(takes, compiles)``: a list that grows by one at each walk of what build read (a
    new ``_Traced``) and at each compile of a step."""
    takes, compiles = [], []
    real_traced, real_program = graph_module._Traced, graph_module.stateful_program
    monkeypatch.setattr(graph_module, "_Traced", lambda g: takes.append(1) or real_traced(g))
    monkeypatch.setattr(
        graph_module, "stateful_program", lambda *a: compiles.append(1) or real_program(*a)
    )
    return takes, compiles


# -- a compiled step is kept only while what build read holds -------------------------------


def test_replacing_a_parameter_compiles_the_step_anew():
    m = nn.Linear(3, 1, bias=False)
    m.load_state_dict({"weight": af.full((1, 3), 2.0)})
    g = Sum(m)
    assert both(g) == (12.0, 12.0, 12.0)
    m.weight = nn.Parameter(af.full((1, 3), 5.0))  # a new Parameter object
    assert both(g) == (30.0, 30.0, 30.0) and eager(m) == 30.0
    m.load_state_dict({"weight": af.full((1, 3), 1.0)})  # in place: seen as before
    assert both(g) == (6.0, 6.0, 6.0)


def test_replacing_a_buffer_compiles_the_step_anew():
    m = nn.Linear(3, 1, bias=False)
    m.load_state_dict({"weight": af.full((1, 3), 1.0)})
    m.register_buffer("scale", af.tensor(2.0))

    class Scaled(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):
            return (self.m(x) * self.m.scale).sum()

    g = Scaled()
    assert both(g) == (12.0, 12.0, 12.0)
    m.scale = af.tensor(5.0)  # a new tensor as the buffer
    assert both(g) == (30.0, 30.0, 30.0)


def test_swapping_a_submodule_compiles_the_step_anew():
    seq = nn.Sequential(nn.Linear(3, 2, bias=False), nn.ReLU())
    seq.load_state_dict({"0.weight": af.full((2, 3), -1.0)})
    g = Sum(seq)
    assert both(g) == (0.0, 0.0, 0.0)
    seq[1] = nn.Tanh()  # Sequential sets its entry itself
    want = eager(seq)
    assert want == pytest.approx(4 * np.tanh(-3.0)) and both(g) == (want, want, want)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.act = nn.ReLU()

        def forward(self, x):
            return self.act(-x)

    b = Block()
    g = Sum(b)
    assert both(g) == (0.0, 0.0, 0.0)
    b.act = nn.Identity()  # a child set as an attribute
    assert both(g) == (-6.0, -6.0, -6.0)
    b.act.register_forward_hook(lambda mod, args, out: out * 2)  # a hook added
    assert both(g) == (-12.0, -12.0, -12.0)


def test_the_graphs_own_attributes_compile_the_step_anew():
    class Scaled(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = nn.Identity()
            self.factor = 2.0

        def shifted(self, y):
            return y + self.shift  # read by a method build calls

        def build(self, x):
            return self.shifted(self.m(x) * self.factor).sum()

    g = Scaled()
    g.shift = 0.0
    assert both(g) == (12.0, 12.0, 12.0)
    g.factor = 5.0  # a number build reads
    assert both(g) == (30.0, 30.0, 30.0)
    g.shift = 1.0
    assert both(g) == (36.0, 36.0, 36.0)
    g.m = nn.ReLU()  # a module attribute replaced
    assert both(g, -X) == (6.0, 6.0, 6.0)


def test_rebinding_a_global_that_build_reads_compiles_the_step_anew():
    global OFFSET
    OFFSET = af.tensor(1.0)

    class Offset(nn.Graph):
        def build(self, x):
            return (x + OFFSET).sum()

    g = Offset()
    assert both(g) == (12.0, 12.0, 12.0)
    OFFSET = af.tensor(3.0)  # the name now holds another tensor
    assert both(g) == (24.0, 24.0, 24.0)


SHIFT = 0.0  # (read by Scaled.forward)
STEP = 0  # (read by Scaled.describe only)


def doubled(x):
    return x * 2.0


def tripled(x):
    return x * 3.0


def logged_fn(fn):
    @functools.wraps(fn)
    def wrapper(x):
        return fn(x)

    return wrapper


def logged(fn):
    @functools.wraps(fn)
    def wrapper(self, x):
        return fn(self, x)

    return wrapper


class Inner(nn.Module):
    factor = 1.0  # (read by Scaled's forward, through self.inner)

    def forward(self, x):
        return x


class Scaled(nn.Module):
    """Reads, in its (decorated) forward and what that calls by name: a class attribute, a
    global of its module, a child's class attribute, a function set on the class."""

    factor = 2.0
    act = staticmethod(doubled)

    def __init__(self):
        super().__init__()
        self.inner = Inner()

    @logged
    def forward(self, x):
        return self.shifted(self.act(x) * self.factor) * self.inner.factor

    def shifted(self, y):
        return y + SHIFT

    def describe(self):  # (not reached from forward: the loop's counter is no reason
        return f"step {STEP}"  # to compile again)


def test_what_the_modules_code_reads_compiles_the_step_anew(counted):
    """What a module's forward reads besides its instances' attributes, changed between
    steps: each change compiles the step anew, as eager mode sees it; a change to what
    forward does not reach compiles nothing."""
    global SHIFT, STEP
    takes, compiles = counted
    g = Sum(nn.Sequential(Scaled()))
    changes = [
        lambda: setattr(Scaled, "factor", 3.0),  # set on the class
        lambda: globals().update(SHIFT=1.0),  # the global a method forward calls reads
        lambda: setattr(Inner, "factor", 0.5),  # a child's, read by the parent
        lambda: setattr(Scaled, "act", staticmethod(tripled)),  # a function on the class
        lambda: setattr(g.m[0], "factor", 1.0),  # an instance's own shadows the class's
    ]
    try:
        assert both(g) == (24.0, 24.0, 24.0) == (eager(g.m),) * 3
        for change in changes:
            before = both(g)[0]
            change()
            got = both(g)
            assert got == (eager(g.m),) * 3 and got[0] != before
        del takes[:], compiles[:]
        for k in range(4):
            STEP = k  # (describe's global, rebound)
            g.step(af.tensor(X))
        SHIFT = float("1.0")  # (an equal number, another object)
        g.step(af.tensor(X))
        assert takes == [] and compiles == []
    finally:
        Scaled.factor, Scaled.act, Inner.factor, SHIFT, STEP = (
            2.0,
            staticmethod(doubled),
            1.0,
            0.0,
            0,
        )


OFFSET_OF_BASE = 0.0  # (read by Base.forward)
HELPER_GAIN = 1.0  # (read by helper, a function Derived.forward calls)


def helper(x):
    return x * HELPER_GAIN


class Base(nn.Module):
    scale = 1.0

    def forward(self, x):
        return x * self.scale + OFFSET_OF_BASE


class Part(nn.Module):
    k = 1.0

    def project(self, x):  # (not its forward: called by the parent)
        return x * self.k


class Derived(Base):
    """Reaches its base's forward through super(), a child's method other than forward,
    and a function of its module."""

    def __init__(self):
        super().__init__()
        self.part = Part()

    def forward(self, x):
        return helper(self.part.project(super().forward(x)))


ACT_GAIN = 1.0  # (read by scaled_act, a function held as an attribute)
LOSS_GAIN = 1.0  # (read by Weighted.weigh, a Graph method build calls)
DECORATED_GAIN = 1.0  # (read by decorated_helper, under a decorator)


def scaled_act(x):
    return x * ACT_GAIN


@logged_fn
def decorated_helper(x):
    return x * DECORATED_GAIN


class Holds(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = scaled_act  # (a plain function held by the instance)

    def forward(self, x):
        return decorated_helper(self.act(x))


class Weighted(nn.Graph):
    """A Graph whose build calls a helper method reading a class attribute and a global."""

    weight = 1.0

    def __init__(self, model):
        super().__init__()
        self.m = model

    def weigh(self, y):
        return y * self.weight * LOSS_GAIN

    def build(self, x):
        return self.weigh(self.m(x).sum())


def each_change_seen(g, changes, want):
    """From a step giving 6.0 every way, each of ``changes`` in turn makes every way give
    ``want()`` (eager's value after it), another value than before."""
    assert both(g) == (6.0, 6.0, 6.0)
    for change in changes:
        before = both(g)[0]
        change()
        got = both(g)
        assert got == (want(),) * 3 and got[0] != before


def test_what_build_and_held_functions_reach_is_read_too():
    global ACT_GAIN, LOSS_GAIN, DECORATED_GAIN
    g = Weighted(Holds())
    changes = [
        lambda: globals().update(ACT_GAIN=2.0),  # read by a function held as an attribute
        lambda: globals().update(DECORATED_GAIN=3.0),  # read by a decorated helper
        lambda: setattr(Weighted, "weight", 0.5),  # a Graph class attribute build's helper reads
        lambda: globals().update(LOSS_GAIN=4.0),  # a global build's helper reads
    ]
    try:
        each_change_seen(g, changes, lambda: eager(g.m) * Weighted.weight * LOSS_GAIN)
    finally:
        ACT_GAIN = LOSS_GAIN = DECORATED_GAIN = Weighted.weight = 1.0


def test_what_a_forward_reaches_through_super_a_child_and_a_helper_is_read_too():
    global OFFSET_OF_BASE, HELPER_GAIN
    m = Derived()
    g = Sum(m)
    changes = [
        lambda: setattr(Base, "scale", 2.0),  # the base class's, read by super().forward
        lambda: globals().update(OFFSET_OF_BASE=1.0),  # the base's forward's global
        lambda: setattr(Part, "k", 3.0),  # read by the child's project only
        lambda: globals().update(HELPER_GAIN=0.5),  # read by the helper function only
        lambda: setattr(Derived, "forward", lambda self, x: x * 4.0),  # set on the class
    ]
    try:
        each_change_seen(g, changes, lambda: eager(m))
    finally:
        Base.scale, Part.k, OFFSET_OF_BASE, HELPER_GAIN = 1.0, 1.0, 0.0, 1.0
        Derived.forward = _derived_forward


_derived_forward = Derived.forward


class Configured(nn.Module):
    """Reads a dict's item, a list's item and a record's attribute its instance holds (each
    compared by identity)."""

    def __init__(self):
        super().__init__()
        self.cfg = {"scale": 2.0}
        self.shifts = [0.0]
        self.opts = types.SimpleNamespace(gain=1.0)

    def forward(self, x):
        return (x * self.cfg["scale"] + self.shifts[0]) * self.opts.gain


class Logged(Sum):
    """A Graph keeping the loop's history, and a method the loop calls to add to it."""

    def __init__(self, model):
        super().__init__(model)
        self.history = []

    def record(self, loss):
        self.history.append(float(loss))


def test_a_list_the_loop_appends_to_compiles_nothing_anew(counted):
    """Lists neither build nor forward reads (the Graph's history, a module's log), grown
    every step: no walk, no compile per step."""
    takes, compiles = counted
    m = Configured()
    m.log = []
    g = Logged(m)
    for _ in range(5):
        g.record(g.step(af.tensor(X)))
        m.log.append(len(g.history))
    assert len(compiles) == 1 and len(takes) == 2 and g.history == [12.0] * 5


SEEN = 0  # (the loop's counter, read by note_step)


def note_step(out):  # (a helper build calls behind a flag)
    print("step", SEEN, out)


class Flagged(Sum):
    debug = False

    def build(self, x):
        out = self.m(x).sum()
        if self.debug:
            note_step(out)
        return out


def test_a_name_changed_every_step_warns_once_at_its_third_compile():
    """A compiled step holds what its code read: a helper that build may call reading the
    loop's counter compiles every step anew; the third compile it causes says so, once."""
    global SEEN
    try:
        for way in ("step", "run"):
            g = Flagged(nn.Identity())
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                for k in range(8):
                    SEEN = k
                    if way == "step":
                        assert float(g.step(af.tensor(X))) == 6.0
                    else:
                        assert float(next(iter(g.run([X])))) == 6.0
            said = [w for w in seen if issubclass(w.category, RuntimeWarning)]
            assert len(said) == 1 and "'SEEN' changed" in str(said[0].message)
            assert said[0].filename == __file__  # (pointing at the call here)
    finally:
        SEEN = 0


class Busy(nn.Module):
    """A forward reading what a lookup on its class would bind afresh (a classmethod, a
    property) or find on no class (a dunder): the same entries every step."""

    factor = 2.0

    @classmethod
    def scale_of(cls, x):
        return x * cls.factor

    @property
    def shift(self):
        return SHIFT

    def forward(self, x):
        assert type(self).__name__ == "Busy"
        return self.scale_of(x) + self.shift + SHIFT


def test_a_forward_reading_methods_and_dunders_costs_no_walk_per_step(counted):
    takes, compiles = counted
    busy = Busy()
    busy.sizes, busy.cfg = (1, 2), {"unread": [1, 2]}  # (a tuple, a dict left as it is)
    g = Sum(busy)
    for _ in range(6):
        assert float(g.step(af.tensor(X))) == 12.0
    assert len(compiles) == 1 and len(takes) == 2  # (taken at the first step, and after)
    assert [k for c, k, _ in g._traced.classes if c is Busy] == [
        "factor",
        "forward",
        "scale_of",
        "shift",
    ]


class Odd(nn.Module):
    """A class whose dict holds an object that raises KeyError for any unknown attribute."""

    class AttrDict(dict):
        __getattr__ = dict.__getitem__

    cfg = AttrDict(scale=2.0)

    def forward(self, x):
        return x * self.cfg["scale"]


def test_odd_classes_compile_as_before():
    """A class-level object with a __getattr__ raising KeyError, a class without a
    __module__, a class whose metaclass makes it unhashable, a property held by an
    instance."""

    class Meta(type(nn.Module)):
        def __eq__(cls, other):
            return cls is other

        __hash__ = None  # type: ignore[assignment]

    class Unhashable(nn.Identity, metaclass=Meta):
        pass

    nameless = type("Nameless", (nn.Identity,), {"__module__": None})
    holding = nn.Identity()
    holding.prop = property(lambda self: 1.0)  # (an odd instance attribute)
    for m in (Odd(), nameless(), Unhashable(), holding):
        g = Sum(m)
        assert both(g)[0] == eager(m) and both(g)[0] == float(g.step(af.tensor(X)))


def train_two(opt_name, kwargs, data, grow_at, graph, grow):
    """A model of two linears trained on ``data`` with an optimizer of the first one's
    parameters, given the second one's from step ``grow_at`` (``grow``: in a group of their
    own, ``add_param_group``, or added to the first group's list)."""
    af.manual_seed(0)
    a, b = nn.Linear(4, 3), nn.Linear(3, 2)
    opt = getattr(optim, opt_name)(a.parameters(), **kwargs)

    class Two(nn.Graph):
        def __init__(self):
            super().__init__()
            self.a, self.b = a, b
            self.add_optimizer(opt)

        def build(self, x):
            loss = (self.b(self.a(x)) ** 2).mean()
            loss.backward()
            return loss

    g = Two()
    losses = []
    for i, x in enumerate(data):
        if i == grow_at and grow == "group":
            opt.add_param_group({"params": list(b.parameters())})
        elif i == grow_at:
            opt.param_groups[0]["params"] += list(b.parameters())
        if graph == "step":
            losses.append(float(g.step(af.tensor(x))))
        elif graph == "run":
            losses += [float(v) for v in g.run([x])]
        else:
            opt.zero_grad()
            loss = (b(a(af.tensor(x))) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses, [p.numpy() for p in list(a.parameters()) + list(b.parameters())]


@pytest.mark.parametrize("grow", ["group", "list"])
@pytest.mark.parametrize(
    "opt_name,kwargs", [("SGD", dict(lr=0.1, momentum=0.9)), ("Adam", dict(lr=0.05))]
)
def test_an_optimizer_given_more_parameters_compiles_the_step_anew(opt_name, kwargs, grow):
    data = [np.random.default_rng(i).standard_normal((5, 4)).astype(np.float32) for i in range(4)]
    want, want_params = train_two(opt_name, kwargs, data, 2, "eager", grow)
    for mode in ("step", "run"):
        got, params = train_two(opt_name, kwargs, data, 2, mode, grow)
        assert got == want, mode
        for p, q in zip(params, want_params, strict=True):
            assert np.array_equal(p, q), mode


def test_an_unchanged_graph_costs_no_walk_of_its_modules_per_step(counted):
    """Per step, what build read is checked by a count of changes and a few comparisons:
    the modules are walked again (a new _Traced) only after something changed, and the
    step compiles again only when what changed is something build read."""
    takes, compiles = counted
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = optim.SGD(m.parameters(), lr=0.1)
    g = Train(m, opt)
    x = af.tensor(X)
    g.step(x)
    assert len(compiles) == 1
    del takes[:]
    for _ in range(5):
        g.step(x)
    assert takes == [] and len(compiles) == 1
    for i in range(3):
        opt.param_groups[0]["lr"] = 0.1 / (i + 2)  # a schedule: the step reads the
        g.step(x)  # rate as state, compiles nothing
    assert len(compiles) == 1 and takes == []
    for i in range(3):
        opt.param_groups[0]["weight_decay"] = 0.1 * (i + 1)  # another option: a compile per
        g.step(x)  # value, each taking what build
    assert len(compiles) == 4 and len(takes) == 3  # read after
    unrelated = nn.Linear(2, 2)  # some other module changes...
    unrelated.weight = nn.Parameter(af.zeros(2, 2))
    g.step(x)
    assert len(takes) == 4 and len(compiles) == 4  # ...one walk, the same step kept
    g.step(x)
    assert len(takes) == 4 and len(compiles) == 4
    for i in range(3):
        g.steps_done = i  # the loop's counter on the Graph:
        g.step(x)  # build does not read it
    assert len(compiles) == 4 and len(takes) == 4  # (nor is the model walked again)
    m[2] = nn.Linear(4, 1)  # what build reads changes
    g.step(x)
    assert len(compiles) == 5


def test_a_change_while_run_goes_on_stops_it_with_the_reason():
    m = nn.Linear(3, 1)
    opt = optim.SGD(m.parameters(), lr=0.1)
    g = Train(m, opt)
    for fused in (False, True):
        got = []
        with pytest.raises(
            af.TraceError,
            match=r"changed while the run was going .*piece 0"
            r".*between runs",
        ):
            for v in g.run([X] * 6, fused=fused):
                got.append(float(v))
                m.weight = nn.Parameter(af.zeros(1, 3))
        assert len(got) == 1
        with pytest.raises(af.TraceError, match="hyperparameters changed"):
            for _ in g.run([X] * 6, fused=fused):
                opt.param_groups[0]["lr"] *= 0.5
    assert len(list(g.run([X] * 3))) == 3  # and the next run goes on


# -- captured tensors are read live -----------------------------------------------------------

SCALE = af.tensor(2.0)


def test_a_captured_tensor_is_read_live_by_step_and_run():
    SCALE.fill_(2.0)
    closed = af.tensor(1.0)

    class Captures(nn.Graph):
        def __init__(self):
            super().__init__()
            self.shift = af.tensor(0.0)  # a plain tensor: not a buffer

        def build(self, x):
            doubled = closed * 2  # eager ops on it are recorded too
            return (x * SCALE * doubled + self.shift).sum()

    g = Captures()
    assert both(g) == (24.0, 24.0, 24.0)
    SCALE.fill_(3.0)
    closed.fill_(2.0)
    g.shift.fill_(1.0)
    want = float((af.tensor(X) * SCALE * (closed * 2) + g.shift).sum())
    assert want == 78.0 and both(g) == (want, want, want)


def test_a_captured_tensor_a_failed_op_poisoned_raises_its_error():
    bad = af.tensor([1.0, 2.0])
    g = Sum(nn.Identity())
    g.build = lambda x: x.sum() + bad.sum()  # captures ``bad``
    assert float(g.step(af.tensor([1.0]))) == 4.0
    bad[af.tensor([0])] = af.tensor([5.0])
    bad.copy_(af.tensor([1.0, 2.0])[af.tensor([7, 0])])  # an index out of bounds: poisoned
    with pytest.raises(af.IndexOutOfBoundsError):
        bad.numpy()  # reported once (synchronize is
    af.synchronize()  # quiet now)...
    with pytest.raises(af.IndexOutOfBoundsError):
        g.step(af.tensor([1.0]))  # ...but never read stale values
    bad.fill_(1.0)  # written whole: usable again
    assert float(g.step(af.tensor([1.0]))) == 3.0


def test_a_captured_tensor_that_requires_grad_keeps_its_grad():
    w = af.tensor([1.0, 2.0, 3.0], requires_grad=True)
    m = nn.Linear(3, 1)
    opt = optim.SGD(m.parameters(), lr=0.1)

    class Train(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self, x):
            loss = self.m(x * w).sum()
            loss.backward()
            return loss

    Train().step(af.tensor(X))
    assert w.grad is None  # not a traced placeholder
    (w * 2).sum().backward()
    assert w.grad.numpy().tolist() == [2.0, 2.0, 2.0]


# -- in-place ops in build are refused, saying so ---------------------------------------------

INPLACE = {
    "add_": (lambda y: y.add_(1.0), "add_scalar"),
    "+=": (lambda y: y.__iadd__(1.0), "add_scalar"),
    "mul_": (lambda y: y.mul_(y), "mul"),
    "fill_": (lambda y: y.fill_(0.0), "full"),
    "zero_": (lambda y: y.zero_(), "full"),
    "copy_": (lambda y: y.copy_(af.ones(2, 3)), "copy"),
    "setitem": (lambda y: y.__setitem__(0, 1.0), "full"),
}


@pytest.mark.parametrize("form", sorted(INPLACE))
def test_inplace_ops_in_build_are_refused_naming_the_op_and_the_fix(form):
    write, op = INPLACE[form]

    class InPlace(nn.Graph):
        def build(self, x):
            y = x * 2
            write(y)
            return y.sum()

    with pytest.raises(af.TraceError) as info:
        InPlace().step(af.tensor(X))
    text = str(info.value)
    assert text.startswith("InPlace.build: in-place ops are refused in a traced function")
    assert f"op '{op}'" in text and "computed by op 'mul_scalar'" in text
    assert "shape (2, 3) and dtype float32" in text  # (x[0] = v: a view into it)
    assert "y = x + 1 instead of x.add_(1) or x += 1" in text


def test_inplace_writes_into_a_captured_tensor_are_refused():
    counter = af.zeros(())

    class Counts(nn.Graph):
        def build(self, x):
            counter.add_(1.0)  # eager: once per call
            return x.sum()

    with pytest.raises(
        af.TraceError,
        match=r"op 'add_scalar'.*captured from outside the "
        r"traced function.*reads but never writes",
    ):
        Counts().step(af.tensor(X))
    assert float(counter) == 0.0  # nothing ran while tracing


# -- one error for one fault: eager, step() and run() -----------------------------------------


class Divides(nn.Graph):
    """A step whose first op to fail on a zero divisor is ``floor_divide``, recorded behind
    a chain of ops, and then ``remainder``, which reads the inputs only."""

    def __init__(self, model, opt):
        super().__init__()
        self.m = model
        self.add_optimizer(opt)

    def build(self, x, n, d):
        t = ((n * 2 + 1) * 3 + 1) * 2 + 1
        q = af.floor_divide(t, d) + af.remainder(n, d)
        loss = (self.m(x) * q.float()).sum()
        loss.backward()
        return loss


def eager_divides(model, opt, n, d):
    """Divides' step in eager mode."""
    opt.zero_grad()
    t = af.tensor(n) * 2 + 1
    t = (t * 3 + 1) * 2 + 1
    q = af.floor_divide(t, af.tensor(d)) + af.remainder(af.tensor(n), af.tensor(d))
    loss = (model(af.tensor(X)) * q.float()).sum()
    loss.backward()
    opt.step()
    return loss.item()


def test_a_failing_op_in_step_raises_eager_modes_error_and_changes_nothing():
    n, good, bad = np.array([1, 2]), np.array([1, 1]), np.array([1, 0])
    af.manual_seed(0)
    m2 = nn.Linear(3, 1)
    opt2 = optim.Adam(m2.parameters(), lr=0.1)
    want = [eager_divides(m2, opt2, n, good) for _ in range(2)]
    af.manual_seed(0)
    m = nn.Linear(3, 1)
    opt = optim.Adam(m.parameters(), lr=0.1)
    g = Divides(m, opt)
    assert float(g.step(X, n, good)) == want[0]
    before = [p.numpy().copy() for p in m.parameters()]
    state = [
        {k: (v if k == "step" else v.numpy().copy()) for k, v in opt.state[p].items()}
        for p in m.parameters()
    ]
    with pytest.raises(af.KernelError) as eager_info:  # eager mode's error for the fault
        af.floor_divide(af.tensor(n) * 2 + 1, af.tensor(bad)).numpy()
    with pytest.raises(af.KernelError) as info:
        g.step(X, n, bad)
    e = info.value
    assert isinstance(e, af.DivisionByZeroError) and type(e) is type(eager_info.value)
    assert e.op == eager_info.value.op == "floor_divide" and e.intact
    assert isinstance(e.original, af.DivisionByZeroError) and e.__cause__ is e.original
    assert "op 'floor_divide' failed on cpu" in str(e)
    assert (
        "nothing was written back: the parameters, buffers and optimizer state keep "
        "their values" in str(e)
    )
    for p, b, st in zip(m.parameters(), before, state, strict=True):  # nothing half-updated
        assert np.array_equal(p.numpy(), b)
        assert opt.state[p]["step"] == st["step"] == 1
        assert np.array_equal(opt.state[p]["exp_avg"].numpy(), st["exp_avg"])
    # the graph and the module go on: as eager steps that skipped the bad batch
    assert float(g.step(X, n, good)) == want[1]
    for p, q in zip(m.parameters(), m2.parameters(), strict=True):
        assert np.array_equal(p.numpy(), q.numpy())


def test_run_names_the_op_step_names_and_the_graph_goes_on():
    m = nn.Linear(3, 1)
    opt = optim.SGD(m.parameters(), lr=0.1)
    g = Divides(m, opt)
    n, good, bad = np.array([1, 2]), np.array([1, 1]), np.array([1, 0])
    for fused in (False, True):
        with pytest.raises(af.ActorError) as info:
            list(g.run([(X, n, good), (X, n, bad), (X, n, good)], fused=fused))
        e = info.value
        assert isinstance(e, af.DivisionByZeroError) and e.piece == 1
        assert e.actor == ("step" if fused else "floor_divide")
        assert isinstance(e.original, af.KernelError) and e.original.op == "floor_divide"
        assert "op 'floor_divide' failed on cpu" in str(e)
    assert len(list(g.run([(X, n, good)] * 3))) == 3


def test_an_index_out_of_bounds_names_one_op_in_eager_mode_step_and_run():
    """The op that reads the labels fails first in program order; in a run, its gradient's
    actor (fed by the inputs alone) acts before it: run() still names the op step() and
    eager mode name."""
    m = nn.Linear(5, 3)
    opt = optim.SGD(m.parameters(), lr=0.1)

    class Picks(nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = self.m(x)[af.arange(2), y].sum()
            loss.backward()
            return loss

    g = Picks()
    x, good, bad = np.ones((2, 5), np.float32), np.array([0, 1]), np.array([0, 7])
    g.step(x, good)
    with pytest.raises(af.KernelError) as eager_info:
        with af.no_grad():
            float(m(af.tensor(x))[af.arange(2), af.tensor(bad)].sum())
    with pytest.raises(af.KernelError) as step_info:
        g.step(x, bad)
    with pytest.raises(af.ActorError) as run_info:
        list(g.run([(x, good), (x, bad)]))
    op = eager_info.value.op
    assert step_info.value.op == op and run_info.value.original.op == op
    assert run_info.value.actor == op and run_info.value.piece == 1
    assert isinstance(step_info.value, IndexError) and isinstance(run_info.value, IndexError)
    assert "7" in str(step_info.value) and "7" in str(run_info.value)
    w = m.weight.numpy().copy()
    g.step(x, good)  # and the graph goes on
    assert not np.array_equal(m.weight.numpy(), w)


# -- run() takes ActorGraph.run's arguments ---------------------------------------------------


def test_run_takes_engine_and_timeout():
    g = Sum(nn.Linear(3, 1))
    assert len(list(g.run([X] * 2, engine="local"))) == 2
    for engine in ("ray", af.distributed.RayEngine()):
        with pytest.raises(
            af.PlanError,
            match=r"Sum.run\(engine=.*parameters and optimizer "
            r"state across pieces.*engine='local'",
        ):
            list(g.run([X], engine=engine))
    with pytest.raises(ValueError, match="the engines are 'local' and 'ray'"):
        list(g.run([X], engine="elsewhere"))
    with pytest.raises(ValueError, match="timeout=-1"):
        list(g.run([X], timeout=-1))

    def slow_loader():
        yield X
        time.sleep(2.0)  # a loader that hangs on item 1
        yield X

    for fused in (False, True):
        got = []
        with pytest.raises(af.ActorError, match="took longer than timeout=0.5") as info:
            for v in g.run(slow_loader(), timeout=0.5, fused=fused):
                got.append(float(v))
        assert isinstance(info.value.original, TimeoutError) and info.value.piece == 1
        assert len(got) <= 1
        assert len(list(g.run([X] * 3, timeout=30, fused=fused))) == 3
