"""strategy_plugins/mitogen_linear.py: mitogen ships every module_utils file a module needs,
those our module_utils import relatively included (without the fix, vca_power_cap failed on the
nodes with ModuleNotFoundError: ansible.module_utils.vca_sensors)."""

import importlib.util
from pathlib import Path

import ansible.module_utils
from ansible_mitogen import module_finder

ROOT = Path(__file__).resolve().parents[1]


def load_strategy():
    spec = importlib.util.spec_from_file_location("vca_mitogen_linear", ROOT / "strategy_plugins/mitogen_linear.py")
    strategy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(strategy)
    return strategy


def shipped(module):
    names = module_finder.scan("ansible.modules." + module, str(ROOT / "library" / (module + ".py")),
                               list(ansible.module_utils.__path__))
    return {name for name, _path, _pkg in names}


def test_relative_imports_are_named_from_the_module_package():
    strategy = load_strategy()
    source = "from .vca_sysfs import Sysfs\nfrom . import vca_dma_abi as abi\nfrom .sub.deep import x\nimport os\n"
    code = compile(source, "ansible.module_utils.vca_dma", "exec")
    names = list(strategy.relative_imports(code))
    # as a module's: its package's
    assert {"ansible.module_utils." + n for n in ("vca_sysfs", "vca_sysfs.Sysfs", "vca_dma_abi", "sub", "sub.deep",
                                                  "sub.deep.x")} <= set(names)
    # a package on the way comes before what is in it (mitogen looks its parent up)
    assert names.index("ansible.module_utils.sub") < names.index("ansible.module_utils.sub.deep")
    # as a package's __init__: the package itself
    assert "ansible.module_utils.vca_dma.vca_sysfs" in names
    assert not any(n.startswith("os") for n in names)


def test_a_module_gets_the_module_utils_its_module_utils_import():
    load_strategy()
    assert {"ansible.module_utils.vca_power_cap", "ansible.module_utils.vca_sensors",
            "ansible.module_utils.vca_sysfs"} <= shipped("vca_power_cap")
    assert {"ansible.module_utils.vca_dma_abi", "ansible.module_utils.vca_ring_plan",
            "ansible.module_utils.vca_thermal"} <= shipped("vca_dma")


def test_no_cpu_pinning_below_four_cpus(monkeypatch):
    strategy = load_strategy()
    from ansible_mitogen import affinity  # noqa: PLC0415

    pinned = affinity.LinuxPolicy()
    monkeypatch.setattr(affinity, "policy", pinned)
    assert type(strategy.affinity_policy(2)) is affinity.Policy   # the base class: every method does nothing
    assert type(strategy.affinity_policy(3)) is affinity.Policy
    assert strategy.affinity_policy(4) is pinned
