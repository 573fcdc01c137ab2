"""vca_power_cap on a fake powercap tree (the simulator's): set, idempotent, check, diff, locked, range."""

from __future__ import annotations

import errno
import json

import pytest
from ansible.module_utils.vca_power_cap import main as apply_main
from ansible.module_utils.vca_sysfs import Sysfs

from conftest import run_module
from vcasim.rapl import quantize_power_uw, quantize_window_us


def limit(tree, idx, field="power_limit_uw"):
    return int((tree.rapl / f"constraint_{idx}_{field}").read_text())


def cap_args(tree, tmp_path, **kw):
    args = {"sysfs_root": str(tree.root), "node": "vca-node4", "stock_file": str(tmp_path / "etc/stock.json")}
    args.update(kw)
    return args


def test_sets_pl1_pl2_in_watts_and_records_stock(sim_tree, tmp_path, capsys):
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35, pl2_w=40), capsys)
    assert result["changed"] is True
    assert (limit(sim_tree, 0), limit(sim_tree, 1)) == (35000000, 40000000)
    assert result["limits_w"]["long_term"]["power_limit_w"] == 35.0
    stock = json.loads((tmp_path / "etc/stock.json").read_text())
    assert stock["long_term"]["power_limit_uw"] == 45000000     # what the firmware had


def test_second_run_changes_nothing(sim_tree, tmp_path, capsys):
    run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35, pl2_w=40), capsys)
    again = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35, pl2_w=40), capsys)
    assert again["changed"] is False and again["changes"] == []


def test_check_mode_writes_nothing_and_diff_is_in_watts(sim_tree, tmp_path, capsys):
    args = cap_args(sim_tree, tmp_path, pl1_w=35, pl1_window_s=10, _ansible_check_mode=True, _ansible_diff=True)
    result = run_module("vca_power_cap", args, capsys)
    assert result["changed"] is True
    assert limit(sim_tree, 0) == 45000000 and not (tmp_path / "etc/stock.json").exists()
    assert "PL1 (long_term): 45 W" in result["diff"]["before"]
    assert "PL1 (long_term): 35 W, window 10 s" in result["diff"]["after"]


def test_constraints_are_found_by_name_not_index(sim_tree, tmp_path, capsys):
    for field in ("name", "power_limit_uw", "time_window_us", "max_power_uw"):
        a, b = (sim_tree.rapl / f"constraint_{i}_{field}" for i in (0, 1))
        ta, tb = a.read_text(), b.read_text()
        a.write_text(tb)
        b.write_text(ta)
    run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35, pl2_w=40), capsys)
    assert (limit(sim_tree, 1), limit(sim_tree, 0)) == (35000000, 40000000)


def test_null_restores_the_recorded_stock(sim_tree, tmp_path, capsys):
    run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35, pl2_w=40), capsys)
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path), capsys)
    assert result["changed"] is True
    assert (limit(sim_tree, 0), limit(sim_tree, 1)) == (45000000, 56250000)


@pytest.mark.parametrize("kw, words", [
    ({"pl1_w": 0.5}, "out of range [1 W, 45 W]"),
    ({"pl1_w": 46}, "out of range [1 W, 45 W]"),
    ({"pl2_w": 60}, "out of range [1 W, 56.25 W]"),
    ({"pl1_w": 40, "pl2_w": 35}, "PL2 35 W is below PL1 40 W"),
    ({"pl1_window_s": 0}, "time window must be positive"),
])
def test_bad_values_fail_before_any_write(sim_tree, tmp_path, capsys, kw, words):
    before = [limit(sim_tree, i, f) for i in (0, 1) for f in ("power_limit_uw", "time_window_us")]
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, **{"pl2_w": 45, **kw}), capsys)
    assert result["failed"] and words in result["msg"] and "vca-node4" in result["msg"]
    assert [limit(sim_tree, i, f) for i in (0, 1) for f in ("power_limit_uw", "time_window_us")] == before


def test_locked_zone_names_node_and_file(sim_tree, tmp_path, capsys):
    (sim_tree.rapl / "enabled").write_text("0\n")
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35), capsys)
    assert result["failed"]
    assert "vca-node4" in result["msg"] and str(sim_tree.rapl / "enabled") in result["msg"]
    assert limit(sim_tree, 0) == 45000000


def test_eacces_on_write_is_a_locked_failure(sim_tree, tmp_path, capsys, monkeypatch):
    def refuse(self, rel, value):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(Sysfs, "write", refuse)
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35), capsys)
    assert result["failed"] and "locked" in result["msg"] and "EACCES" in result["msg"]
    assert "constraint_0_power_limit_uw" in result["msg"]


def test_boot_unit_reapplies_the_config(sim_tree, tmp_path, capsys):
    config = tmp_path / "power-cap.json"
    config.write_text(json.dumps({"node": "vca-node4", "sysfs_root": str(sim_tree.root),
                                  "limits": {"long_term": {"power_limit_uw": 35000000}}}))
    assert apply_main([str(config)]) == 0
    assert limit(sim_tree, 0) == 35000000
    assert "long_term power_limit_uw: 45 W -> 35 W" in capsys.readouterr().out
    config.write_text(json.dumps({"node": "vca-node4", "sysfs_root": str(sim_tree.root),
                                  "limits": {"long_term": {"power_limit_uw": 99000000}}}))
    assert apply_main([str(config)]) == 1
    assert "out of range" in capsys.readouterr().err


def test_rapl_steps_are_the_kernels():
    assert quantize_power_uw(35100000, 3) == 35000000          # 1/8 W steps, rounded down
    assert quantize_power_uw(56250000, 3) == 56250000
    assert quantize_window_us(27983872, 10) == 27983872        # the stock window: 2^14 * (1 + 3/4) units
    assert quantize_window_us(3000000, 10) == 2998272          # 2^11 * (1 + 2/4) units of 976 us
    assert quantize_window_us(1000000, 10) == 999424
    assert quantize_window_us(500, 10) == 0


def test_second_run_is_unchanged_once_rapl_has_rounded_the_values(sim_tree, tmp_path, capsys):
    args = cap_args(sim_tree, tmp_path, pl1_w=35.1, pl2_w=40.05, pl1_window_s=3)
    sim_tree.read_limits()                                     # the running simulator has seen the stock values
    assert run_module("vca_power_cap", args, capsys)["changed"] is True
    sim_tree.read_limits()                                     # the simulator stores them as RAPL would
    assert (limit(sim_tree, 0), limit(sim_tree, 1)) == (35000000, 40000000)
    assert limit(sim_tree, 0, "time_window_us") == 2998272
    again = run_module("vca_power_cap", args, capsys)
    assert again["changed"] is False and again["changes"] == []


def test_a_value_more_than_one_step_off_is_rewritten(sim_tree, tmp_path, capsys):
    sim_tree.read_limits()
    run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35.1, pl1_window_s=3), capsys)
    sim_tree.read_limits()
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35.3, pl1_window_s=3.6), capsys)
    assert [c.split(":")[0] for c in result["changes"]] == ["long_term power_limit_uw", "long_term time_window_us"]


def test_a_write_that_does_not_hold_fails_naming_the_file(sim_tree, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Sysfs, "write", lambda self, rel, value: None)    # the write is lost
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_w=35), capsys)
    assert result["failed"]
    assert "wrote 35 W to" in result["msg"]
    assert "constraint_0_power_limit_uw but it reads back 45000000" in result["msg"]


@pytest.mark.parametrize("held_s", [1.25, 0.5])
def test_a_window_rapl_would_not_round_to_is_not_in_force(sim_tree, tmp_path, capsys, held_s):
    # RAPL only rounds down, by less than one step: a window above the wanted one, or
    # more than a step below it, is another window.
    sim_tree.read_limits()
    (sim_tree.rapl / "constraint_0_time_window_us").write_text("%d\n" % (held_s * 1e6))
    result = run_module("vca_power_cap", cap_args(sim_tree, tmp_path, pl1_window_s=1), capsys)
    assert [c.split(":")[0] for c in result["changes"]] == ["long_term time_window_us"]
    assert limit(sim_tree, 0, "time_window_us") == 1000000
