"""The simulator's sysfs tree, read back through the same module_utils the modules use."""

from __future__ import annotations

import pytest
from ansible.module_utils.vca_sensors import (
    coretemp,
    package_power_w,
    rapl_package_zone,
    read_all,
    throttle_counts,
)
from ansible.module_utils.vca_sysfs import Sysfs

from vcasim.load import LoadMeter
from vcasim.model import NodeModel


def test_tree_has_the_kernel_layout(sim_tree):
    root = sim_tree.root
    assert (root / "class/hwmon/hwmon1/name").read_text().strip() == "coretemp"
    assert (root / "class/hwmon/hwmon0/name").read_text().strip() == "acpitz"
    rapl = root / "class/powercap/intel-rapl:0"
    assert (rapl / "constraint_0_name").read_text().strip() == "long_term"
    assert (rapl / "constraint_1_name").read_text().strip() == "short_term"
    assert int((rapl / "constraint_0_power_limit_uw").read_text()) == 45_000_000
    assert len(list((root / "devices/system/cpu").glob("cpu*/thermal_throttle/core_throttle_count"))) == 8


def test_published_model_reads_back_through_the_sensor_readers(sim_tree, sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    model.temp_c = 80.25
    model.core_events = [3, 0, 1, 0]
    model.package_events = 2
    sim_tree.publish(model)
    sysfs = Sysfs(sim_tree.root)
    temps = coretemp(sysfs)
    assert temps["Package id 0"] == pytest.approx(80.25, abs=0.001)
    assert temps["Core 0"] == pytest.approx(80.25, abs=0.001)
    assert temps["Core 2"] == pytest.approx(78.25, abs=0.001)
    counts = throttle_counts(sysfs)
    # 8 logical CPUs, 4 physical cores: siblings are counted once.
    assert counts == {"core": {"0:0": 3, "0:1": 0, "0:2": 1, "0:3": 0}, "package": {"0": 2}}


def test_written_limits_are_read_by_name_not_index(sim_tree):
    rapl = sim_tree.rapl
    # Swap the constraint order as some kernels expose it.
    (rapl / "constraint_0_name").write_text("short_term\n")
    (rapl / "constraint_1_name").write_text("long_term\n")
    (rapl / "constraint_1_power_limit_uw").write_text("35000000\n")
    (rapl / "constraint_0_power_limit_uw").write_text("40000000\n")
    limits = sim_tree.read_limits()
    assert (limits.pl1_w, limits.pl2_w) == (35.0, 40.0)


def test_create_keeps_limits_someone_wrote(sim_tree):
    (sim_tree.rapl / "constraint_0_power_limit_uw").write_text("35000000\n")
    sim_tree.create()
    assert sim_tree.read_limits().pl1_w == 35.0


def test_restore_continues_counters_after_a_restart(sim_tree, sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    model.energy_uj, model.core_events, model.package_events = 123456, [1, 2, 3, 4], 5
    sim_tree.publish(model)
    fresh = NodeModel.from_params(sim_params, "stock")
    sim_tree.restore(fresh)
    assert (fresh.energy_uj, fresh.core_events, fresh.package_events) == (123456, [1, 2, 3, 4], 5)


def test_read_all_reports_lab_platform_limits_and_power(sim_tree):
    result = read_all(sim_tree.root, sample_seconds=0.05)
    assert result["platform"] == "lab"
    assert result["limits"]["long_term"] == {"power_limit_w": 45.0, "time_window_s": 27.983872}
    assert result["limits"]["short_term"]["power_limit_w"] == 56.25
    assert result["rapl_enabled"] is True
    assert result["package_power_w"] == 0.0        # nothing advanced the counter
    assert rapl_package_zone(Sysfs(sim_tree.root)) == "class/powercap/intel-rapl:0"


@pytest.mark.parametrize("before, after, watts", [
    (1_000_000, 43_600_000, 42.6),                       # plain
    (262143328850 - 5_000_000, 37_600_000, 42.6),        # across the counter wrap
])
def test_package_power_is_energy_mod_range_over_time(sim_tree, before, after, watts):
    sysfs = Sysfs(sim_tree.root)
    zone = rapl_package_zone(sysfs)
    readings = iter([before, after])
    clock = iter([10.0, 11.0])

    def sleep(_):
        (sim_tree.rapl / "energy_uj").write_text(f"{next(readings)}\n")

    sleep(0)
    power = package_power_w(sysfs, zone, 1.0, clock=lambda: next(clock), sleep=sleep)
    assert power == pytest.approx(watts)


class FakeUsage:
    cpus = 2

    def __init__(self, values):
        self.values = iter(values)

    def seconds(self):
        return next(self.values)


def test_load_meter_is_cpu_seconds_per_second_over_cpus():
    clock = iter([0.0, 1.0, 2.0, 3.0])
    meter = LoadMeter(FakeUsage([0.0, 1.0, 3.0, 10.0]), clock=lambda: next(clock))
    assert meter.sample() == pytest.approx(0.5)   # 1 CPU-second in 1 s over 2 CPUs
    assert meter.sample() == pytest.approx(1.0)   # 2 CPU-seconds: fully loaded
    assert meter.sample() == pytest.approx(1.0)   # clamped
