"""The lab's reimage: the simulated `vcactl boot` copies a disk's way in (host key, root-login
policy, each fleet user's authorized_keys) to the node's boot directory, and vcasim-reimage on the
node installs it with the modes and owners sshd insists on."""

from __future__ import annotations

import json
import os
import pwd
import stat

from vca_image import build as builder
from vcasim import reimage
from vcasim.vcactl import boot_from_disk, fleet_users

PROFILE = {"name": "tiny", "image": {"size_mib": 64, "fs_uuid": "2d1bd8b4-7c1e-4f5a-9a63-0c5f0e0a2b01",
                                     "hash_seed": "6a1f3c52-9b0e-4d27-8e44-3f1d2c7b9a10", "source_date_epoch": 0}}


def disk_with_access(tmp_path, users="vcaadmin root"):
    root = tmp_path / "rootfs"
    for d in ("etc/ssh/sshd_config.d", "root/.ssh", "home/vcaadmin/.ssh", "usr/local/sbin"):
        (root / d).mkdir(parents=True)
    (root / "etc/vca-image.json").write_text(json.dumps({"build_id": "b1"}))
    (root / "etc/vca-node.local.conf").write_text("HOSTNAME=vca-node0\nFLEET_USERS=%s\n" % users)
    (root / "etc/ssh/ssh_host_ed25519_key").write_text("PRIVATE\n")
    (root / "etc/ssh/ssh_host_ed25519_key.pub").write_text("ssh-ed25519 AAAAstore root@vca-node0\n")
    (root / "etc/ssh/sshd_config.d/00-root-login.conf").write_text("PermitRootLogin prohibit-password\n")
    (root / "root/.ssh/authorized_keys").write_text("ssh-ed25519 AAAAfleet root-key\n")
    (root / "home/vcaadmin/.ssh/authorized_keys").write_text("ssh-ed25519 AAAAfleet admin-key\n")
    out = tmp_path / "build"
    out.mkdir()
    return builder.make_disk(PROFILE, root, out)


def test_fleet_users_come_from_the_overlay_and_odd_names_are_dropped(tmp_path):
    conf = tmp_path / "vca-node.local.conf"
    conf.write_text("HOSTNAME=n\nFLEET_USERS=vcaadmin root ../etc\n")
    assert fleet_users(conf) == ["vcaadmin", "root"]
    assert fleet_users(tmp_path / "absent") == []


def test_a_boot_copies_the_disks_access_with_private_modes_and_the_record_last(tmp_path):
    booted = tmp_path / "booted"
    assert boot_from_disk(str(disk_with_access(tmp_path)), booted)
    assert (booted / "ssh_host_ed25519_key").read_text() == "PRIVATE\n"
    assert stat.S_IMODE((booted / "ssh_host_ed25519_key").stat().st_mode) == 0o600
    assert (booted / "authorized_keys.vcaadmin").read_text() == "ssh-ed25519 AAAAfleet admin-key\n"
    assert (booted / "authorized_keys.root").read_text() == "ssh-ed25519 AAAAfleet root-key\n"
    assert stat.S_IMODE((booted / "authorized_keys.root").stat().st_mode) == 0o600
    assert (booted / "00-root-login.conf").exists()
    # vca-image.json is what vcasim-reimage waits for: nothing it needs may come after it
    newest = max(booted.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    assert newest.name == "vca-image.json"


def test_only_the_fleet_users_of_the_overlay_are_copied(tmp_path):
    booted = tmp_path / "booted"
    assert boot_from_disk(str(disk_with_access(tmp_path, users="vcaadmin")), booted)
    assert (booted / "authorized_keys.vcaadmin").exists()
    assert not (booted / "authorized_keys.root").exists()


def test_adopt_installs_keys_with_the_modes_and_owner_sshd_wants(tmp_path):
    booted = tmp_path / "booted"
    assert boot_from_disk(str(disk_with_access(tmp_path)), booted)
    etc = tmp_path / "etc"
    (etc / "ssh/sshd_config.d").mkdir(parents=True)
    (etc / "ssh/ssh_host_ed25519_key").write_text("THE CONTAINER'S OWN\n")
    me = pwd.getpwuid(os.getuid())
    homes = {}

    def account(name):
        home = tmp_path / "home" / name
        home.mkdir(parents=True, exist_ok=True)
        homes[name] = home
        return pwd.struct_passwd((name, "x", me.pw_uid, me.pw_gid, "", str(home), "/bin/sh"))

    done = reimage.adopt(booted, etc=etc, account=account)
    assert (etc / "ssh/ssh_host_ed25519_key").read_text() == "PRIVATE\n"
    assert stat.S_IMODE((etc / "ssh/ssh_host_ed25519_key").stat().st_mode) == 0o600
    assert stat.S_IMODE((etc / "ssh/ssh_host_ed25519_key.pub").stat().st_mode) == 0o644
    assert (etc / "ssh/sshd_config.d/00-root-login.conf").read_text() == "PermitRootLogin prohibit-password\n"
    assert sorted(homes) == ["root", "vcaadmin"]
    keys = homes["vcaadmin"] / ".ssh/authorized_keys"
    assert keys.read_text() == "ssh-ed25519 AAAAfleet admin-key\n"
    assert stat.S_IMODE(keys.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.parent.stat().st_mode) == 0o700
    assert keys.stat().st_uid == me.pw_uid
    assert "vcaadmin's authorized_keys" in done
    # a second adoption of the same boot leaves the same files
    reimage.adopt(booted, etc=etc, account=account)
    assert keys.read_text() == "ssh-ed25519 AAAAfleet admin-key\n"
