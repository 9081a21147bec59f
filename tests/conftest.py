import pytest

import actorflow as af

pytest_plugins = ["pytester", "cuda_fixtures"]  # cuda_fixtures: emu, cuda (tests/)


@pytest.fixture(autouse=True)
def _clean_vm():
    """Every test starts and ends with a quiet VM: normal dispatch, no budgets, no latency,
    and no kernel error left unreported (a test that leaves one fails here)."""
    vm = af.lowlevel.get_vm()
    yield vm
    vm.set_test_hooks(None)
    af.lowlevel.set_null_latency(0.0)
    for dev in ("cpu", "null"):
        af.lowlevel.set_memory_budget(dev, None)
    vm.synchronize()


@pytest.fixture
def random_dispatch():
    """Seeded random dispatch order with random kernel delays; restored afterwards."""
    vm = af.lowlevel.get_vm()

    def enable(seed: int, max_delay: float = 0.002):
        vm.set_test_hooks(seed=seed, max_delay=max_delay)

    yield enable
    vm.set_test_hooks(None)


@pytest.fixture(scope="module")
def ray_engine(request):
    """A local Ray cluster of 2 CPUs (and the module's ``RAY_RESOURCES``) started for a test
    module, and a RayEngine on it; its workers import the tests' modules. Skipped where Ray
    is not installed."""
    ray = pytest.importorskip("ray", reason="engine='ray' needs Ray: pip install 'actorflow[ray]'")
    ray.shutdown()
    init = {"num_cpus": 2, "resources": getattr(request.module, "RAY_RESOURCES", {})}
    eng = af.distributed.RayEngine(init=init)
    eng.start()
    yield eng
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (``-n 2 --dist loadgroup``, the README's command), every Ray test
    runs in one worker: one local Ray cluster at a time, while the other worker runs the
    rest of the suite."""
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))
