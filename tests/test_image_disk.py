"""The disk assembly on a small tree: GPT + ext4 on partition 2, bit-identical twice, verify."""

from __future__ import annotations

import os
import subprocess
import time

from vca_image import build
from vca_image.cli import verify_image

PROFILE = {"name": "tiny", "image": {"size_mib": 64, "fs_uuid": "2d1bd8b4-7c1e-4f5a-9a63-0c5f0e0a2b01",
                                     "hash_seed": "6a1f3c52-9b0e-4d27-8e44-3f1d2c7b9a10",
                                     "source_date_epoch": 1767225600}}


def tree(root):
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("vca-node\n")
    (root / "usr/local/sbin").mkdir(parents=True)
    (root / "usr/local/sbin/tool").write_text("#!/bin/sh\n")
    os.symlink("../usr/local/sbin/tool", root / "etc/tool")
    build.clamp_mtimes(root, PROFILE["image"]["source_date_epoch"])


def test_two_assemblies_of_one_tree_are_bit_identical_and_verify(tmp_path):
    shas = []
    for i in (1, 2):
        root = tmp_path / ("rootfs%d" % i)
        tree(root)
        time.sleep(1.1)                 # ctimes differ between the two trees: the clamp must hide it
        out = tmp_path / ("out%d" % i)
        out.mkdir()
        disk = build.make_disk(PROFILE, root, out)
        shas.append(build.sha256(disk))
        (out / "tiny.json").write_text('{"sha256": "%s", "image": "tiny.img"}' % shas[-1])
        assert verify_image(disk) == []
    assert shas[0] == shas[1]


def test_verify_names_what_is_wrong(tmp_path):
    root = tmp_path / "rootfs"
    tree(root)
    out = tmp_path / "out"
    out.mkdir()
    disk = build.make_disk(PROFILE, root, out)
    (out / "tiny.json").write_text('{"sha256": "%s", "image": "tiny.img"}' % ("0" * 64))
    with open(disk, "r+b") as fh:          # break the ext4 magic of partition 2
        fh.seek(build.ROOT_START * build.SECTOR + 1024 + 0x38)
        fh.write(b"\0\0")
    problems = verify_image(disk)
    assert any("holds no ext4 file system" in p for p in problems)
    assert any("the build recorded 000" in p for p in problems)


def test_volatile_image_is_the_whole_root_with_init_and_reproducible(tmp_path):
    digests = []
    for run in ("a", "b"):
        root = tmp_path / run / "rootfs"
        tree(root)
        (root / "sbin").mkdir()
        (root / "sbin/init").write_text("#!/bin/sh\n")
        build.clamp_mtimes(root, PROFILE["image"]["source_date_epoch"])
        time.sleep(1.1)            # a second build a second later: no time may leak in
        path = build.make_volatile(PROFILE, root, tmp_path / run)
        digests.append(build.sha256(path))
    assert digests[0] == digests[1]
    listing = subprocess.run(f"gzip -dc {path} | cpio -t --quiet", shell=True, capture_output=True,
                             text=True, check=True).stdout.split()
    assert {"init", "etc/hostname", "usr/local/sbin/tool", "etc/tool", "sbin/init"} <= set(listing)
    verbose = subprocess.run(f"gzip -dc {path} | cpio -tv --quiet", shell=True, capture_output=True, text=True,
                             check=True).stdout
    assert "init -> sbin/init" in verbose

