"""image_builder profiles: extends, merge, and errors that name the file and key before any download."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT
from vca_image.build import recipe, user_hooks
from vca_image.profile import ProfileError, kernel_debs, list_profiles, load

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
