"""A node image passes its own verifier on a card: what the verifier's hardware checks judge and
no package of Intel's provides (the CPU governor) is set by the image itself at boot, not by
node_base after it.

The real node profile (ubuntu-22.04) is configured into a tree as the builder does it; the
simulator's sysfs tree stands in for the card's, with the values the kernel boots with
(powersave under intel_pstate), less the simulator's marker (a card's sysfs has none); the
image's boot units ordered before the verifier run in that order against it; then the image's
verifier judges the tree as a VCA node (the E3-1585L v5 in cpuinfo).
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys

from test_image_access import tree_with_accounts

from conftest import ROOT
from vca_image.build import configure
from vca_image.profile import load

PROFILES = ROOT / "image_builder" / "profiles"
VERIFY_UNIT = "vca-node-verify.service"
GOVERNOR = "CPU governor is performance"
CORETEMP = "coretemp sensors visible"
VCA_CPU = "Intel(R) Xeon(R) CPU E3-1585L v5 @ 3.00GHz"


def unit(path):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


def units_before_the_verifier(rootfs):
    """The image's enabled units that systemd starts before the verifier (its After=, their Before=)."""
    system = rootfs / "etc/systemd/system"
    enabled = sorted(p.name for p in (system / "multi-user.target.wants").iterdir())
    verifier_after = unit(system / VERIFY_UNIT)["Unit"].get("After", "").split()
    found = []
    for name in enabled:
        parsed = unit(system / name)
        if name in verifier_after or VERIFY_UNIT in parsed["Unit"].get("Before", "").split():
            found.append((name, parsed))
    return found


def boot(rootfs, sysfs):
    """Run, as the boot would, each image unit that comes before the verifier (its own programs,
    from the tree; a unit with a Condition on the tree's files is the boot's, not the card's)."""
    ran = []
    for name, parsed in units_before_the_verifier(rootfs):
        argv = parsed["Service"]["ExecStart"].split()
        program = rootfs / argv[0].lstrip("/")
        if not program.is_file():
            continue                              # a distribution's program: not what the image sets
        env = dict(os.environ, VCA_NODE_VERIFY_SYS=str(sysfs))
        subprocess.run([sys.executable, str(program), *argv[1:]], env=env, check=True, timeout=60)
        ran.append(name)
    return ran


def card_tree(tmp_path, sim_tree):
    """The simulator's node tree as a card's kernel boots it (its marker removed), a VCA node's cpuinfo."""
    (sim_tree.root / "vcasim").unlink()
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text("".join("processor\t: %d\nmodel name\t: %s\n\n" % (n, VCA_CPU) for n in range(8)))
    (proc / "modules").write_text("")
    (proc / "cmdline").write_text("root=/dev/vcablk0p2 rw net.ifnames=0\n")
    (proc / "meminfo").write_text("MemTotal:       32768000 kB\nMemAvailable:   30000000 kB\n")
    return sim_tree.root, proc


def verify(tmp_path, rootfs, sysfs, proc):
    out = tmp_path / "verify.json"
    env = dict(os.environ, VCA_NODE_VERIFY_SYS=str(sysfs), VCA_NODE_VERIFY_PROC=str(proc),
               VCA_NODE_VERIFY_ETC=str(rootfs / "etc"))
    subprocess.run([sys.executable, str(rootfs / "usr/local/sbin/vca-node-verify"), "--json", str(out)],
                   env=env, capture_output=True, text=True, timeout=120, check=False)
    summary = json.loads(out.read_text())
    assert summary["platform"] == "hardware", summary["platform_evidence"]
    return {r["name"]: (r["status"], r["detail"]) for r in summary["results"] if r["hardware"]}


def built_rootfs(tmp_path, monkeypatch):
    """The real nodes' profile configured into a tree (its kernel .debs are not read here)."""
    monkeypatch.setenv("VCA_KERNEL_DEBS", str(tmp_path))
    rootfs = tree_with_accounts(tmp_path / "rootfs")
    configure(load("ubuntu-22.04", PROFILES), rootfs, ROOT / "image_builder", [])
    return rootfs


def test_the_card_tree_boots_at_the_kernels_governor(tmp_path, sim_tree, monkeypatch):
    """Without the image's boot units the card-shaped tree fails the check: the test's tree is
    the kernel's default, not a tree that passes anyway."""
    rootfs = built_rootfs(tmp_path, monkeypatch)
    sysfs, proc = card_tree(tmp_path, sim_tree)
    checks = verify(tmp_path, rootfs, sysfs, proc)
    assert checks[GOVERNOR] == ("fail", "powersave")


def test_the_image_sets_what_its_verifier_checks_on_a_card(tmp_path, sim_tree, monkeypatch):
    rootfs = built_rootfs(tmp_path, monkeypatch)
    sysfs, proc = card_tree(tmp_path, sim_tree)
    assert "vca-governor.service" in boot(rootfs, sysfs)
    checks = verify(tmp_path, rootfs, sysfs, proc)
    assert checks[GOVERNOR] == ("pass", "performance")
    assert checks[CORETEMP][0] == "pass"                    # the kernel's, in the simulator's tree


def test_the_governor_unit_exits_cleanly_without_cpufreq(tmp_path, monkeypatch):
    """QEMU (CI's boot test) has no cpufreq: the unit must not fail the boot ("no failed units")."""
    rootfs = built_rootfs(tmp_path, monkeypatch)
    empty = tmp_path / "sys"
    (empty / "devices/system/cpu/cpu0").mkdir(parents=True)
    done = subprocess.run([sys.executable, str(rootfs / "usr/local/sbin/vca-governor"), "performance"],
                          env=dict(os.environ, VCA_NODE_VERIFY_SYS=str(empty)), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and "nothing to set" in done.stdout
