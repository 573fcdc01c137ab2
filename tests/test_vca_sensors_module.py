"""vca_sensors on the simulator's tree."""

from __future__ import annotations

from conftest import run_module
from vcasim.model import NodeModel


def test_module_reads_the_simulated_node(sim_tree, sim_params, capsys):
    model = NodeModel.from_params(sim_params, "stock")
    model.temp_c = 81.0
    sim_tree.publish(model)
    (sim_tree.rapl / "constraint_0_power_limit_uw").write_text("35000000\n")
    result = run_module("vca_sensors", {"sysfs_root": str(sim_tree.root), "sample_seconds": 0}, capsys)
    sensors = result["sensors"]
    assert result["changed"] is False
    assert sensors["platform"] == "lab"
    assert sensors["hottest_core_c"] == 81.0 and sensors["package_temp_c"] == 81.0
    assert sensors["limits"]["long_term"]["power_limit_w"] == 35.0
    assert sensors["package_power_w"] is None      # not sampled


def test_missing_sensors_are_absent_not_zero(tmp_path, capsys):
    (tmp_path / "class/hwmon").mkdir(parents=True)
    result = run_module("vca_sensors", {"sysfs_root": str(tmp_path), "sample_seconds": 1}, capsys)
    sensors = result["sensors"]
    assert sensors["hottest_core_c"] is None and sensors["package_power_w"] is None
    assert sensors["temperatures_c"] == {} and sensors["limits"] == {}


def test_negative_sample_is_refused(tmp_path, capsys):
    result = run_module("vca_sensors", {"sysfs_root": str(tmp_path), "sample_seconds": -1}, capsys)
    assert result["failed"] and "sample_seconds" in result["msg"]
