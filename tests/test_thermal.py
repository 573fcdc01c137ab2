"""The thermal guard fails closed: no sensor, no probe, outside the lab and without the override."""

from __future__ import annotations

import re

import pytest
from ansible.module_utils.vca_sensors import LAB_MARKER
from ansible.module_utils.vca_thermal import NoThermalSensor, ThermalAbort, ThermalGuard

from conftest import ROOT, run_module


def no_sensor():
    return None


@pytest.mark.parametrize("platform", ["unknown", "hardware"])
def test_no_sensor_outside_the_lab_stops_the_probe_before_it_starts(platform):
    guard = ThermalGuard(read=no_sensor, platform=platform, interval_s=0.01)
    with pytest.raises(NoThermalSensor, match=platform):
        with guard:
            pytest.fail("the probe ran without a sensor")
    assert guard._thread is None and guard.record()["sensor"] == "absent"


def test_no_sensor_in_the_lab_runs_and_says_so():
    with ThermalGuard(read=no_sensor, platform="lab", interval_s=0.01) as guard:
        guard.check()
    assert guard.record() == {"limit_c": 90.0, "max_seen_c": None, "samples": 0, "sensor": "absent",
                              "allow_no_sensor": False}


def test_override_runs_blind_and_the_record_says_so():
    with ThermalGuard(read=no_sensor, platform="unknown", allow_no_sensor=True, interval_s=0.01) as guard:
        guard.check()
    record = guard.record()
    assert record["sensor"] == "absent" and record["allow_no_sensor"] is True


def test_sensor_lost_mid_run_stops_the_probe():
    temps = iter([60.0, None])
    guard = ThermalGuard(read=lambda: next(temps), platform="hardware")
    guard.sample()
    guard.check()
    guard.sample()
    with pytest.raises(NoThermalSensor):
        guard.check()


def test_hot_at_entry_raises_before_the_sampling_thread_starts():
    guard = ThermalGuard(read=lambda: 95.0, platform="hardware")
    with pytest.raises(ThermalAbort):
        guard.__enter__()
    assert guard._thread is None


def test_a_hot_node_is_pointed_at_the_fan_shrouds():
    with pytest.raises(ThermalAbort, match=r"reached 95\.0 C \(limit 90\.0 C\); cooling: .*shrouds/README\.md") as exc:
        ThermalGuard(read=lambda: 95.0, platform="hardware").__enter__()
    pointed = re.search(r"(\S+/README\.md)", str(exc.value)).group(1)
    assert (ROOT / pointed).is_file()


def test_platform_is_looked_up_under_the_root_when_not_given(tmp_path):
    with pytest.raises(NoThermalSensor, match="unknown"):
        with ThermalGuard(str(tmp_path)):
            pass
    (tmp_path / LAB_MARKER).write_text("test tree\n")
    with ThermalGuard(str(tmp_path)) as guard:
        guard.check()
    assert guard.platform == "lab" and guard.record()["sensor"] == "absent"


def gemm_args(tmp_path, **kw):
    args = {"backend": "opencl", "kernel": "shipped", "sizes": [32], "kernel_dir": str(ROOT / "roles/probes/files"),
            "cache_path": str(tmp_path / "tune.json"), "sysfs_root": str(tmp_path / "nosys")}
    args.update(kw)
    return args


def test_gemm_without_a_sensor_on_an_unknown_platform_does_not_run(tmp_path, capsys):
    result = run_module("vca_gemm", gemm_args(tmp_path), capsys)
    assert result["failed"] is True and "no coretemp sensor" in result["msg"]
    assert "record" not in result and result["platform"] == "unknown"
    assert result["thermal"]["sensor"] == "absent"


def test_gemm_allow_no_sensor_runs_and_the_record_says_so(tmp_path, capsys):
    result = run_module("vca_gemm", gemm_args(tmp_path, allow_no_sensor=True), capsys)
    assert result.get("failed") is not True, result.get("msg")
    record = result["record"]
    assert record["platform"] == "unknown" and record["results"][0]["verification"]["passed"]
    assert record["thermal"]["sensor"] == "absent" and record["thermal"]["allow_no_sensor"] is True
