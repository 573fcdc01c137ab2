"""image_builder profiles: extends, merge, and errors that name the file and key before any download."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import ROOT
from vca_image import cli
from vca_image.build import configure, recipe, user_hooks
from vca_image.profile import UNSET, ProfileError, agent_units, kernel_debs, list_profiles, load

PROFILES = ROOT / "image_builder" / "profiles"


@pytest.fixture
def pdir(tmp_path):
    """A copy of the shipped profiles (and their overlays) to break."""
    shutil.copytree(PROFILES, tmp_path / "profiles")
    shutil.copytree(ROOT / "image_builder" / "overlays", tmp_path / "overlays")
    return tmp_path / "profiles"


def test_shipped_profiles():
    assert {"base", "debian-12", "ubuntu-22.04"} <= set(list_profiles(PROFILES))
    deb = load("debian-12", PROFILES)
    assert deb["suite"] == "bookworm" and deb["kernel"]["packages"] == ["linux-image-amd64"]
    assert "lm-sensors" in deb["packages"] and "pocl-opencl-icd" in deb["packages"]   # base's, plus its own
    assert deb["network"] == {"interface": "eth0", "mtu": 65521, "ifnames": False, "dhcp": True}
    assert deb["_files"][0].endswith("debian-12.yml") and deb["_files"][1].endswith("base.yml")


def test_unknown_key_names_file_and_key(pdir):
    (pdir / "debian-12.yml").write_text((pdir / "debian-12.yml").read_text() + "pacakges: [vim]\n")
    with pytest.raises(ProfileError) as err:
        load("debian-12", pdir)
    assert str(pdir / "debian-12.yml") in str(err.value) and "unknown key pacakges" in str(err.value)


def test_unknown_nested_key(pdir):
    (pdir / "debian-12.yml").write_text((pdir / "debian-12.yml").read_text().replace(
        "  source: distribution", "  source: distribution\n  flavour: rt"))
    with pytest.raises(ProfileError, match=r"debian-12.yml: unknown key kernel.flavour"):
        load("debian-12", pdir)


def test_missing_kernel_dir(pdir, monkeypatch):
    monkeypatch.setenv("VCA_KERNEL_DEBS", str(pdir / "no-such-dir"))
    with pytest.raises(ProfileError) as err:
        load("ubuntu-22.04", pdir)
    assert "ubuntu-22.04.yml: kernel.debs_dir" in str(err.value) and "no-such-dir is not a directory" in str(err.value)


def test_extends_loop(pdir):
    (pdir / "a.yml").write_text("extends: b\n")
    (pdir / "b.yml").write_text("extends: a\n")
    with pytest.raises(ProfileError, match=r"extends loop: .*a.yml -> .*b.yml -> .*a.yml"):
        load("a", pdir)


def test_bad_value_names_key(pdir):
    (pdir / "debian-12.yml").write_text((pdir / "debian-12.yml").read_text() + "network: {mtu: 100000}\n")
    with pytest.raises(ProfileError, match=r"debian-12.yml: network.mtu: 100000 is greater than the maximum"):
        load("debian-12", pdir)


def test_kernel_debs_are_checked_by_name_and_version(pdir, tmp_path, monkeypatch):
    debs = tmp_path / "debs"
    debs.mkdir()
    monkeypatch.setenv("VCA_KERNEL_DEBS", str(debs))
    (debs / "linux-image-4.14.20-1.2.3.26.vca_4.14.20-1.2.3.25.vca-1_amd64.deb").write_bytes(b"")
    profile = load("ubuntu-22.04", pdir)
    with pytest.raises(ProfileError, match=r"is version 4\.14\.20-1\.2\.3\.25\.vca-1, the profile asks for"):
        kernel_debs(profile)


def test_blockio_is_always_built(pdir):
    (pdir / "ram.yml").write_text("extends: debian-12\nformats: [volatile]\n")
    with pytest.raises(ProfileError, match=r"ram.yml: formats: must include blockio"):
        load("ram", pdir)


def test_verify_floor_is_checked(pdir):
    (pdir / "low.yml").write_text("extends: debian-12\nverify: {mem_floor_mib: -1}\n")
    with pytest.raises(ProfileError, match=r"low.yml: verify.mem_floor_mib: -1 is less than the minimum of 0"):
        load("low", pdir)


def test_recipe_follows_the_profile_and_its_overlays(pdir):
    first = recipe(load("debian-12", pdir))
    assert recipe(load("debian-12", pdir)) == first
    verifier = pdir.parent / "overlays/node/usr/local/sbin/vca-node-verify"
    verifier.write_text(verifier.read_text() + "# changed\n")
    second = recipe(load("debian-12", pdir))
    assert second != first
    (pdir / "debian-12.yml").write_text((pdir / "debian-12.yml").read_text() + "verify: {mem_floor_mib: 512}\n")
    assert recipe(load("debian-12", pdir)) not in (first, second)


def test_unset_kernel_dir_is_named(pdir, monkeypatch):
    monkeypatch.delenv("VCA_KERNEL_DEBS", raising=False)
    with pytest.raises(ProfileError, match=r"ubuntu-22.04.yml: kernel.debs_dir: .* names no directory"):
        load("ubuntu-22.04", pdir)
    monkeypatch.setenv("VCA_KERNEL_DEBS", "")
    with pytest.raises(ProfileError, match=r"names no directory"):
        load("ubuntu-22.04", pdir)


@pytest.mark.parametrize("key, value", [
    ("groups", "sudo; rm -rf /"), ("groups", "$(reboot)"), ("groups", "sudo\n"), ("groups", "-o"),
    ("name", "vca admin"), ("name", "root`id`"), ("name", "vcaadmin\n"),
])
def test_user_and_group_names_are_checked(pdir, key, value):
    user = {"name": "vcaadmin", "groups": ["adm", value]} if key == "groups" else {"name": value, "groups": ["sudo"]}
    (pdir / "evil.yml").write_text(yaml.safe_dump({"extends": "debian-12", "users": [user]}))
    with pytest.raises(ProfileError) as err:
        load("evil", pdir)
    where = "users.0.groups.1" if key == "groups" else "users.0.name"
    assert f"evil.yml: {where}: {value!r} is not a user or group name" in str(err.value)


def test_shipped_users_pass_the_check():
    assert load("debian-12", PROFILES)["users"] == [{"name": "vcaadmin", "groups": ["sudo"]}]


def test_user_hook_passes_names_as_words(tmp_path):
    """Even a name the schema would refuse reaches useradd as one argument: mmdebstrap runs the
    hook as `sh -c HOOK exec ROOTFS`; a fake chroot on PATH records the words it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "chroot").write_text('#!/bin/sh\nprintf "%s\\0" "$@" > "$ARGV_OUT"\n')
    (bin_dir / "chroot").chmod(0o755)
    pwned = tmp_path / "pwned"
    user = {"name": "vcaadmin", "groups": ["sudo; touch %s" % pwned, "$(touch %s)" % pwned]}
    (hook,) = user_hooks({"users": [user]})
    env = dict(os.environ, PATH="%s:%s" % (bin_dir, os.environ["PATH"]), ARGV_OUT=str(tmp_path / "argv"))
    subprocess.run(["sh", "-c", hook, "exec", str(tmp_path / "rootfs")], env=env, cwd=tmp_path, check=True)
    argv = (tmp_path / "argv").read_text().split("\0")[:-1]
    assert argv == [str(tmp_path / "rootfs"), "useradd", "--create-home", "--shell", "/bin/bash",
                    "--groups", ",".join(user["groups"]), "--", "vcaadmin"]
    assert not pwned.exists()


# Profiles of one's own: `extends: NAME` beside the profile first, then in the shipped profiles.

@pytest.fixture
def own(tmp_path):
    """A directory of one's own, away from the shipped profiles (tmp_path/profiles)."""
    (tmp_path / "home" / "vca").mkdir(parents=True)
    return tmp_path / "home" / "vca"


def test_a_profile_of_ones_own_extends_a_shipped_profile_by_name(pdir, own):
    (own / "mine.yml").write_text("extends: debian-12\npackages: [vim]\nverify: {mem_floor_mib: 512}\n")
    profile = load(str(own / "mine.yml"), pdir)
    assert profile["name"] == "mine" and profile["suite"] == "bookworm"
    assert {"vim", "pocl-opencl-icd", "lm-sensors"} <= set(profile["packages"])      # its own, debian-12's, base's
    assert profile["verify"] == {"mem_floor_mib": 512} and profile["kernel"]["packages"] == ["linux-image-amd64"]
    assert profile["_files"] == [str(own / "mine.yml"), str(pdir / "debian-12.yml"), str(pdir / "base.yml")]
    # the shipped overlay is found from the builder's base (the directory above _files[0]), as build.py looks
    base = Path(profile["_files"][0]).resolve().parent.parent
    assert [(base / o).resolve() for o in profile["overlays"]] == [(pdir.parent / "overlays/node").resolve()]
    first = recipe(profile)
    verifier = pdir.parent / "overlays/node/usr/local/sbin/vca-node-verify"
    verifier.write_text(verifier.read_text() + "# changed\n")
    assert recipe(load(str(own / "mine.yml"), pdir)) != first        # the recipe follows the shipped overlay


def test_a_shipped_profile_keeps_its_overlays_relative(pdir):
    """Its recipe (written into the image) names no absolute path: two checkouts build the same bits."""
    assert load("debian-12", pdir)["overlays"] == ["overlays/node"]


def test_vca_image_takes_a_profile_of_ones_own_that_extends_ubuntu(pdir, own, tmp_path, monkeypatch, capsys):
    """The report: `vca-image build --profile ~/mine.yml` with `extends: ubuntu-22.04` said `no such profile`.
    recipe loads the profile as build does, every profile error first, without building."""
    (tmp_path / "debs").mkdir()
    monkeypatch.setenv("VCA_KERNEL_DEBS", str(tmp_path / "debs"))
    monkeypatch.setenv("VCA_IMAGE_PROFILES", str(pdir))
    (own / "mine.yml").write_text("extends: ubuntu-22.04\nkernel: {vca_userspace: {version: 2.3.26}}\n")
    assert cli.main(["recipe", "--profile", str(own / "mine.yml")]) == 0
    assert re.fullmatch(r"[0-9a-f]{16}\n", capsys.readouterr().out)
    profile = load(str(own / "mine.yml"))
    assert profile["suite"] == "jammy" and profile["kernel"]["vca_userspace"]["version"] == "2.3.26"
    assert profile["kernel"]["vca_userspace"]["agent_units"] == ["vca_agent.service"]   # the rest is ubuntu's


def test_extends_a_name_found_nowhere_names_both_places(pdir, own):
    (own / "mine.yml").write_text("extends: ubuntu-24.04\n")
    with pytest.raises(ProfileError) as err:
        load(str(own / "mine.yml"), pdir)
    assert str(err.value) == ("%s: extends: no profile ubuntu-24.04: no ubuntu-24.04.yml in %s (beside it) or %s "
                              "(the shipped profiles)" % (own / "mine.yml", own, pdir))


def test_a_sibling_is_found_before_a_shipped_profile_of_the_same_name(pdir, own):
    """mine -> debian-12 beside it (not the shipped one) -> base, which is only shipped."""
    (own / "mine.yml").write_text("extends: debian-12\n")
    (own / "debian-12.yml").write_text("extends: base\ndescription: my own Debian\nsuite: trixie\n"
                                       "mirror: http://deb.debian.org/debian\n"
                                       "kernel: {source: distribution, packages: [linux-image-amd64]}\n")
    profile = load(str(own / "mine.yml"), pdir)
    assert profile["suite"] == "trixie" and profile["description"] == "my own Debian"
    assert "pocl-opencl-icd" not in profile["packages"]                # nothing from the shipped debian-12
    assert profile["_files"] == [str(own / "mine.yml"), str(own / "debian-12.yml"), str(pdir / "base.yml")]


# Intel's node-side VCA userspace (kernel.vca_userspace), from kernel.debs_dir beside the kernel.

KERNEL_DEB = "linux-image-4.14.20-1.2.3.26.vca_4.14.20-1.2.3.26.vca_amd64.deb"
NODE_DEB = "vcass-modules-4.14.20-1.2.3.26.vca_2.3.26_amd64.deb"


@pytest.fixture
def debs(tmp_path, monkeypatch):
    """Intel's files as an owner has them (empty: selection works on the names), with neighbours."""
    d = tmp_path / "debs"
    d.mkdir()
    for name in (KERNEL_DEB, NODE_DEB, "linux-headers-4.14.20-1.2.3.26.vca_4.14.20-1.2.3.26.vca_amd64.deb",
                 "vcass-modules-4.4.98-1.2.2.0.vca_2.2.0_amd64.deb", "daemon-vca_2.3.26_amd64.deb"):
        (d / name).write_bytes(b"")
    monkeypatch.setenv("VCA_KERNEL_DEBS", str(d))
    return d


def mine(own, text="kernel: {vca_userspace: {version: 2.3.26}}\n"):
    (own / "mine.yml").write_text("extends: ubuntu-22.04\n" + text)
    return str(own / "mine.yml")


def test_node_userspace_is_selected_by_name_and_version_with_the_kernel(pdir, own, debs):
    profile = load(mine(own), pdir)
    assert kernel_debs(profile) == [debs / KERNEL_DEB, debs / NODE_DEB]
    assert agent_units(profile) == ["vca_agent.service"]
    assert agent_units(load("debian-12", pdir)) == []


def test_node_userspace_of_another_version_is_refused(pdir, own, debs):
    profile = load(mine(own, "kernel: {vca_userspace: {version: 2.3.27}}\n"), pdir)
    with pytest.raises(ProfileError) as err:
        kernel_debs(profile)
    assert str(err.value) == ("%s: vcass-modules-4.14.20-1.2.3.26.vca is version 2.3.26, the profile asks for "
                              "2.3.27 (kernel.vca_userspace.version)" % (debs / NODE_DEB))


def test_missing_node_userspace_is_named_with_the_kernel_problem(pdir, own, debs):
    (debs / NODE_DEB).unlink()
    (debs / KERNEL_DEB).rename(debs / "linux-image-4.14.20-1.2.3.26.vca_4.14.20-1.2.3.25.vca_amd64.deb")
    with pytest.raises(ProfileError) as err:
        kernel_debs(load(mine(own), pdir))
    problems = str(err.value).split("; ")
    assert len(problems) == 2 and "is version 4.14.20-1.2.3.25.vca, the profile asks for 4.14.20-1.2.3.26.vca" \
        in problems[0]
    assert problems[1] == ("%s: no vcass-modules-4.14.20-1.2.3.26.vca_*.deb (Intel's node-side VCA package "
                           "(kernel.vca_userspace))" % debs)


def test_the_shipped_placeholder_version_stops_the_build_naming_the_version_found(pdir, debs):
    profile = load("ubuntu-22.04", pdir)
    assert profile["kernel"]["vca_userspace"]["version"] == UNSET
    with pytest.raises(ProfileError) as err:
        kernel_debs(profile)
    assert "kernel.vca_userspace.version is UNSET, a placeholder" in str(err.value)
    assert "%s is version 2.3.26" % (debs / NODE_DEB) in str(err.value)
    assert "set kernel.vca_userspace.version: 2.3.26 in a profile of your own" in str(err.value)


def test_intel_kernel_without_its_userspace_is_refused(pdir, debs):
    text = (pdir / "ubuntu-22.04.yml").read_text()
    (pdir / "bare.yml").write_text(text[:text.index("  # Intel's node packages")] + "formats: [blockio]\n")
    assert "vca_userspace" not in yaml.safe_load((pdir / "bare.yml").read_text())["kernel"]
    with pytest.raises(ProfileError, match=r"bare.yml: kernel.vca_userspace is required when kernel.source is "
                                           r"debs_dir"):
        load("bare", pdir)


@pytest.mark.parametrize("text, message", [
    ("kernel: {vca_userspace: {names: [vcass-modules], version: '1'}}\n",
     r"deb.yml: kernel.vca_userspace: 'agent_units' is a required property"),
    ("kernel: {vca_userspace: {names: [m], version: '1', agent_units: ['vca_agent.service; reboot']}}\n",
     r"deb.yml: kernel.vca_userspace.agent_units.0: 'vca_agent.service; reboot' is not a systemd service name"),
    ("kernel: {vca_userspace: {names: [m], version: '1', agent_units: [vca_agent.service]}}\n",
     r"deb.yml: kernel.vca_userspace: Intel's node packages go with Intel's kernel"),
])
def test_vca_userspace_is_checked(pdir, text, message):
    (pdir / "deb.yml").write_text("extends: debian-12\n" + text)
    with pytest.raises(ProfileError, match=message):
        load("deb", pdir)


def test_the_image_config_names_the_agent_units_the_verifier_checks(tmp_path):
    profile = load("debian-12", PROFILES)
    profile["kernel"]["vca_userspace"] = {"names": ["vcass-modules-x"], "version": "1",
                                          "agent_units": ["vca_agent.service"]}
    rootfs = tmp_path / "rootfs"
    (rootfs / "boot").mkdir(parents=True)
    configure(profile, rootfs, ROOT / "image_builder", [])
    conf = (rootfs / "etc/vca-node.conf").read_text()
    assert "VCA_AGENT_UNITS=vca_agent.service\n" in conf and "IFACE=eth0\n" in conf
