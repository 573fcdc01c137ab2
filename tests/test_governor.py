"""vca_governor on the simulator's cpufreq tree: set, idempotent, check mode, refused, read back, boot unit."""

from __future__ import annotations

import pytest
from ansible.module_utils.vca_governor import main as boot_main
from ansible.module_utils.vca_sysfs import Sysfs

from conftest import run_module

CPUS = 8   # the simulated node: 4 cores, 2 threads each


def governor_files(tree):
    return sorted(tree.root.glob("devices/system/cpu/cpu*/cpufreq/scaling_governor"))


def read_governors(tree):
    return {f.read_text().strip() for f in governor_files(tree)}


def args(tree, **kw):
    return {"sysfs_root": str(tree.root), "node": "vca-node4", **kw}


def test_sets_every_cpu_then_changes_nothing(sim_tree, capsys):
    assert len(governor_files(sim_tree)) == CPUS and read_governors(sim_tree) == {"powersave"}
    result = run_module("vca_governor", args(sim_tree), capsys)
    assert result["changed"] is True and len(result["changes"]) == CPUS
    assert result["changes"][0] == "cpu0: powersave -> performance"
    assert read_governors(sim_tree) == {"performance"}
    again = run_module("vca_governor", args(sim_tree), capsys)
    assert again["changed"] is False and again["changes"] == []


def test_only_the_cpus_that_differ_are_written(sim_tree, capsys):
    run_module("vca_governor", args(sim_tree), capsys)
    (sim_tree.root / "devices/system/cpu/cpu5/cpufreq/scaling_governor").write_text("powersave\n")
    result = run_module("vca_governor", args(sim_tree), capsys)
    assert result["changes"] == ["cpu5: powersave -> performance"]


def test_check_mode_writes_nothing(sim_tree, capsys):
    result = run_module("vca_governor", args(sim_tree, _ansible_check_mode=True), capsys)
    assert result["changed"] is True and read_governors(sim_tree) == {"powersave"}


def test_a_governor_the_driver_does_not_offer_fails_before_any_write(sim_tree, capsys):
    result = run_module("vca_governor", args(sim_tree, governor="ondemand"), capsys)
    assert result["failed"] and "offers performance, powersave, not ondemand" in result["msg"]
    assert "vca-node4" in result["msg"] and read_governors(sim_tree) == {"powersave"}


def test_no_cpufreq_is_a_failure_naming_the_directory(tmp_path, capsys):
    (tmp_path / "devices/system/cpu/cpu0").mkdir(parents=True)
    result = run_module("vca_governor", {"sysfs_root": str(tmp_path)}, capsys)
    assert result["failed"] and f"no CPU has cpufreq under {tmp_path}/devices/system/cpu" in result["msg"]


def test_a_write_that_does_not_hold_fails(sim_tree, capsys, monkeypatch):
    monkeypatch.setattr(Sysfs, "write", lambda self, rel, value: None)
    result = run_module("vca_governor", args(sim_tree), capsys)
    assert result["failed"] and "wrote performance to" in result["msg"] and "reads back powersave" in result["msg"]


@pytest.mark.parametrize("argv, rc", [(["performance"], 0), (["ondemand"], 1), ([], 2)])
def test_boot_unit_entry_point(sim_tree, capsys, argv, rc):
    assert boot_main([*argv, str(sim_tree.root)] if argv else []) == rc
    out = capsys.readouterr()
    if rc == 0:
        assert "every CPU runs performance" in out.out and read_governors(sim_tree) == {"performance"}
    else:
        assert read_governors(sim_tree) == {"powersave"} and out.err
