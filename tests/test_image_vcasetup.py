"""Intel's card-side setup in the image (vcasetup.py): mmdebstrap's hooks, in the order they must run,
only for a profile with Intel's node userspace, the hooks themselves run by sh, and check() on trees
that stand in for what `vca_setup.sh card` leaves (or does not)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from vca_image import build, vcasetup
from vca_image.profile import load

PROFILES = ROOT / "image_builder" / "profiles"
HOST_SIDE = "softdep plx87xx pre: vca_virtio vca_csm vop vca_mgr vca_mgr_extd plx87xx_dma\n"
CARD_SIDE = "softdep plx87xx pre: vca_virtio vop vca_csa plx87xx_dma\n"


@pytest.fixture
def intel(monkeypatch):
    """The ubuntu-22.04 profile, its .debs stood in for (Intel's are not ours to have)."""
    profile = load("ubuntu-22.04", PROFILES, check_paths=False)
    debs = [Path("/debs/linux-image-4.14.20-1.2.3.26.vca_1.0_amd64.deb"),
            Path("/debs/vcass-modules-4.14.20-1.2.3.26.vca_2.3.26_amd64.deb")]
    monkeypatch.setattr(build, "kernel_debs", lambda p: debs)
    return profile


def hook_args(argv):
    return [(i, a) for i, a in enumerate(argv) if a.startswith("--") and "-hook=" in a]


def test_the_vca_config_hook_comes_before_every_customize_hook_and_the_card_setup_after_them(intel, tmp_path):
    argv = build.mmdebstrap_argv(intel, tmp_path / "rootfs", tmp_path / "cache")
    hooks = hook_args(argv)
    essential = [i for i, a in hooks if a.startswith("--essential-hook=")]
    customize = [i for i, a in hooks if a.startswith("--customize-hook=")]
    assert len(essential) == 1 and customize and essential[0] < min(customize)
    assert max(i for i, a in hooks if a.startswith("--setup-hook=")) < essential[0]
    assert argv[essential[0]] == "--essential-hook=" + vcasetup.hooks(intel)[0][1]
    assert "/etc/vca_config" in argv[essential[0]]
    card = [a for _, a in hooks if a.startswith("--customize-hook=")]
    assert card[-2:] == ["--customize-hook=" + vcasetup.DEPMOD, '--customize-hook=chroot "$1" /sbin/vca_setup.sh card']
    assert card[0].startswith("--customize-hook=sync-out "), "the cache is saved before Intel's scripts run"
    assert "useradd" in card[1]
    include = next(a for a in argv if a.startswith("--include="))
    assert "/debs/vcass-modules-4.14.20-1.2.3.26.vca_2.3.26_amd64.deb" in include.split(",")
    assert argv[-3:] == ["jammy", str(tmp_path / "rootfs"), "http://archive.ubuntu.com/ubuntu"]


def test_a_profile_without_intels_userspace_gets_no_vca_hooks(tmp_path):
    profile = load("debian-12", PROFILES)
    argv = build.mmdebstrap_argv(profile, tmp_path / "rootfs", tmp_path / "cache")
    assert vcasetup.hooks(profile) == [] and vcasetup.check(profile, tmp_path) == []
    assert not [a for a in argv if a.startswith("--essential-hook=") or "vca_setup" in a or "depmod" in a]
    assert [a.split("=", 1)[0] for _, a in hook_args(argv)] == ["--setup-hook", "--setup-hook", "--customize-hook",
                                                                "--customize-hook"]


def sh_hook(hook, rootfs, path=None):
    """A hook as mmdebstrap runs it: sh -c HOOK exec ROOTFS."""
    env = dict(os.environ, PATH="%s:%s" % (path, os.environ["PATH"])) if path else None
    return subprocess.run(["sh", "-c", hook, "exec", str(rootfs)], capture_output=True, text=True, env=env,
                          check=False)


def test_the_essential_hook_writes_a_vca_config_that_bash_sources_to_intels_values(intel, tmp_path):
    (tmp_path / "etc").mkdir()
    done = sh_hook(vcasetup.hooks(intel)[0][1], tmp_path)
    assert done.returncode == 0, done.stderr
    keys = " ".join("${%s}" % k for k in vcasetup.VCA_CONFIG)
    sourced = subprocess.run(["bash", "-c", 'set -u; source "$1"; echo "%s"' % keys, "bash",
                              str(tmp_path / "etc/vca_config")], capture_output=True, text=True, check=True).stdout
    assert sourced.split() == list(vcasetup.VCA_CONFIG.values())
    assert vcasetup.read_config(tmp_path) == vcasetup.VCA_CONFIG


def test_depmod_runs_for_every_kernel_in_the_tree_and_fails_without_one(intel, tmp_path):
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "chroot").write_text('#!/bin/sh\necho "$@" >> "%s/calls"\n' % tmp_path)
    (stub / "chroot").chmod(0o755)
    rootfs = tmp_path / "rootfs"
    for release in ("4.14.20-1.2.3.26.vca", "6.1.0-41-amd64"):
        (rootfs / "lib/modules" / release).mkdir(parents=True)
    done = sh_hook(vcasetup.DEPMOD, rootfs, stub)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "calls").read_text().splitlines() == [
        "%s depmod -a 4.14.20-1.2.3.26.vca" % rootfs, "%s depmod -a 6.1.0-41-amd64" % rootfs]
    empty = tmp_path / "empty"
    (empty / "lib/modules").mkdir(parents=True)
    done = sh_hook(vcasetup.DEPMOD, empty, stub)
    assert done.returncode == 1 and "no kernel under /lib/modules" in done.stderr


def card_tree(root, *, modprobe=CARD_SIDE, rule=True, enabled=True, merged_usr="usr/", agent="/usr/sbin/vca_agent.sh"):
    """What `vca_setup.sh card` leaves after Intel's package, as Ubuntu 22.04 lays it out: /lib, /sbin
    links into /usr (merged /usr; merged_usr "/usr/" makes them absolute links, None leaves them out),
    the agent's unit in /lib/systemd/system, its wants link absolute."""
    usr = root / "usr"
    for d in ("lib/udev/rules.d", "lib/systemd/system", "sbin"):
        (usr / d).mkdir(parents=True)
    if merged_usr:
        os.symlink(merged_usr + "lib", root / "lib")
        os.symlink(merged_usr + "sbin", root / "sbin")
    (root / "etc/modprobe.d").mkdir(parents=True)
    (root / "etc/systemd/system/multi-user.target.wants").mkdir(parents=True)
    (root / "etc/vca_config").write_text(vcasetup.config_text())
    if modprobe is not None:
        (root / "etc/modprobe.d/vca.conf").write_text(modprobe)
    if rule:
        (usr / "lib/udev/rules.d/97-eth_up.rules").write_text(
            'SUBSYSTEM=="net", ACTION=="add", KERNEL=="eth*", RUN+="/sbin/vca_eth_cfg.sh $name"\n')
    (usr / "sbin/vca_eth_cfg.sh").write_text("#!/bin/bash\n")
    (usr / "sbin/vca_agent.sh").write_text("#!/bin/bash\n")
    (usr / "lib/systemd/system/vca_agent.service").write_text(
        "[Service]\nType=forking\nExecStart=%s start\n" % agent)
    if enabled:
        os.symlink("/lib/systemd/system/vca_agent.service",
                   root / "etc/systemd/system/multi-user.target.wants/vca_agent.service")
    return root


def test_check_passes_what_the_card_side_setup_leaves(intel, tmp_path):
    assert vcasetup.check(intel, card_tree(tmp_path / "rootfs")) == []


@pytest.mark.parametrize("tree_args, problem", [
    ({"modprobe": HOST_SIDE}, "/etc/modprobe.d/vca.conf is not the card side's module order (vca_csa, no vca_mgr): "
                              "softdep plx87xx pre: vca_virtio vca_csm vop vca_mgr"),
    ({"modprobe": None}, "/etc/modprobe.d/vca.conf is not the card side's module order (vca_csa, no vca_mgr): "
                         "missing"),
    ({"modprobe": CARD_SIDE + HOST_SIDE}, "/etc/modprobe.d/vca.conf is not the card side's module order"),
    ({"rule": False}, "no /lib/udev/rules.d/97-eth_up.rules (the node's VirtIO network comes up through it)"),
    ({"enabled": False}, "vca_agent.service is not enabled (no link in /etc/systemd/system/*.wants)"),
    ({"agent": "/opt/intel/vca_agent.sh"}, "vca_agent.service runs /opt/intel/vca_agent.sh, which is not in the image"),
], ids=["host-side-vca.conf", "no-vca.conf", "card-and-host-vca.conf", "no-udev-rule", "agent-not-enabled",
        "agent-program-missing"])
def test_check_names_what_the_card_side_setup_did_not_leave(intel, tmp_path, tree_args, problem):
    problems = vcasetup.check(intel, card_tree(tmp_path / "rootfs", **tree_args))
    assert len(problems) == 1 and problems[0].startswith(problem), problems


def test_check_reads_paths_inside_the_tree_never_the_build_hosts(intel, tmp_path):
    # /lib -> /usr/lib, an absolute link: followed on this machine it would name this machine's /usr/lib
    root = card_tree(tmp_path / "abs", merged_usr="/usr/")
    assert vcasetup.check(intel, root) == []
    assert vcasetup.inside(root, "/lib/udev/rules.d") == root / "usr/lib/udev/rules.d"
    # no merged /usr: /lib/udev/rules.d is the tree's own directory, so the rule in usr/lib is not there
    problems = vcasetup.check(intel, card_tree(tmp_path / "rootfs", merged_usr=None))
    assert "no /lib/udev/rules.d/97-eth_up.rules (the node's VirtIO network comes up through it)" in problems
    assert "no /sbin/vca_eth_cfg.sh (the script the udev rule runs)" in problems
    assert vcasetup.inside(tmp_path / "rootfs", "/lib/udev") == tmp_path / "rootfs/lib/udev"


def test_check_takes_the_paths_from_the_images_own_vca_config(intel, tmp_path):
    root = card_tree(tmp_path / "rootfs", rule=False)
    (root / "etc/udev/rules.d").mkdir(parents=True)
    (root / "etc/udev/rules.d/97-eth_up.rules").write_text('RUN+="/sbin/vca_eth_cfg.sh $name"\n')
    # the packaged vca_config (modules/scripts/vca_config) puts the rule under /etc/udev/rules.d
    (root / "etc/vca_config").write_text((root / "etc/vca_config").read_text().replace(
        "/lib/udev/rules.d/", "/etc/udev/rules.d/"))
    assert vcasetup.check(intel, root) == []
    (root / "etc/vca_config").unlink()
    assert vcasetup.check(intel, root)[0].startswith("no /etc/vca_config")


def test_the_build_stops_naming_every_problem(intel, tmp_path, monkeypatch):
    def bootstrap(profile, rootfs, cache):
        card_tree(rootfs, modprobe=HOST_SIDE, enabled=False)
    monkeypatch.setattr(build, "bootstrap", bootstrap)
    monkeypatch.setattr(build, "check_host", lambda: None)
    with pytest.raises(SystemExit) as stopped:
        build.build(intel, tmp_path / "out", cache=tmp_path / "cache")
    message = str(stopped.value)
    assert message.startswith("vca-image: Intel's card-side setup is not in the image")
    assert "vca_mgr" in message and "vca_agent.service is not enabled" in message
