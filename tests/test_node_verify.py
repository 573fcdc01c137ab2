"""vca-node-verify, the real script, run with python3 against /sys and /proc trees built in tmp_path.

VCA evidence is the CPU model and the P580's PCI ID: a VCA node whose VCA drivers did not load
FAILS the driver checks (the case a verifier keyed on /sys/class/vca would SKIP), and a machine
without that evidence SKIPs every hardware check, however much else its tree holds. systemctl,
clinfo and journalctl are small fakes on PATH; checks that need the network or a booted image are
left to fail and are not asserted on.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

VERIFIER = ROOT / "image_builder/overlays/node/usr/local/sbin/vca-node-verify"

MODULES = "MODULES"
STATE = "STATE"
AGENT = "AGENT"
P580 = "P580"
GOVERNOR = "GOVERNOR"
CORETEMP = "CORETEMP"
NAMES = {
    MODULES: "VCA modules loaded",
    STATE: "/sys/class/vca/vca/state is net_device_ready or os_ready",
    AGENT: "VCA node agent running",
    P580: "Iris Pro P580 with 72 compute units",
    GOVERNOR: "CPU governor is performance",
    CORETEMP: "coretemp sensors visible",
}
VCA_CPU = "Intel(R) Xeon(R) CPU E3-1585L v5 @ 3.00GHz"
OTHER_CPU = "Intel(R) Xeon(R) CPU E5-2699 v3 @ 2.30GHz"
P580_ADDR = "0000:00:02.0"
ALL_MODULES = ("vop", "vca_csa", "plx87xx", "vca_virtio", "plx87xx_dma")

FAKE_SYSTEMCTL = """#!/bin/sh
# is-active UNIT: active for the units in $FAKE_ACTIVE_UNITS; is-enabled: enabled; list-units: none failed
case "$1" in
  is-active) for u in $FAKE_ACTIVE_UNITS; do [ "$u" = "$2" ] && { echo active; exit 0; }; done; echo inactive; exit 3;;
  is-enabled) echo enabled;;
esac
exit 0
"""
FAKE_CLINFO = """#!/bin/sh
if [ "$1" = "-l" ]; then
  printf 'Platform #0: Intel(R) OpenCL HD Graphics\\n `-- Device #0: Intel(R) Iris(R) Pro Graphics P580\\n'
else
  printf '  Device Name                                     Intel(R) Iris(R) Pro Graphics P580\\n'
  printf '  Max compute units                               72\\n'
fi
"""


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def node_tree(root, *, cpu=VCA_CPU, p580=True, class_vca=True, state="net_device_ready", modules=ALL_MODULES,
               governor="performance", coretemp=True, lab_marker=False, agent_units="vca_agent.service"):
    """sys/, proc/, etc/ and bin/ of one node under root; returns the verifier's environment."""
    sysfs, proc, etc, bin_dir = root / "sys", root / "proc", root / "etc", root / "bin"
    cpuinfo = "".join("processor\t: %d\nvendor_id\t: GenuineIntel\nmodel name\t: %s\n\n" % (n, cpu) for n in range(8))
    write(proc / "cpuinfo", cpuinfo)
    write(proc / "modules", "".join("%s 16384 0 - Live 0x0000000000000000\n" % m for m in modules))
    write(proc / "cmdline", "root=/dev/vcablk0p2 rw net.ifnames=0 vca.host=172.31.1.254\n")
    write(proc / "meminfo", "MemTotal:       32768000 kB\nMemAvailable:   30000000 kB\n")
    # a PCI device that is not the P580 (the PCH's SMBus), and the P580 bound to i915
    write(sysfs / "bus/pci/devices/0000:00:1f.4/vendor", "0x8086\n")
    write(sysfs / "bus/pci/devices/0000:00:1f.4/device", "0xa123\n")
    if p580:
        dev = sysfs / "bus/pci/devices" / P580_ADDR
        write(dev / "vendor", "0x8086\n")
        write(dev / "device", "0x193a\n")
        (sysfs / "bus/pci/drivers/i915").mkdir(parents=True)
        os.symlink("../../../bus/pci/drivers/i915", dev / "driver")
    if class_vca:
        write(sysfs / "class/vca/vca/state", state + "\n")
    for cpu_n in range(8):
        write(sysfs / ("devices/system/cpu/cpu%d/cpufreq/scaling_governor" % cpu_n), governor + "\n")
    write(sysfs / "class/hwmon/hwmon0/name", "acpitz\n")
    if coretemp:
        write(sysfs / "class/hwmon/hwmon1/name", "coretemp\n")
    write(sysfs / "class/net/eth0/mtu", "65521\n")
    if lab_marker:
        write(sysfs / "vcasim", "lab\n")
    write(etc / "vca-node.conf", "IFACE=eth0\nMTU=65521\nMEM_FLOOR_MIB=256\nVCA_AGENT_UNITS=%s\n" % agent_units)
    write(etc / "vca-node.local.conf", "HOSTNAME=vca-node-0\nHOST_ADDRESS=172.31.1.254\n")
    write(etc / "vca-image.json", json.dumps({"build_id": "0123456789abcdef", "kernel_version": "4.14.20-1.2.3.26.vca",
                                              "users": []}))
    for name, text in (("systemctl", FAKE_SYSTEMCTL), ("clinfo", FAKE_CLINFO), ("journalctl", "#!/bin/sh\n")):
        write(bin_dir / name, text)
        (bin_dir / name).chmod(0o755)
    return dict(os.environ, VCA_NODE_VERIFY_SYS=str(sysfs), VCA_NODE_VERIFY_PROC=str(proc),
                VCA_NODE_VERIFY_ETC=str(etc), PATH="%s:%s" % (bin_dir, os.environ["PATH"]),
                FAKE_ACTIVE_UNITS="vca_agent.service ssh.service")


def verify(tmp_path, env):
    """Run the verifier; (TAP text, JSON summary) after checking that the TAP plan is complete."""
    out = tmp_path / "verify.json"
    proc = subprocess.run([sys.executable, str(VERIFIER), "--json", str(out)], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode in (0, 1), proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "TAP version 13"
    plan = int(re.fullmatch(r"1\.\.(\d+)", lines[1]).group(1))
    tap = [line for line in lines if re.match(r"(not )?ok \d+ - ", line)]
    summary = json.loads(out.read_text())
    assert len(tap) == plan == summary["total"] == len(summary["results"])
    assert [int(re.match(r"(?:not )?ok (\d+) ", line).group(1)) for line in tap] == list(range(1, plan + 1))
    assert set(NAMES.values()) <= {r["name"] for r in summary["results"]}
    return proc.stdout, summary


def status(summary, key):
    (result,) = [r for r in summary["results"] if r["name"] == NAMES[key]]
    return result["status"], result["detail"]


def test_a_healthy_vca_node_passes_every_hardware_check(tmp_path):
    _, summary = verify(tmp_path, node_tree(tmp_path))
    assert summary["hardware"] is True and summary["platform"] == "hardware"
    assert summary["platform_evidence"]["p580"] == [P580_ADDR]
    for key in NAMES:
        assert status(summary, key)[0] == "pass", (key, status(summary, key))
    assert status(summary, STATE)[1] == "net_device_ready"
    assert status(summary, AGENT)[1] == "vca_agent.service active"
    hardware = [r for r in summary["results"] if r["hardware"]]
    assert {r["name"] for r in hardware} == set(NAMES.values())


def test_a_vca_node_without_its_vca_drivers_fails_rather_than_skips(tmp_path):
    """The CPU and the P580 are there; vca_csa did not load, so /sys/class/vca is absent."""
    modules = [m for m in ALL_MODULES if m != "vca_csa"]
    tap, summary = verify(tmp_path, node_tree(tmp_path, class_vca=False, modules=modules))
    assert status(summary, MODULES) == ("fail", "missing: vca_csa")
    state, detail = status(summary, STATE)
    assert state == "fail" and "absent: the VCA node drivers (vca_csa) are not loaded" in detail
    assert re.search(r"^not ok \d+ - VCA modules loaded # missing: vca_csa$", tap, re.M)
    assert not [r for r in summary["results"] if r["hardware"] and r["status"] == "skip"]
    assert summary["hardware"] is True


@pytest.mark.parametrize("evidence", ["cpu", "p580"])
def test_either_piece_of_evidence_makes_every_hardware_check_answer(tmp_path, evidence):
    """The VCA CPU without a P580 on PCI: the P580 check fails (it does not skip); the P580 under
    another CPU model string: still a VCA node. No governor, no coretemp: both fail."""
    env = node_tree(tmp_path, cpu=VCA_CPU if evidence == "cpu" else "Intel(R) Xeon(R) CPU",
                    p580=evidence == "p580", governor="powersave", coretemp=False)
    _, summary = verify(tmp_path, env)
    assert summary["hardware"] is True
    assert status(summary, P580)[0] == ("fail" if evidence == "cpu" else "pass")
    assert status(summary, GOVERNOR) == ("fail", "powersave")
    assert status(summary, CORETEMP) == ("fail", "acpitz")
    assert not [r for r in summary["results"] if r["hardware"] and r["status"] == "skip"]


def test_the_agent_check_fails_on_a_vca_node_when_the_agent_is_down_or_unnamed(tmp_path):
    env = node_tree(tmp_path / "down")
    env["FAKE_ACTIVE_UNITS"] = "ssh.service"
    _, summary = verify(tmp_path / "down", env)
    assert status(summary, AGENT) == ("fail", "vca_agent.service inactive")
    _, summary = verify(tmp_path / "unnamed", node_tree(tmp_path / "unnamed", agent_units=""))
    assert status(summary, AGENT)[0] == "fail" and "VCA_AGENT_UNITS is not set" in status(summary, AGENT)[1]


@pytest.mark.parametrize("lab_marker", [False, True])
def test_without_vca_evidence_every_hardware_check_skips(tmp_path, lab_marker):
    """Another CPU and no P580, though the tree has /sys/class/vca, the modules, a performance
    governor and coretemp: /sys/class/vca proves nothing on its own, and nothing PASSes there.
    A simulated tree (the lab marker) skips even with the VCA CPU."""
    env = node_tree(tmp_path, cpu=VCA_CPU if lab_marker else OTHER_CPU, p580=lab_marker, lab_marker=lab_marker)
    _, summary = verify(tmp_path, env)
    assert summary["hardware"] is False and summary["platform"] == ("lab" if lab_marker else "unknown")
    for key in NAMES:
        state, detail = status(summary, key)
        assert state == "skip", (key, state, detail)
        assert detail.endswith("not VCA hardware" if lab_marker else "no Iris Pro P580 (8086:193a) is on PCI")
    if not lab_marker:
        assert OTHER_CPU in status(summary, MODULES)[1]


@pytest.mark.parametrize("state, want", [("net_device_ready", "pass"), ("os_ready", "pass"), ("booting", "fail"),
                                         ("net_device_no_ip", "fail"), ("error", "fail")])
def test_vca_state(tmp_path, state, want):
    _, summary = verify(tmp_path, node_tree(tmp_path, state=state))
    assert status(summary, STATE)[0] == want
    if want == "fail":
        assert status(summary, STATE)[1] == "%s, healthy is net_device_ready or os_ready" % state


FLEET = "fleet keys authorised"


def fleet_status(summary):
    (result,) = [r for r in summary["results"] if r["name"] == FLEET]
    return result["status"], result["detail"]


@pytest.mark.parametrize("local, want", [
    ("FLEET_USERS=vcafleet-no-such-user\n", "vcafleet-no-such-user: no such user"),
    ("FLEET_USERS=nobody\n", "nobody: no /nonexistent/.ssh"),     # Debian's nobody: home /nonexistent
    ("HOSTNAME=vca-node-0\n", "no fleet users"),                  # nothing names a user the fleet logs in as
])
def test_the_fleet_keys_check_fails_for_a_user_the_fleet_cannot_log_in_as(tmp_path, local, want):
    env = node_tree(tmp_path)
    (tmp_path / "etc/vca-node.local.conf").write_text(local)
    _, summary = verify(tmp_path, env)
    status_, detail = fleet_status(summary)
    assert status_ == "fail" and want in detail, detail
