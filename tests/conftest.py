import pytest

import actorflow as af

pytest_plugins = ["pytester"]


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
