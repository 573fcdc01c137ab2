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
    code = compile("from .vca_sysfs import Sysfs\nfrom . import vca_dma_abi as abi\nimport os\n",
                   "ansible.module_utils.vca_dma", "exec")
    assert list(strategy.relative_imports(code)) == [
        "ansible.module_utils.vca_sysfs", "ansible.module_utils.vca_sysfs.Sysfs",
        "ansible.module_utils", "ansible.module_utils.vca_dma_abi"]


def test_a_module_gets_the_module_utils_its_module_utils_import():
    load_strategy()
    assert {"ansible.module_utils.vca_power_cap", "ansible.module_utils.vca_sensors",
            "ansible.module_utils.vca_sysfs"} <= shipped("vca_power_cap")
    assert {"ansible.module_utils.vca_dma_abi", "ansible.module_utils.vca_ring_plan",
            "ansible.module_utils.vca_thermal"} <= shipped("vca_dma")
