"""A node image passes its own verifier on a card: what the verifier's hardware checks judge and
no package of Intel's provides (the CPU governor) is set by the image itself at boot, not by
node_base after it.

The real node profile (ubuntu-22.04) is configured into a tree as the builder does it; the
card-shaped tree (lab/sim/vcasim/card.py: the simulator's sysfs tree at the values the kernel
boots with, powersave under intel_pstate, less the simulator's marker, with what the card's
kernel and Intel's drivers present) stands in for the card's; the image's boot units ordered
before the verifier run in that order against it; then the image's verifier judges the tree as
a VCA node. molecule/node_image does the same with the lab image as built (vcasim.card's CLI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from test_image_access import tree_with_accounts

from conftest import ROOT
from vca_image.build import configure
from vca_image.profile import load
from vcasim import card

PROFILES = ROOT / "image_builder" / "profiles"
GOVERNOR = "CPU governor is performance"
CORETEMP = "coretemp sensors visible"


def verify(tmp_path, rootfs, sysfs, proc):
    summary = card.verify(rootfs, sysfs, proc, tmp_path / "verify.json")
    assert summary["platform"] == "hardware", summary["platform_evidence"]
    return {r["name"]: (r["status"], r["detail"]) for r in summary["results"] if r["hardware"]}


def built_rootfs(tmp_path, monkeypatch):
    """The real nodes' profile configured into a tree (its kernel .debs are not read here)."""
    monkeypatch.setenv("VCA_KERNEL_DEBS", str(tmp_path))
    rootfs = tree_with_accounts(tmp_path / "rootfs")
    configure(load("ubuntu-22.04", PROFILES), rootfs, ROOT / "image_builder", [])
    return rootfs


def test_the_card_tree_boots_at_the_kernels_governor(tmp_path, sim_params, monkeypatch):
    """Without the image's boot units the card-shaped tree fails the check: the test's tree is
    the kernel's default, not a tree that passes anyway."""
    rootfs = built_rootfs(tmp_path, monkeypatch)
    sysfs, proc = card.card_tree(tmp_path / "card", sim_params["node"])
    checks = verify(tmp_path, rootfs, sysfs, proc)
    assert checks[GOVERNOR] == ("fail", "powersave")


def test_the_image_sets_what_its_verifier_checks_on_a_card(tmp_path, sim_params, monkeypatch):
    rootfs = built_rootfs(tmp_path, monkeypatch)
    sysfs, proc = card.card_tree(tmp_path / "card", sim_params["node"])
    assert "vca-governor.service" in card.boot(rootfs, sysfs)
    checks = verify(tmp_path, rootfs, sysfs, proc)
    assert checks[GOVERNOR] == ("pass", "performance")
    assert checks[CORETEMP][0] == "pass"                    # the kernel's, in the simulator's tree
    # the card's kernel and drivers, as the card-shaped tree presents them
    assert checks["VCA modules loaded"][0] == "pass"
    assert checks["/sys/class/vca/vca/state is net_device_ready or os_ready"][0] == "pass"


def test_the_card_cli_boots_the_image_and_judges_it(tmp_path, monkeypatch):
    """vcasim.card's command line, as molecule/node_image runs it on the lab host: the image's tree in,
    the verifier's summary out, with the units it ran; an empty WORKDIR only."""
    rootfs = built_rootfs(tmp_path, monkeypatch)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "lab" / "sim"))
    run = subprocess.run([sys.executable, "-m", "vcasim.card", str(rootfs), str(tmp_path / "work")], env=env,
                         capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert summary["platform"] == "hardware" and "vca-governor.service" in summary["booted"]
    assert {r["name"]: r["status"] for r in summary["results"]}[GOVERNOR] == "pass"
    again = subprocess.run([sys.executable, "-m", "vcasim.card", str(rootfs), str(tmp_path / "work")], env=env,
                           capture_output=True, text=True, check=False, timeout=120)
    assert again.returncode == 2 and "not empty" in again.stderr


def test_the_governor_unit_exits_cleanly_without_cpufreq(tmp_path, monkeypatch):
    """QEMU (CI's boot test) has no cpufreq: the unit must not fail the boot ("no failed units")."""
    rootfs = built_rootfs(tmp_path, monkeypatch)
    empty = tmp_path / "sys"
    (empty / "devices/system/cpu/cpu0").mkdir(parents=True)
    done = subprocess.run([sys.executable, str(rootfs / "usr/local/sbin/vca-governor"), "performance"],
                          env=dict(os.environ, VCA_NODE_VERIFY_SYS=str(empty)), capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0 and "nothing to set" in done.stdout


def test_units_before_the_verifier_are_read_from_the_images_tree(tmp_path, monkeypatch):
    """A wants/ link to an absolute path is resolved inside the image's tree, never on this machine; a
    distribution's unit the tree does not hold (/lib/systemd) is no setting of the image's and is left out."""
    rootfs = built_rootfs(tmp_path, monkeypatch)
    wants = rootfs / "etc/systemd/system/multi-user.target.wants"
    (wants / "networking.service").symlink_to("/lib/systemd/system/networking.service")
    (wants / "vca-governor.service").unlink()
    (wants / "vca-governor.service").symlink_to("/etc/systemd/system/vca-governor.service")
    names = [name for name, _ in card.units_before_the_verifier(rootfs)]
    assert "vca-governor.service" in names and "networking.service" not in names
