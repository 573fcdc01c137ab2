"""node_image's host side on real disk images (GPT + ext4 made by the builder's own make_disk):
the image store (publish, candidate, promote, prune), each node's disk (overlay written into
partition 2, kept for rollback), the modules over them, and the lab's blockio boot."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.module_utils.vca_node_image import (
    ImageStore,
    NodeDisk,
    NodeImageError,
    overlay_digest,
    overlay_entries,
    root_partition_offset,
    write_files,
)

from conftest import ROOT, load_library, run_module
from vca_image import build as builder
from vcasim.vcactl import Fleet, run

TIMING = {"boot_s": 2.0, "net_s": 1.0, "reset_s": 1.0, "shutdown_s": 1.0}
VCAADMIN = 1234          # uid and gid of vcaadmin in the test disk's /etc/passwd
FLEET_GID = 2345
FLEET_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFleetKeyOfTheRolloutTest fleet@vca-host"


def make_build(tmp_path, name, marker, build_id=None):
    """A build directory as `vca-image build --out` leaves it, with a tiny real disk."""
    rootfs = tmp_path / f"rootfs-{marker}"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "usr/local/sbin").mkdir(parents=True)
    build_id = build_id or hashlib.sha256(marker.encode()).hexdigest()[:16]
    (rootfs / "etc/vca-image.json").write_text(json.dumps({"build_id": build_id, "profile": name}))
    (rootfs / "etc/vca-node.conf").write_text("IFACE=eth0\nMTU=65521\nMEM_FLOOR_MIB=256\n")
    (rootfs / "etc/hostname").write_text("vca-node\n")
    (rootfs / "usr/local/sbin/vca-node-verify").write_text("#!/usr/bin/python3\n# %s\n" % marker)
    # the image's own accounts, on purpose not this machine's: the overlay's owner names resolve against them
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                       "vcaadmin:x:%d:%d::/home/vcaadmin:/bin/bash\n" % (VCAADMIN, VCAADMIN))
    (rootfs / "etc/group").write_text("root:x:0:\nsudo:x:27:vcaadmin\nvcaadmin:x:%d:\nfleet:x:%d:\n"
                                      % (VCAADMIN, FLEET_GID))
    (rootfs / "home/vcaadmin").mkdir(parents=True)
    os.chown(rootfs / "home/vcaadmin", VCAADMIN, VCAADMIN)
    out = tmp_path / f"build-{marker}"
    out.mkdir()
    profile = {"name": name, "image": {"size_mib": 64, "fs_uuid": "2d1bd8b4-7c1e-4f5a-9a63-0c5f0e0a2b01",
                                       "hash_seed": "6a1f3c52-9b0e-4d27-8e44-3f1d2c7b9a10", "source_date_epoch": 0}}
    disk = builder.make_disk(profile, rootfs, out)
    record = {"build_id": build_id, "recipe": "r-" + marker, "image": disk.name, "sha256": builder.sha256(disk)}
    (out / f"{name}.json").write_text(json.dumps(record))
    return out, record


def read_file(disk, path):
    target = f"{disk}?offset={root_partition_offset(str(disk))}"
    return subprocess.run(["debugfs", "-R", f"cat {path}", target], capture_output=True, text=True,
                          check=False).stdout


def stat(disk, path):
    """(type, mode, uid, gid) of path inside the disk's partition 2, as debugfs reports it."""
    target = f"{disk}?offset={root_partition_offset(str(disk))}"
    text = subprocess.run(["debugfs", "-R", f"stat {path}", target], capture_output=True, text=True,
                          check=False).stdout
    kind = re.search(r"Type:\s*(\S+)\s+Mode:\s*([0-7]+)", text)
    owner = re.search(r"User:\s*(\d+)\s+Group:\s*(\d+)", text)
    return (kind.group(1), kind.group(2), int(owner.group(1)), int(owner.group(2))) if kind and owner else None


@pytest.fixture
def two_builds(tmp_path):
    return make_build(tmp_path, "tiny", "one"), make_build(tmp_path, "tiny", "two")


def test_publish_checks_sha256_and_makes_the_candidate(tmp_path, two_builds):
    (src, rec), _ = two_builds
    store = ImageStore(str(tmp_path / "store"))
    assert store.add(str(src)) == rec["build_id"]
    info = store.info()
    assert info["candidate"] == rec["build_id"] and info["good"] is None
    assert info["recipes"] == {rec["recipe"]: rec["build_id"]}
    assert (tmp_path / "store" / rec["build_id"] / "tiny.img").exists() and not src.exists()


def test_a_corrupt_build_is_not_published_and_is_left_in_place(tmp_path, two_builds):
    (src, _), _ = two_builds
    with open(src / "tiny.img", "r+b") as fh:
        fh.seek(4096 * 512 + 8192)
        fh.write(b"bitrot")
    store = ImageStore(str(tmp_path / "store"))
    with pytest.raises(NodeImageError, match=r"sha256 .* not published"):
        store.add(str(src))
    assert src.exists() and store.info()["builds"] == []


def test_promote_keeps_the_good_before_as_previous_and_prunes_the_rest(tmp_path, two_builds):
    (src1, r1), (src2, r2) = two_builds
    src3, r3 = make_build(tmp_path, "tiny", "three")
    store = ImageStore(str(tmp_path / "store"))
    for src, rec in ((src1, r1), (src2, r2), (src3, r3)):
        store.add(str(src))
        assert store.promote(rec["build_id"])[0] is True
    info = store.info()
    assert (info["good"], info["previous"], info["candidate"]) == (r3["build_id"], r2["build_id"], r3["build_id"])
    assert info["builds"] == sorted([r2["build_id"], r3["build_id"]]), "build one should have been pruned"
    assert store.promote(r3["build_id"]) == (False, [])          # a second run changes nothing


def test_check_mode_changes_nothing(tmp_path, two_builds):
    (src1, r1), (src2, r2) = two_builds
    store = ImageStore(str(tmp_path / "store"))
    store.add(str(src1))
    store.promote(r1["build_id"])
    store.add(str(src2))
    before = store.info()
    assert store.promote(r2["build_id"], check=True)[0] is True
    assert store.select(r1["build_id"], check=True) is True
    assert store.info() == before


def test_node_disk_gets_its_overlay_inside_partition_2_and_keeps_the_previous(tmp_path, two_builds):
    (src1, r1), (src2, r2) = two_builds
    store = ImageStore(str(tmp_path / "store"))
    store.add(str(src1))
    store.add(str(src2))
    disk = NodeDisk(str(tmp_path / "nodes/vca-node4.img"))
    files = {"/etc/hostname": "vca-node4\n", "/etc/vca-node.local.conf": "HOSTNAME=vca-node4\n",
             "/etc/network/interfaces.d/eth0": "auto eth0\n"}
    assert disk.ensure(store.image(r1["build_id"]), r1["build_id"], files) is True
    assert read_file(disk.path, "/etc/hostname") == "vca-node4\n"
    assert read_file(disk.path, "/etc/vca-node.local.conf") == "HOSTNAME=vca-node4\n"
    assert json.loads(read_file(disk.path, "/etc/vca-image.json"))["build_id"] == r1["build_id"]
    # the store's image is untouched: the overlay went into the node's copy only
    assert read_file(store.image(r1["build_id"]), "/etc/hostname") == "vca-node\n"
    assert disk.ensure(store.image(r1["build_id"]), r1["build_id"], files) is False
    assert disk.ensure(store.image(r2["build_id"]), r2["build_id"], files) is True
    assert disk.previous()["build_id"] == r1["build_id"]
    assert json.loads(read_file(disk.path, "/etc/vca-image.json"))["build_id"] == r2["build_id"]
    assert disk.rollback()["build_id"] == r1["build_id"]
    assert json.loads(read_file(disk.path, "/etc/vca-image.json"))["build_id"] == r1["build_id"]
    assert disk.rollback() is None                           # nothing further back


def test_a_changed_overlay_rewrites_the_disk(tmp_path, two_builds):
    (src1, r1), _ = two_builds
    disk = NodeDisk(str(tmp_path / "vca-node0.img"))
    disk.ensure(str(src1 / "tiny.img"), r1["build_id"], {"/etc/hostname": "a\n"})
    assert disk.ensure(str(src1 / "tiny.img"), r1["build_id"], {"/etc/hostname": "b\n"}) is True
    assert read_file(disk.path, "/etc/hostname") == "b\n"


def test_overlay_paths_are_checked(tmp_path, two_builds):
    (src1, r1), _ = two_builds
    disk = NodeDisk(str(tmp_path / "vca-node0.img"))
    with pytest.raises(NodeImageError, match="must be absolute"):
        disk.ensure(str(src1 / "tiny.img"), r1["build_id"], {"etc/../../x": "a"})
    assert not (tmp_path / "vca-node0.img").exists() and not (tmp_path / "vca-node0.img.new").exists()


def ssh_overlay(tmp_path):
    """The access part of a node's overlay: a host key read from files on this machine, and the
    fleet's key for vcaadmin in its 0700 ~/.ssh; listed file before directory, on purpose."""
    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    (keys / "host").write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nnot a real key\n")
    (keys / "host.pub").write_text("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostKey root@vca-node0\n")
    return {
        "/home/vcaadmin/.ssh/authorized_keys": {"content": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFleet fleet\n",
                                                "mode": "0600", "owner": "vcaadmin", "group": "vcaadmin"},
        "/home/vcaadmin/.ssh": {"state": "directory", "mode": "0700", "owner": "vcaadmin", "group": "vcaadmin"},
        "/etc/ssh/ssh_host_ed25519_key": {"src": str(keys / "host"), "mode": "0600"},
        "/etc/ssh/ssh_host_ed25519_key.pub": {"src": str(keys / "host.pub")},
        "/etc/hostname": "vca-node0\n",
    }


def test_entries_get_their_mode_and_owner_from_the_disks_own_accounts(tmp_path, two_builds):
    (src1, r1), _ = two_builds
    files = ssh_overlay(tmp_path) | {
        "/srv/new/deep/tool": {"content": "#!/bin/sh\n", "mode": "0750", "owner": 0, "group": "fleet"},
        "/var/lib/vca/spool": {"state": "directory", "owner": "4242", "group": 4343},
    }
    order = [path for path, _ in overlay_entries(files)]
    assert order.index("/home/vcaadmin/.ssh") < order.index("/home/vcaadmin/.ssh/authorized_keys")
    disk = NodeDisk(str(tmp_path / "vca-node0.img"))
    assert disk.ensure(str(src1 / "tiny.img"), r1["build_id"], files) is True
    assert stat(disk.path, "/home/vcaadmin/.ssh") == ("directory", "0700", VCAADMIN, VCAADMIN)
    assert stat(disk.path, "/home/vcaadmin/.ssh/authorized_keys") == ("regular", "0600", VCAADMIN, VCAADMIN)
    assert read_file(disk.path, "/home/vcaadmin/.ssh/authorized_keys").startswith("ssh-ed25519 AAAAC3")
    assert stat(disk.path, "/etc/ssh/ssh_host_ed25519_key") == ("regular", "0600", 0, 0)
    assert read_file(disk.path, "/etc/ssh/ssh_host_ed25519_key") == (tmp_path / "keys/host").read_text()
    assert stat(disk.path, "/etc/ssh/ssh_host_ed25519_key.pub") == ("regular", "0644", 0, 0)
    assert stat(disk.path, "/etc/hostname") == ("regular", "0644", 0, 0)        # the text form, as before
    assert stat(disk.path, "/srv/new/deep/tool") == ("regular", "0750", 0, FLEET_GID)
    assert stat(disk.path, "/var/lib/vca/spool") == ("directory", "0755", 4242, 4343)
    # made on the way: root 0755; there already: left as it was
    assert stat(disk.path, "/srv/new/deep") == ("directory", "0755", 0, 0)
    assert stat(disk.path, "/home/vcaadmin") == ("directory", "0755", VCAADMIN, VCAADMIN)


@pytest.mark.parametrize("entry, message", [
    ({"content": "x", "mode": "0600", "onwer": "vcaadmin"}, r"/etc/x: unknown key\(s\) onwer"),
    ({"content": "x", "src": "/etc/hostname"}, "/etc/x: a file needs exactly one of content and src "
                                               r"\(content and src given\)"),
    ({"mode": "0600"}, r"/etc/x: a file needs exactly one of content and src \(neither given\)"),
    ({"content": "x", "mode": "600x"}, "/etc/x: mode '600x': an octal string"),
    ({"content": "x", "mode": 384}, "/etc/x: mode 384: an octal string"),
    ({"content": "x", "mode": "0800"}, "/etc/x: mode '0800'"),
    ({"state": "directory", "content": "x"}, "/etc/x: a directory takes no content"),
    ({"state": "link", "content": "x"}, "/etc/x: state 'link', not file or directory"),
    ({"src": "keys/host"}, "/etc/x: src must be an absolute path"),
    ({"src": "/nonexistent/host"}, "/etc/x: cannot read its src /nonexistent/host"),
    ({"content": "x", "owner": "nosuchuser"}, "/etc/x: owner nosuchuser is not in /etc/passwd of .*"),
    ({"content": "x", "group": "nosuchgroup"}, "/etc/x: group nosuchgroup is not in /etc/group of .*"),
    ({"content": "x", "owner": True}, "/etc/x: owner True is neither a name nor a number"),
    (["x"], "/etc/x: the text of a file or a mapping"),
], ids=["unknown-key", "content-and-src", "neither", "bad-mode", "mode-as-number", "not-octal",
        "directory-with-content", "bad-state", "relative-src", "missing-src", "unknown-owner", "unknown-group",
        "bool-owner", "list"])
def test_bad_entries_are_refused_naming_the_path_and_nothing_is_left(tmp_path, two_builds, entry, message):
    (src1, r1), _ = two_builds
    disk = NodeDisk(str(tmp_path / "vca-node0.img"))
    with pytest.raises(NodeImageError, match=message):
        disk.ensure(str(src1 / "tiny.img"), r1["build_id"], {"/etc/hostname": "n\n", "/etc/x": entry})
    assert not (tmp_path / "vca-node0.img").exists() and not (tmp_path / "vca-node0.img.new").exists()


def test_a_file_where_the_disk_has_a_directory_is_refused_before_anything_is_written(tmp_path, two_builds):
    (src1, _), _ = two_builds
    copy = tmp_path / "copy.img"
    shutil.copyfile(src1 / "tiny.img", copy)
    with pytest.raises(NodeImageError, match=r"overlay /home/vcaadmin: a directory on .*, the overlay would "
                                             r"make it a file"):
        write_files(str(copy), {"/home/vcaadmin": "x\n"})
    assert stat(copy, "/home/vcaadmin") == ("directory", "0755", VCAADMIN, VCAADMIN)
    with pytest.raises(NodeImageError, match=r"overlay /etc/hostname: a regular on .*, the overlay would make it "
                                             r"a directory"):
        write_files(str(copy), {"/etc/hostname": {"state": "directory"}})


def test_what_reads_back_otherwise_fails_naming_the_path(tmp_path, two_builds):
    """A debugfs that sets another mode and drops the gid lines of the script: the read-back must see it."""
    (src1, _), _ = two_builds
    copy = tmp_path / "copy.img"
    shutil.copyfile(src1 / "tiny.img", copy)
    lossy = tmp_path / "lossy-debugfs"
    lossy.write_text('#!/bin/sh\nif [ "$1" = -w ]; then sed -i -e "s/ mode 0100[0-7]*$/ mode 0100644/" '
                     '-e "/ gid /d" "$3"; fi\nexec debugfs "$@"\n')
    lossy.chmod(0o755)
    files = {"/etc/secret": {"content": "s\n", "mode": "0600", "group": "fleet"}}
    with pytest.raises(NodeImageError, match=r"writing /etc/secret into partition 2 failed: regular 0644 0:0, "
                                             r"want regular 0600 0:%d" % FLEET_GID):
        write_files(str(copy), files, debugfs=str(lossy))
    # one that empties every file it writes
    lossy.write_text('#!/bin/sh\nif [ "$1" = -w ]; then grep "^write " "$3" | while read -r _ local _; do '
                     ': > "$local"; done; fi\nexec debugfs "$@"\n')
    with pytest.raises(NodeImageError, match="writing /etc/secret into partition 2 failed: its content reads back "
                                             "otherwise"):
        write_files(str(copy), files, debugfs=str(lossy))
    write_files(str(copy), files)
    assert stat(copy, "/etc/secret") == ("regular", "0600", 0, FLEET_GID)
    assert read_file(copy, "/etc/secret") == "s\n"


def test_the_digest_follows_what_src_holds_and_every_mode_and_owner(tmp_path, two_builds):
    (src1, r1), _ = two_builds
    files = ssh_overlay(tmp_path)
    first = overlay_digest(files)
    assert overlay_digest(ssh_overlay(tmp_path)) == first
    variants = [
        dict(files, **{"/home/vcaadmin/.ssh": dict(files["/home/vcaadmin/.ssh"], mode="0750")}),
        dict(files, **{"/home/vcaadmin/.ssh": dict(files["/home/vcaadmin/.ssh"], owner="root")}),
        dict(files, **{"/home/vcaadmin/.ssh": dict(files["/home/vcaadmin/.ssh"], group=0)}),
        dict(files, **{"/etc/ssh/ssh_host_ed25519_key": {"src": files["/etc/ssh/ssh_host_ed25519_key"]["src"]}}),
    ]
    assert len({overlay_digest(v) for v in variants} | {first}) == len(variants) + 1
    disk = NodeDisk(str(tmp_path / "vca-node0.img"))
    assert disk.ensure(str(src1 / "tiny.img"), r1["build_id"], files) is True
    assert disk.ensure(str(src1 / "tiny.img"), r1["build_id"], files) is False
    # the node's key was replaced in the store: same src name, new bytes, so the disk is rewritten
    (tmp_path / "keys/host").write_bytes(b"-----BEGIN OPENSSH PRIVATE KEY-----\nthe new key\n")
    assert overlay_digest(files) != first
    assert disk.ensure(str(src1 / "tiny.img"), r1["build_id"], files) is True
    assert "the new key" in read_file(disk.path, "/etc/ssh/ssh_host_ed25519_key")


def test_an_overlay_of_text_only_keeps_the_digest_it_had(tmp_path):
    # disks written before entries had a dict form carry this digest: they are not rewritten for it
    files = {"/etc/hostname": "vca-node4\n", "/etc/hosts": "127.0.0.1\tlocalhost\n"}
    assert overlay_digest(files) == hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    assert overlay_digest(files) != overlay_digest(dict(files, **{"/etc/hostname": {"content": "vca-node4\n"}}))


def test_modules_report_and_refuse_clearly(tmp_path, two_builds, capsys):
    (src1, r1), _ = two_builds
    store = str(tmp_path / "store")
    result = run_module("vca_image_store", {"path": store, "state": "present", "src": str(src1)}, capsys)
    assert result["changed"] and result["candidate"] == r1["build_id"]
    assert result["images"][r1["build_id"]].endswith("/tiny.img")
    result = run_module("vca_image_store", {"path": store, "state": "promoted", "build_id": "nosuchbuild"}, capsys)
    assert result["failed"] and "no build nosuchbuild" in result["msg"]
    disk = str(tmp_path / "vca-node0.img")
    args = {"path": disk, "image": result and str(tmp_path / "store" / r1["build_id"] / "tiny.img"),
            "build_id": r1["build_id"], "files": {"/etc/hostname": "vca-node0\n"}}
    assert run_module("vca_node_disk", dict(args, _ansible_check_mode=True), capsys)["changed"] is True
    assert not (tmp_path / "vca-node0.img").exists()
    assert run_module("vca_node_disk", args, capsys)["changed"] is True
    assert run_module("vca_node_disk", args, capsys)["changed"] is False
    result = run_module("vca_node_disk", {"path": disk, "state": "rolled_back"}, capsys)
    assert result["failed"] and "no previous disk" in result["msg"]


def test_the_module_masks_contents_but_its_messages_name_paths_modes_and_owners(tmp_path, two_builds, capsys):
    (src1, r1), _ = two_builds
    secret = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAISecretish fleet\n"
    files = ssh_overlay(tmp_path)
    files["/home/vcaadmin/.ssh/authorized_keys"]["content"] = secret
    files["/home/vcaadmin/.ssh/authorized_keys"]["group"] = "vcaadmins"        # no such group on the disk
    args = {"path": str(tmp_path / "vca-node0.img"), "image": str(src1 / "tiny.img"), "build_id": r1["build_id"],
            "files": files}
    result = run_module("vca_node_disk", args, capsys)
    assert result["failed"]
    assert result["msg"].endswith("overlay /home/vcaadmin/.ssh/authorized_keys: group vcaadmins is not in "
                                  "/etc/group of %s.new's root file system" % args["path"]), result["msg"]
    assert secret.strip() not in json.dumps(result)
    logged = result["invocation"]["module_args"]["files"]
    assert logged["/home/vcaadmin/.ssh/authorized_keys"]["mode"] == "0600"
    files["/home/vcaadmin/.ssh/authorized_keys"]["group"] = "vcaadmin"
    files["/home/vcaadmin/.ssh/authorized_keys"]["mode"] = "0660x"
    result = run_module("vca_node_disk", args, capsys)
    assert "overlay /home/vcaadmin/.ssh/authorized_keys: mode '0660x'" in result["msg"], result["msg"]
    files["/home/vcaadmin/.ssh/authorized_keys"]["mode"] = "0600"
    result = run_module("vca_node_disk", args, capsys)
    assert result["changed"] is True and secret.strip() not in json.dumps(result)
    assert stat(args["path"], "/home/vcaadmin/.ssh/authorized_keys") == ("regular", "0600", VCAADMIN, VCAADMIN)
    assert read_file(args["path"], "/home/vcaadmin/.ssh/authorized_keys") == secret


def test_node_disk_docs_parse_and_say_the_caller_powers_the_node_off():
    module = load_library("vca_node_disk")
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert yaml.safe_load(module.EXAMPLES) and yaml.safe_load(module.RETURN)
    text = " ".join(doc["description"])
    assert "does not power the node off" in text and "The caller must have the node off" in text
    files = " ".join(doc["options"]["files"]["description"])
    assert all(word in files for word in ("C(content)", "C(src)", "C(mode)", "C(owner)", "C(group)", "C(state)"))
    # the example's entries are ones the writer takes: a host key from src 0600, ~/.ssh 0700, authorized_keys 0600
    example = yaml.safe_load(module.EXAMPLES)[1]["vca_node_disk"]["files"]
    entries = dict(overlay_entries(example))
    assert entries["/etc/ssh/ssh_host_ed25519_key"]["mode"] == 0o600 and entries["/etc/ssh/ssh_host_ed25519_key"]["src"]
    assert (entries["/home/vcaadmin/.ssh"]["state"], entries["/home/vcaadmin/.ssh"]["mode"]) == ("directory", 0o700)
    assert entries["/home/vcaadmin/.ssh/authorized_keys"]["owner"] == "vcaadmin"


def test_lab_boot_reads_the_opened_disk(tmp_path, two_builds, monkeypatch):
    (src1, r1), _ = two_builds
    now = [1000.0]
    config = {"nodes": [{"card": 0, "cpu": 0, "initial": "bios_up"}, {"card": 0, "cpu": 1, "initial": "bios_up"}]}
    fleet = Fleet(config, {}, TIMING, clock=lambda: now[0])
    fleet.boot_dir = tmp_path / "boot"

    def vcactl(*argv):
        out = io.StringIO()
        return run(list(argv), fleet, out=out), out.getvalue()

    assert vcactl("blockio", "open", "0", "0", "vcablk0", "RW", str(src1 / "tiny.img"))[0] == 0
    assert "tiny.img" in vcactl("blockio", "list")[1]
    assert vcactl("boot", "0", "0", "vcablk0")[0] == 0
    now[0] += 3.5
    assert "STATE: net_device_ready" in vcactl("status", "0", "0")[1]
    booted = tmp_path / "boot" / "0-0"
    assert json.loads((booted / "vca-image.json").read_text())["build_id"] == r1["build_id"]
    assert "# one" in (booted / "vca-node-verify").read_text()
    # an up node's disk cannot be swapped under it
    rc, out = vcactl("blockio", "close", "0", "0", "vcablk0")
    assert rc == 1 and "in use" in out
    # a disk that is no VCA image: the node never reaches the OS
    blank = tmp_path / "blank.img"
    blank.write_bytes(bytes(1 << 20))
    assert vcactl("blockio", "open", "0", "1", "vcablk0", "RW", str(blank))[0] == 0
    assert vcactl("boot", "0", "1", "vcablk0")[0] == 0
    now[0] += 3.5
    assert "STATE: error" in vcactl("status", "0", "1")[1]
    assert list((tmp_path / "boot" / "0-1").iterdir()) == []


# The rollout (roles/node_image/tasks/rollout.yml) run by ansible-playbook on this machine, every
# host local: a fake vca2-boot.sh logs each verb with the build the node's disk holds at that moment
# (so the log shows whether the disk changed while the node was up), and its boot writes what the
# booted node reports; the verifier is a file copied into place.
FAKE_BOOT_SCRIPT = r"""#!/bin/bash
D=@DIR@
held=$(@PYTHON@ -c 'import json,sys; print(json.load(open(sys.argv[1]))["build_id"])' "$D/nodes/$2.json" 2>/dev/null)
echo "$1 $2 disk=${held:-none}" >> "$D/calls.log"
case $1 in
    shutdown) echo off > "$D/power-$2" ;;
    boot)
        [ -n "$held" ] || { echo "vca2-boot: $2: no disk yet"; exit 1; }
        if [ "$(cat "$D/power-$2" 2>/dev/null)" = on ]; then
            echo "vca2-boot: $2 is up: not booting a node that is up"; exit 1
        fi
        echo on > "$D/power-$2"
        echo "{\"build_id\": \"$held\"}" > "$D/release-$2.json" ;;
    *) exit 2 ;;
esac
"""
PASSING = {"platform": "lab", "results": [{"name": "root fs", "status": "pass", "detail": "ext4"},
                                            {"name": "VCA modules", "status": "skip", "detail": "not VCA"}]}


class Rollout:
    """One node (vca-node0) and its host, both local; run() plays the rollout once."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "rollout"
        (self.dir / "nodes").mkdir(parents=True)
        script = self.dir / "vca2-boot.sh"
        script.write_text(FAKE_BOOT_SCRIPT.replace("@DIR@", str(self.dir)).replace("@PYTHON@", sys.executable))
        script.chmod(0o755)
        (self.dir / "calls.log").write_text("")
        self.disk = NodeDisk(str(self.dir / "nodes" / "vca-node0.img"))
        # the node's host key in the host's store, made before any rollout (the role makes one where none is)
        self.host_keys = self.dir / "host-keys"
        (self.host_keys / "vca-node0").mkdir(parents=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                        str(self.host_keys / "vca-node0/ssh_host_ed25519_key")], check=True)

    def already_runs(self, image, build_id):
        """The node as an earlier rollout left it: its disk holds build_id and it runs it."""
        assert self.disk.ensure(str(image), build_id, self.overlay())
        (self.dir / "power-vca-node0").write_text("on\n")
        (self.dir / "release-vca-node0.json").write_text(json.dumps({"build_id": build_id}))

    def overlay(self):
        """The files the role's overlay template renders for vca-node0 (so that ensure() matches it)."""
        env = jinja2.Environment(keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
        env.filters["to_json"] = json.dumps
        text = (ROOT / "roles/node_image/templates/node-overlay.yml.j2").read_text()
        return yaml.safe_load(env.from_string(text).render(
            node_image_hostname="vca-node0", node_image_address="172.31.1.1", node_image_host_address="172.31.1.254",
            node_image_interface="eth0", node_image_prefix=24, node_image_mtu=65521, inventory_hostname="vca-node0",
            node_image_host_key_store=str(self.host_keys), node_image_authorized_keys=[FLEET_KEY],
            node_image_host_key=str(self.host_keys / "vca-node0/ssh_host_ed25519_key"),
            node_image_admin_user="vcaadmin", node_image_root_login="keys"))

    def calls(self):
        return (self.dir / "calls.log").read_text().splitlines()

    def run(self, image, build_id, verify=None, check=False, **extra):
        (self.dir / "verify.json").write_text(json.dumps(PASSING if verify is None else verify))
        inventory = {"all": {
            "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
            "children": {
                "vca_host": {"hosts": {"vca-host": {"node_image_candidate_id": build_id,
                                                    "node_image_candidate_image": str(image)}}},
                "vca_nodes": {"hosts": {"vca-node0": {"vca_node": 0, "vca_card": 0, "vca_cpu": 0,
                                                      "vca_node_ip": "172.31.1.1"}}}}}}
        (self.dir / "hosts.yml").write_text(yaml.safe_dump(inventory))
        (self.dir / "rollout.yml").write_text(yaml.safe_dump([{
            "name": "Rollout", "hosts": "vca_nodes", "gather_facts": False, "serial": 1,
            "tasks": [{"name": "Roll out", "ansible.builtin.include_role": {"name": "node_image",
                                                                            "tasks_from": "rollout"}}]}]))
        variables = {
            "node_image_disk_dir": str(self.dir / "nodes"),
            "node_image_boot_script": str(self.dir / "vca2-boot.sh"),
            "node_image_release_file": str(self.dir / "release-{{ inventory_hostname }}.json"),
            "node_image_verify_command": "cp %s %s" % (self.dir / "verify.json", self.dir / "result.json"),
            "node_image_verify_result": str(self.dir / "result.json"),
            "node_image_connect_timeout_s": 10,
            "node_image_host_key_store": str(self.host_keys),
            "node_image_authorized_keys": [FLEET_KEY],
            "node_image_known_hosts_file": str(self.dir / "known_hosts"),
            "node_image_expect_hardware": False,        # as in the lab; the tests for hardware set it
        } | extra
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
                   ANSIBLE_LIBRARY=str(ROOT / "library"), ANSIBLE_MODULE_UTILS=str(ROOT / "module_utils"),
                   ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0")
        playbook = shutil.which("ansible-playbook", path=str(Path(sys.executable).parent)) or "ansible-playbook"
        argv = [playbook, "-i", str(self.dir / "hosts.yml"), str(self.dir / "rollout.yml"), "-e", json.dumps(variables)]
        done = subprocess.run(argv + (["--check"] if check else []), cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300, check=False)
        out = done.stdout + done.stderr
        recap = re.search(r"^vca-node0\s+:.*changed=(\d+)", out, re.M)
        return done.returncode, out, int(recap.group(1)) if recap else None


def test_rollout_shuts_the_node_down_before_its_disk_changes_and_a_second_run_changes_nothing(tmp_path,
                                                                                          two_builds):
    (src1, r1), (src2, r2) = two_builds
    one, two = r1["build_id"], r2["build_id"]
    rollout = Rollout(tmp_path)
    rc, out, _ = rollout.run(src1 / "tiny.img", one)
    assert rc == 0, out[-3000:]
    # a node without a disk yet: shut down (its vcablk0 closed), the disk written, then booted from it
    assert rollout.calls() == ["shutdown vca-node0 disk=none", f"boot vca-node0 disk={one}"]
    assert rollout.disk.record()["build_id"] == one

    rc, out, changed = rollout.run(src1 / "tiny.img", one)          # it runs the candidate: not touched
    assert (rc, changed) == (0, 0), out[-3000:]
    assert len(rollout.calls()) == 2

    rc, out, changed = rollout.run(src2 / "tiny.img", two, check=True)   # check mode: reported, nothing done
    assert rc == 0 and changed == 1, out[-3000:]
    assert len(rollout.calls()) == 2 and rollout.disk.record()["build_id"] == one

    rc, out, _ = rollout.run(src2 / "tiny.img", two)                # the next build: off, written, booted
    assert rc == 0, out[-3000:]
    assert rollout.calls()[2:] == [f"shutdown vca-node0 disk={one}", f"boot vca-node0 disk={two}"]


SKIPPED = {"name": "VCA modules", "status": "skip", "detail": "no /sys/class/vca"}


@pytest.mark.parametrize("verify, hardware, named", [
    ({"platform": "hardware", "results": [PASSING["results"][0], SKIPPED]}, True,
     "VCA modules: skip: no /sys/class/vca"),
    ({"results": [PASSING["results"][0], SKIPPED]}, True, "VCA modules: skip"),      # no platform: hardware
    ({"platform": "unknown", "results": [PASSING["results"][0]]}, True,
     "VCA hardware expected, but the verifier found platform unknown"),
    ({"platform": "lab", "results": [{"name": "root fs", "status": "fail", "detail": "ro"}]}, False,
     "root fs: fail: ro"),
], ids=["skip-on-hardware", "skip-without-platform", "no-evidence-where-hardware-expected", "fail-in-the-lab"])
def test_a_failed_verifier_is_rolled_back_with_the_node_off(tmp_path, two_builds, verify, hardware, named):
    (src1, r1), (src2, r2) = two_builds
    one, two = r1["build_id"], r2["build_id"]
    rollout = Rollout(tmp_path)
    rollout.already_runs(src1 / "tiny.img", one)
    rc, out, _ = rollout.run(src2 / "tiny.img", two, verify=verify, node_image_expect_hardware=hardware)
    assert rc != 0, out[-3000:]
    assert f"vca-node0 failed build {two}" in out and named in out, out[-3000:]
    assert f"Rolled back to build {one} and booted it" in out, out[-3000:]
    # off before each change of its disk, and booted only when off
    assert rollout.calls() == [f"shutdown vca-node0 disk={one}", f"boot vca-node0 disk={two}",
                               f"shutdown vca-node0 disk={two}", f"boot vca-node0 disk={one}"]
    assert rollout.disk.record()["build_id"] == one


def test_ignored_checks_and_a_first_image_that_fails(tmp_path, two_builds):
    (src1, r1), _ = two_builds
    one = r1["build_id"]
    rollout = Rollout(tmp_path)
    verify = {"platform": "hardware", "results": [PASSING["results"][0], SKIPPED]}
    rc, out, _ = rollout.run(src1 / "tiny.img", one, verify=verify, node_image_verify_ignore=["VCA modules"],
                             node_image_expect_hardware=True)
    assert rc == 0, out[-3000:]                                     # an ignored check may skip, even on VCA
    # a first image (no previous disk) that fails: nothing to roll back to, the node is left as it is
    (rollout.dir / "release-vca-node0.json").write_text(json.dumps({"build_id": "something-else"}))
    rc, out, _ = rollout.run(src1 / "tiny.img", one, verify=verify, node_image_verify_ignore=["no such check"],
                             node_image_expect_hardware=True)
    assert rc != 0, out[-3000:]
    assert "node_image_verify_ignore names no check of this verifier: no such check" in out, out[-3000:]
    assert "Not rolled back: no previous disk on this node" in out, out[-3000:]
    assert "the node is left running it" in out, out[-3000:]     # it booted; the verifier failed it
    assert rollout.calls()[2:] == [f"shutdown vca-node0 disk={one}", f"boot vca-node0 disk={one}"]


def test_a_disk_that_cannot_be_written_is_left_as_it_was_and_booted(tmp_path, two_builds):
    (src1, r1), _ = two_builds
    one = r1["build_id"]
    rollout = Rollout(tmp_path)
    rollout.already_runs(src1 / "tiny.img", one)
    rc, out, _ = rollout.run(tmp_path / "missing.img", "b" * 16)
    assert rc != 0, out[-3000:]
    assert "no such image" in out and "Its disk was not changed and booted it" in out, out[-3000:]
    assert rollout.calls() == [f"shutdown vca-node0 disk={one}", f"shutdown vca-node0 disk={one}",
                               f"boot vca-node0 disk={one}"]
    assert rollout.disk.record()["build_id"] == one


def test_a_node_disk_is_root_only_and_tells_its_host_key(tmp_path, two_builds):
    (src1, r1), _ = two_builds
    rollout = Rollout(tmp_path)
    rollout.already_runs(src1 / "tiny.img", r1["build_id"])
    assert oct(os.stat(rollout.disk.path).st_mode & 0o777) == "0o600"      # it holds the private host key
    assert oct(os.stat(os.path.dirname(rollout.disk.path)).st_mode & 0o777) in ("0o700", "0o755")
    stored = (rollout.host_keys / "vca-node0/ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert rollout.disk.host_public_key() == " ".join(stored)
    assert NodeDisk(str(tmp_path / "none.img")).host_public_key() == ""


def test_a_rollback_to_a_disk_with_another_host_key_puts_that_key_in_known_hosts(tmp_path, two_builds):
    (src1, r1), (src2, r2) = two_builds
    one, two = r1["build_id"], r2["build_id"]
    rollout = Rollout(tmp_path)
    rollout.already_runs(src1 / "tiny.img", one)
    old = (rollout.host_keys / "vca-node0/ssh_host_ed25519_key.pub").read_text().split()[:2]
    # the store loses the key (or the running disk predates it): the new disk gets a new one
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):
        (rollout.host_keys / "vca-node0" / name).unlink()
    failing = {"platform": "lab", "results": [{"name": "root fs", "status": "fail", "detail": "full"}]}
    rc, out, _ = rollout.run(src2 / "tiny.img", two, verify=failing)
    assert rc != 0 and f"Rolled back to build {one} and booted it" in out, out[-3000:]
    new = (rollout.host_keys / "vca-node0/ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert new != old
    known = (rollout.dir / "known_hosts").read_text()
    # the node answers with the key of the disk it was rolled back to, and that is the one expected
    assert "vca-node0 %s" % " ".join(old) in known and " ".join(new) not in known, known

