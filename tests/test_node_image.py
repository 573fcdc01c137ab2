"""node_image's host side on real disk images (GPT + ext4 made by the builder's own make_disk):
the image store (publish, candidate, promote, prune), each node's disk (overlay written into
partition 2, kept for rollback), the modules over them, and the lab's blockio boot."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess

import pytest
from ansible.module_utils.vca_node_image import ImageStore, NodeDisk, NodeImageError, root_partition_offset

from conftest import run_module
from vca_image import build as builder
from vcasim.vcactl import Fleet, run

TIMING = {"boot_s": 2.0, "net_s": 1.0, "reset_s": 1.0, "shutdown_s": 1.0}


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
