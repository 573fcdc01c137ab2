"""The shared sysfs reader refuses what can act on the hardware when touched."""

from __future__ import annotations

import os

import pytest
from ansible.module_utils.vca_sysfs import Sysfs, UnsafeSysfsPath

PLX = "kernel/debug/plx87xx/0000:03:00.0"


@pytest.fixture
def root(tmp_path):
    for name in ("intr_send", "memory_write", "issue_pending", "crash_me", "spad", "dma_reg", "unknown_knob"):
        path = tmp_path / PLX / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("1\n")
    (tmp_path / "kernel/debug/plx87xx_dma").mkdir(parents=True)
    (tmp_path / "kernel/debug/plx87xx_dma/issue_pending").write_text("0\n")
    (tmp_path / "class/vca/vca0").mkdir(parents=True)
    (tmp_path / "class/vca/vca0/state").write_text("os_ready\n")
    return tmp_path


@pytest.mark.parametrize("name", ["intr_send", "memory_write", "issue_pending", "crash_me"])
def test_trigger_files_are_refused_before_any_read(root, name, monkeypatch):
    opened = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: opened.append(a[0]) or real_open(*a, **k))
    with pytest.raises(UnsafeSysfsPath, match=name):
        Sysfs(root).read(f"{PLX}/{name}")
    assert opened == []


def test_trigger_file_refused_outside_debugfs_too(root):
    (root / "class/vca/vca0/intr_send").write_text("1\n")
    with pytest.raises(UnsafeSysfsPath, match="intr_send"):
        Sysfs(root).read("class/vca/vca0/intr_send")


def test_unlisted_vca_debugfs_file_is_refused_and_allow_listed_ones_read(root):
    sysfs = Sysfs(root)
    assert sysfs.read(f"{PLX}/spad") == "1"
    assert sysfs.read(f"{PLX}/dma_reg") == "1"
    with pytest.raises(UnsafeSysfsPath, match="allow-list"):
        sysfs.read(f"{PLX}/unknown_knob")
    with pytest.raises(UnsafeSysfsPath):
        sysfs.read("kernel/debug/plx87xx_dma/issue_pending")


@pytest.mark.parametrize("rel", ["kernel/debug", "kernel/debug/plx87xx", PLX])
def test_debugfs_is_never_listed(root, rel):
    with pytest.raises(UnsafeSysfsPath, match="never listed"):
        Sysfs(root).listdir(rel)


def test_symlink_into_debugfs_is_judged_by_its_target(root):
    os.symlink(root / PLX / "crash_me", root / "class/vca/vca0/harmless")
    with pytest.raises(UnsafeSysfsPath, match="crash_me"):
        Sysfs(root).read("class/vca/vca0/harmless")


def test_parent_references_are_refused(root):
    with pytest.raises(UnsafeSysfsPath, match=r"'\.\.'"):
        Sysfs(root / "class").read("../kernel/debug/plx87xx/0000:03:00.0/crash_me")


def test_ordinary_reads_and_missing_sensors(root):
    sysfs = Sysfs(root)
    assert sysfs.read("class/vca/vca0/state") == "os_ready"
    assert sysfs.read_optional("class/hwmon/hwmon9/temp1_input") is None
    assert sysfs.listdir("class/vca") == ["vca0"]
    assert sysfs.listdir("class/nothing") == []
