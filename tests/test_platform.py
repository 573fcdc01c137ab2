"""The platform label rests on VCA evidence found under the sysfs root, never on a coretemp driver."""

from __future__ import annotations

import os

import pytest
from ansible.module_utils.vca_sensors import (
    LAB_MARKER,
    cpu_model,
    platform,
    platform_evidence,
    read_all,
)
from ansible.module_utils.vca_sysfs import Sysfs

from conftest import ROOT, run_module

VCA_NODE_CPU = "Intel(R) Xeon(R) CPU E3-1585L v5 @ 3.00GHz"
OTHER_CPU = "Intel(R) Core(TM) i7-6770HQ CPU @ 2.60GHz"


def pci(root, address, vendor, device):
    dev = root / "bus/pci/devices" / address
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x%04x\n" % vendor)
    (dev / "device").write_text("0x%04x\n" % device)


def proc(tmp_path, model):
    d = tmp_path / "proc"
    d.mkdir()
    (d / "cpuinfo").write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: %s\n\n"
                               "processor\t: 1\nmodel name\t: %s\n" % (model, model))
    return str(d)


def coretemp_with_driver(root):
    """What the old rule took for hardware: a coretemp hwmon whose device's driver is coretemp."""
    hw = root / "class/hwmon/hwmon0"
    hw.mkdir(parents=True)
    (hw / "name").write_text("coretemp\n")
    (hw / "temp1_input").write_text("41000\n")
    driver = root / "bus/platform/drivers/coretemp"
    driver.mkdir(parents=True)
    (hw / "device").mkdir()
    os.symlink(driver, hw / "device/driver")


@pytest.fixture
def sys_root(tmp_path):
    root = tmp_path / "sys"
    root.mkdir()
    return root


def label(root, proc_root):
    return platform(Sysfs(root), proc_root)


def test_node_with_class_vca_and_the_e3_1585l_v5_is_hardware(tmp_path, sys_root):
    (sys_root / "class/vca/vca").mkdir(parents=True)
    proc_root = proc(tmp_path, VCA_NODE_CPU)
    assert label(sys_root, proc_root) == "hardware"
    assert platform_evidence(Sysfs(sys_root), proc_root)["cpu_model"] == VCA_NODE_CPU


def test_node_with_class_vca_and_the_p580_is_hardware(tmp_path, sys_root):
    (sys_root / "class/vca/vca").mkdir(parents=True)
    pci(sys_root, "0000:00:02.0", 0x8086, 0x193A)
    proc_root = proc(tmp_path, OTHER_CPU)
    assert label(sys_root, proc_root) == "hardware"
    assert platform_evidence(Sysfs(sys_root), proc_root)["p580"] == ["0000:00:02.0"]


@pytest.mark.parametrize("vendor, device", [(0x8086, 0x2954), (0x8086, 0x295A)],
                         ids=["vca-node0-nt", "vca-cpu2-upstream"])
def test_host_with_the_vca_pci_functions_is_hardware(tmp_path, sys_root, vendor, device):
    pci(sys_root, "0000:00:1f.0", 0x8086, 0xA145)
    pci(sys_root, "0000:03:00.0", vendor, device)
    proc_root = proc(tmp_path, "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz")
    assert label(sys_root, proc_root) == "hardware"
    ev = platform_evidence(Sysfs(sys_root), proc_root)
    assert ev["vca_pci"] == ["0000:03:00.0 %04x:%04x" % (vendor, device)] and not ev["class_vca"]


def test_a_plx_nt_port_alone_is_unknown(tmp_path, sys_root):
    pci(sys_root, "0000:03:00.0", 0x10B5, 0x87A0)        # PLX's generic NT port ID: any PLX card has it
    proc_root = proc(tmp_path, "Intel(R) Xeon(R) CPU E5-2680 v4 @ 2.40GHz")
    assert label(sys_root, proc_root) == "unknown"
    assert platform_evidence(Sysfs(sys_root), proc_root)["plx_nt"] == ["0000:03:00.0 10b5:87a0"]


def test_simulator_tree_is_lab(tmp_path, sim_tree):
    assert (sim_tree.root / LAB_MARKER).read_text().strip()
    assert label(sim_tree.root, proc(tmp_path, OTHER_CPU)) == "lab"


def test_marker_wins_over_vca_evidence_in_the_same_tree(tmp_path, sim_tree):
    (sim_tree.root / "class/vca/vca").mkdir(parents=True)
    pci(sim_tree.root, "0000:03:00.0", 0x8086, 0x2954)
    assert label(sim_tree.root, proc(tmp_path, VCA_NODE_CPU)) == "lab"


def test_coretemp_driver_without_vca_evidence_is_unknown(tmp_path, sys_root):
    coretemp_with_driver(sys_root)
    pci(sys_root, "0000:00:02.0", 0x8086, 0x193B)        # Iris Pro 580, the consumer GT4e: not a P580
    pci(sys_root, "0000:01:00.0", 0x10B5, 0x8747)        # a PLX switch that is no VCA's NT port
    assert label(sys_root, proc(tmp_path, OTHER_CPU)) == "unknown"


def test_class_vca_alone_is_unknown(tmp_path, sys_root):
    """A VCA 1 node has /sys/class/vca too; only the VCA 2's CPU or GPU completes the evidence."""
    (sys_root / "class/vca/vca").mkdir(parents=True)
    assert label(sys_root, proc(tmp_path, "Intel(R) Xeon(R) CPU E3-1585 v5 @ 3.50GHz")) == "unknown"
    assert label(sys_root, str(tmp_path / "noproc")) == "unknown"


def test_vca_cpu_and_gpu_without_class_vca_is_unknown(tmp_path, sys_root):
    pci(sys_root, "0000:00:02.0", 0x8086, 0x193A)
    assert label(sys_root, proc(tmp_path, VCA_NODE_CPU)) == "unknown"


def test_empty_or_missing_tree_is_unknown(tmp_path, sys_root):
    proc_root = proc(tmp_path, VCA_NODE_CPU)
    assert label(sys_root, proc_root) == "unknown"
    assert label(tmp_path / "nosys", proc_root) == "unknown"
    assert platform_evidence(Sysfs(sys_root), proc_root) == {
        "lab_marker": None, "class_vca": False, "cpu_model": VCA_NODE_CPU, "p580": [], "vca_pci": [],
        "plx_nt": []}


def test_cpu_model_is_the_first_model_name(tmp_path):
    assert cpu_model(proc(tmp_path, VCA_NODE_CPU)) == VCA_NODE_CPU
    assert cpu_model(str(tmp_path / "noproc")) is None


def test_read_all_carries_the_label_and_its_evidence(tmp_path, sys_root):
    coretemp_with_driver(sys_root)
    result = read_all(str(sys_root), sample_seconds=0, proc_root=proc(tmp_path, OTHER_CPU))
    assert result["platform"] == "unknown" and result["hottest_core_c"] is None   # no Core label
    assert result["temperatures_c"] == {"temp1": 41.0}
    assert result["platform_evidence"]["lab_marker"] is None


def test_sensors_module_reports_the_evidence(sim_tree, capsys):
    sensors = run_module("vca_sensors", {"sysfs_root": str(sim_tree.root), "sample_seconds": 0}, capsys)["sensors"]
    assert sensors["platform"] == "lab" and sensors["platform_evidence"]["lab_marker"]


def test_gemm_on_an_unknown_platform_labels_its_figure_unknown(tmp_path, sys_root, capsys):
    coretemp_with_driver(sys_root)
    args = {"backend": "opencl", "kernel": "shipped", "sizes": [32], "kernel_dir": str(ROOT / "roles/probes/files"),
            "cache_path": str(tmp_path / "tune.json"), "sysfs_root": str(sys_root)}
    result = run_module("vca_gemm", args, capsys)
    assert result.get("failed") is not True, result.get("msg")
    record = result["record"]
    assert record["platform"] == "unknown" and record["results"][0]["gflops"] > 0
    assert record["platform_evidence"]["vca_pci"] == [] and not record["platform_evidence"]["class_vca"]
    assert record["thermal"]["sensor"] == "coretemp" and record["thermal"]["samples"] >= 1
