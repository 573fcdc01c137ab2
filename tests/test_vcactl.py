"""vcactl status parsing (module_utils) and the lab's vcactl stand-in (lab/sim)."""

from __future__ import annotations

import io
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.vcactl import STATES, parse_status

from conftest import run_module
from vcasim.vcactl import Fleet, run

# The driver's own state strings, from its header (tests/fixtures/vca-driver), not from our table.
DRIVER_HEADER = Path(__file__).parent / "fixtures/vca-driver/modules/vca/common/vca_common.h"
SIM = Path(__file__).resolve().parent.parent / "lab" / "sim"
DRIVER_STATES = tuple(dict.fromkeys(re.findall(r'^#define VCA_\w+_TEXT "(\w+)"', DRIVER_HEADER.read_text(), re.M)))
TIMING = {"boot_s": 2.0, "net_s": 1.0, "reset_s": 1.0, "shutdown_s": 1.0}
CONFIG = {"nodes": [{"card": c, "cpu": p, "dead": (c, p) == (1, 0), "initial": "bios_up"}
                    for c in (0, 1) for p in (0, 1, 2)]}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def vcactl(fleet, *argv):
    out = io.StringIO()
    rc = run(list(argv), fleet, out=out, sleep=lambda s: setattr(fleet.clock, "now", fleet.clock.now + s))
    return rc, out.getvalue()


@pytest.fixture
def fleet():
    return Fleet(CONFIG, {}, TIMING, clock=Clock())


def test_the_state_table_is_the_drivers():
    assert set(STATES) == set(DRIVER_STATES)


def test_every_driver_state_parses_with_its_class():
    text = "\n".join(f"Card: {i // 3} Cpu: {i % 3}  STATE: {s}" for i, s in enumerate(DRIVER_STATES))
    records = parse_status(text)
    assert [r["state"] for r in records] == list(DRIVER_STATES)
    assert all(r["known"] for r in records)
    assert records[0] == {"node": 0, "card": 0, "cpu": 0, "state": "link_down", "state_class": "dead",
                          "known": True, "link": "down"}


def test_unknown_state_is_reported_not_raised():
    (rec,) = parse_status("noise\nCard: 1 Cpu: 2  STATE: quantum_flux\n")
    assert (rec["node"], rec["state_class"], rec["known"], rec["link"]) == (5, "unknown", False, "unknown")


def test_stand_in_output_is_the_real_format(fleet):
    rc, out = vcactl(fleet, "status")
    assert rc == 0
    assert out.splitlines()[0] == "Card: 0 Cpu: 0  STATE: bios_up"
    assert out.splitlines()[3] == "Card: 1 Cpu: 0  STATE: link_down"
    assert [r["node"] for r in parse_status(out)] == [0, 1, 2, 3, 4, 5]


def test_boot_walks_booting_os_ready_net_device_ready(fleet):
    assert vcactl(fleet, "boot", "0", "1")[0] == 0               # the configured os-image (a vcablk0 boot needs a disk)
    assert vcactl(fleet, "status", "0", "1")[1].strip().endswith("booting")
    fleet.clock.now += 2.0
    assert vcactl(fleet, "status", "0", "1")[1].strip().endswith("os_ready")
    fleet.clock.now += 1.0
    assert vcactl(fleet, "status", "0", "1")[1].strip().endswith("net_device_ready")


NOT_OPENED = "ERROR: Card: 0 Cpu: 1 - vcablk0 is not opened (vcactl blockio open 0 1 vcablk0 RW|RO <path>)"


def test_boot_of_an_unopened_vcablk0_is_refused_and_changes_nothing(fleet, tmp_path):
    before = fleet.dump()
    rc, out = vcactl(fleet, "boot", "0", "1", "vcablk0")
    assert (rc, out.strip()) == (1, NOT_OPENED)
    assert fleet.dump() == before
    # opened, then closed again: refused again
    (tmp_path / "disk.img").write_bytes(b"")
    assert vcactl(fleet, "blockio", "open", "0", "1", "vcablk0", "RW", str(tmp_path / "disk.img"))[0] == 0
    assert vcactl(fleet, "blockio", "close", "0", "1", "vcablk0")[0] == 0
    assert vcactl(fleet, "boot", "0", "1", "vcablk0") == (1, NOT_OPENED + "\n")
    assert vcactl(fleet, "status", "0", "1")[1].strip().endswith("bios_up")


def test_the_command_exits_non_zero_on_an_unopened_vcablk0(tmp_path):
    config = tmp_path / "vcactl.yml"
    config.write_text(yaml.safe_dump(CONFIG))
    env = dict(os.environ, PYTHONPATH=str(SIM), VCASIM_VCACTL_CONFIG=str(config),
               VCASIM_VCACTL_STATE=str(tmp_path / "state.json"), VCASIM_BOOT_DIR=str(tmp_path / "boot"))

    def cli(*argv):
        return subprocess.run([sys.executable, "-m", "vcasim.vcactl", *argv], env=env, capture_output=True,
                              text=True, timeout=60, check=False)

    done = cli("boot", "0", "1", "vcablk0")
    assert (done.returncode, done.stdout.strip()) == (1, NOT_OPENED), done.stdout + done.stderr
    assert cli("status", "0", "1").stdout.strip() == "Card: 0 Cpu: 1  STATE: bios_up"


def test_dead_node_refuses_boot_and_stays_link_down(fleet):
    rc, out = vcactl(fleet, "boot", "1", "0")
    assert rc == 1 and 'needs to be in "bios_up"' in out
    assert vcactl(fleet, "status", "1", "0")[1].strip().endswith("link_down")
    rc, out = vcactl(fleet, "wait", "1", "0", "--timeout", "5")
    assert rc == 1 and "link_down" in out


def test_wait_returns_when_ready_and_times_out_otherwise(fleet):
    vcactl(fleet, "boot", "0", "0")
    assert vcactl(fleet, "wait", "0", "0", "--timeout", "10")[0] == 0
    rc, out = vcactl(fleet, "wait", "0", "2", "--timeout", "1")       # never booted
    assert rc == 1 and "bios_up, not net_device_ready" in out


def test_shutdown_then_power_button(fleet):
    vcactl(fleet, "boot", "0", "0")
    fleet.clock.now += 5
    assert vcactl(fleet, "os-shutdown", "0", "0")[0] == 0
    fleet.clock.now += 1
    assert vcactl(fleet, "status", "0", "0")[1].strip().endswith("power_off")
    vcactl(fleet, "pwrbtn-short", "0", "0")
    assert vcactl(fleet, "status", "0", "0")[1].strip().endswith("bios_up")
    rc, out = vcactl(fleet, "os-shutdown", "0", "0")
    assert rc == 1 and "os_ready" in out


def test_state_survives_between_invocations(fleet):
    vcactl(fleet, "boot", "0", "2")
    again = Fleet(CONFIG, fleet.dump(), TIMING, clock=fleet.clock)
    assert vcactl(again, "status", "0", "2")[1].strip().endswith("booting")


def test_vca_status_module_turns_vcactl_into_facts(tmp_path, capsys):
    fake = tmp_path / "vcactl"
    fake.write_text("#!/bin/sh\nprintf 'Card: 0 Cpu: 0  STATE: net_device_ready\\n"
                    "Card: 1 Cpu: 0  STATE: link_down\\nCard: 1 Cpu: 1  STATE: weird_new_state\\n'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    result = run_module("vca_status", {"vcactl": str(fake)}, capsys)
    facts = result["ansible_facts"]["vca_node_status"]
    assert facts["0"]["state"] == "net_device_ready" and facts["0"]["state_class"] == "os"
    assert facts["3"]["link"] == "down"
    assert facts["4"]["state_class"] == "unknown"
    assert result["changed"] is False


def test_vca_status_module_fails_clearly_when_vcactl_fails(tmp_path, capsys):
    fake = tmp_path / "vcactl"
    fake.write_text("#!/bin/sh\necho 'ERROR: could not parse vca configuration file!' >&2\nexit 3\n")
    os.chmod(fake, 0o755)
    result = run_module("vca_status", {"vcactl": str(fake)}, capsys)
    assert result["failed"] and "rc=3" in result["msg"] and "could not parse" in result["msg"]


def test_vca_status_reads_every_sysfs_state_through_the_safe_reader(tmp_path, capsys):
    for i, state in enumerate(DRIVER_STATES):
        (tmp_path / f"class/vca/vca{i}").mkdir(parents=True)
        (tmp_path / f"class/vca/vca{i}/state").write_text(state + "\n")
    (tmp_path / "class/vca/vcaX").mkdir()
    (tmp_path / "class/vca/vcaX/state").write_text("brand_new_state\n")
    result = run_module("vca_status", {"use_vcactl": False, "sysfs_root": str(tmp_path)}, capsys)
    facts = result["ansible_facts"]["vca_sysfs_state"]
    assert {f["state"] for k, f in facts.items() if k != "vcaX"} == set(DRIVER_STATES)
    assert all(f["known"] for k, f in facts.items() if k != "vcaX")
    assert facts["vcaX"] == {"state": "brand_new_state", "state_class": "unknown", "known": False}
    assert result["ansible_facts"]["vca_node_status"] == {}


def test_vca_status_without_class_vca_is_empty_not_an_error(tmp_path, capsys):
    result = run_module("vca_status", {"use_vcactl": False, "sysfs_root": str(tmp_path)}, capsys)
    assert result["ansible_facts"]["vca_sysfs_state"] == {}
