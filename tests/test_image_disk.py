"""The disk assembly on a small tree: GPT with an EFI system partition (GRUB, grub.cfg) on
partition 1 and ext4 on partition 2, bit-identical twice, verify."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from vca_image import build
from vca_image.cli import verify_image
from vca_image.profile import ProfileError, load

PROFILE = {"name": "tiny", "image": {"size_mib": 64, "fs_uuid": "2d1bd8b4-7c1e-4f5a-9a63-0c5f0e0a2b01",
                                     "hash_seed": "6a1f3c52-9b0e-4d27-8e44-3f1d2c7b9a10",
                                     "source_date_epoch": 1767225600}}
MTOOLS = dict(os.environ, MTOOLS_SKIP_CHECK="1", MTOOLSRC=os.devnull)


def tree(root, kernel="6.1.0-41-amd64"):
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("vca-node\n")
    (root / "usr/local/sbin").mkdir(parents=True)
    (root / "usr/local/sbin/tool").write_text("#!/bin/sh\n")
    os.symlink("../usr/local/sbin/tool", root / "etc/tool")
    if kernel:
        (root / "boot").mkdir()
        (root / ("boot/vmlinuz-%s" % kernel)).write_text("kernel %s\n" % kernel)
        (root / ("boot/initrd.img-%s" % kernel)).write_text("initrd %s\n" % kernel)
        os.symlink("boot/vmlinuz-%s" % kernel, root / "vmlinuz")      # linux-base's links, in / (minbase)
        build.boot_links(root)
    build.clamp_mtimes(root, PROFILE["image"]["source_date_epoch"])


def partitions(disk):
    return json.loads(subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True,
                                     text=True).stdout)["partitiontable"]["partitions"]


def esp(disk):
    return "%s@@%d" % (disk, partitions(disk)[0]["start"] * build.SECTOR)


def mtype(disk, name):
    return subprocess.run(["mtype", "-i", esp(disk), "::/" + name], capture_output=True, text=True, env=MTOOLS,
                          check=True).stdout


def debugfs(disk, request):
    target = "%s?offset=%d" % (disk, partitions(disk)[1]["start"] * build.SECTOR)
    return subprocess.run(["debugfs", "-R", request, target], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("disk")
    tree(tmp / "rootfs")
    return build.make_disk(PROFILE, tmp / "rootfs", tmp)


def test_two_assemblies_of_one_tree_are_bit_identical_and_verify(tmp_path, monkeypatch):
    shas = []
    for i, zone in ((1, "UTC0"), (2, "JST-9")):
        monkeypatch.setenv("TZ", zone)      # FAT keeps local times: the build host's zone must not show
        root = tmp_path / ("rootfs%d" % i)
        tree(root)
        time.sleep(2.1)     # ctimes and the clock differ between the two (FAT keeps 2 s): none may show
        out = tmp_path / ("out%d" % i)
        out.mkdir()
        disk = build.make_disk(PROFILE, root, out)
        shas.append(build.sha256(disk))
        (out / "tiny.json").write_text('{"sha256": "%s", "image": "tiny.img"}' % shas[-1])
        assert verify_image(disk) == []
        assert sorted(p.name for p in out.iterdir()) == ["tiny.img", "tiny.json"], "scratch files left behind"
    assert shas[0] == shas[1]


def test_partition_1_is_the_efi_system_partition_and_2_the_root(disk):
    esp_part, root = partitions(disk)
    assert esp_part["type"] == build.ESP_TYPE and esp_part["start"] == build.ESP_START
    assert esp_part["size"] * build.SECTOR == 64 * 2**20
    assert root["type"] == build.LINUX_FS and root["start"] == build.ROOT_START
    assert root["uuid"] == build.guid(PROFILE, "root")
    with open(disk, "rb") as fh:
        fh.seek(esp_part["start"] * build.SECTOR)
        boot = fh.read(512)
    assert boot[82:90] == b"FAT32   " and boot[71:82] == b"VCA-ESP    "
    assert boot[67:71] == bytes.fromhex(build.guid(PROFILE, "esp")[:8])[::-1], "the volume id is the fixed one"


def test_the_esp_holds_grub_at_the_removable_media_path_and_its_menu(disk):
    listing = subprocess.run(["mdir", "-b", "-/", "-i", esp(disk), "::/"], capture_output=True, text=True,
                             env=MTOOLS, check=True).stdout.split()
    assert "::/EFI/BOOT/BOOTX64.EFI" in listing and "::/EFI/BOOT/grub.cfg" in listing
    assert "::/EFI/BOOT/vca-cmdline.env" not in listing, "the built disk carries no boot-test arguments"
    efi = subprocess.run(["mtype", "-i", esp(disk), "::/" + build.GRUB_EFI], capture_output=True, env=MTOOLS,
                         check=True).stdout
    assert efi[:2] == b"MZ" and b"PE\0\0\x64\x86" in efi[:512], "an x86-64 PE image"
    assert b"configfile ${prefix}/grub.cfg" in efi, "the embedded config reads grub.cfg beside it"


def test_grub_cfg_boots_the_root_partition_with_the_profiles_cmdline(disk):
    cfg = mtype(disk, build.GRUB_CFG)
    partuuid = partitions(disk)[1]["uuid"].lower()
    line = "linux /boot/vmlinuz root=PARTUUID=%s rw console=ttyS0 net.ifnames=0 ${vca_cmdline_extra}" % partuuid
    assert line in cfg.splitlines()[-3].strip() and "initrd /boot/initrd.img" in cfg
    assert "search --no-floppy --fs-uuid --set=root %s" % PROFILE["image"]["fs_uuid"] in cfg
    assert "load_env --file ${prefix}/vca-cmdline.env vca_cmdline_extra" in cfg


def test_root_is_readable_with_debugfs_and_has_the_names_grub_loads(disk):
    assert debugfs(disk, "cat /etc/hostname") == "vca-node\n"
    for kind, text in (("vmlinuz", "kernel"), ("initrd.img", "initrd")):   # debugfs follows no link: GRUB does
        assert 'Fast link dest: "%s-6.1.0-41-amd64"' % kind in debugfs(disk, "stat /boot/%s" % kind)
        assert debugfs(disk, "cat /boot/%s-6.1.0-41-amd64" % kind) == "%s 6.1.0-41-amd64\n" % text


def test_boot_links_take_the_newest_kernel_and_replace_what_stands_there(tmp_path):
    boot = tmp_path / "boot"
    boot.mkdir()
    for version in ("6.1.0-40-amd64", "6.1.0-41-amd64"):
        (boot / ("vmlinuz-" + version)).write_text(version)
        (boot / ("initrd.img-" + version)).write_text(version)
    (boot / "vmlinuz").symlink_to("vmlinuz-6.1.0-40-amd64")
    (boot / "initrd.img").write_text("stale")
    assert build.boot_links(tmp_path) == "6.1.0-41-amd64"
    assert os.readlink(boot / "vmlinuz") == "vmlinuz-6.1.0-41-amd64"
    assert os.readlink(boot / "initrd.img") == "initrd.img-6.1.0-41-amd64"
    assert build.boot_links(tmp_path / "nokernel") is None
    (boot / "initrd.img-6.1.0-41-amd64").unlink()
    with pytest.raises(SystemExit, match=r"initrd\.img-6\.1\.0-41-amd64 is missing"):
        build.boot_links(tmp_path)


def test_a_tree_without_a_kernel_still_makes_a_disk(tmp_path):
    tree(tmp_path / "rootfs", kernel=None)
    disk = build.make_disk(PROFILE, tmp_path / "rootfs", tmp_path)
    assert "linux /boot/vmlinuz" in mtype(disk, build.GRUB_CFG)


def test_the_profiles_boot_cmdline_fills_its_placeholders(tmp_path):
    profile = dict(PROFILE, boot={"cmdline": "root=UUID={fs_uuid} ro console=ttyS0,115200n8 quiet"})
    assert build.kernel_cmdline(profile) == "root=UUID=%s ro console=ttyS0,115200n8 quiet" % PROFILE["image"]["fs_uuid"]
    assert build.kernel_cmdline(PROFILE) == ("root=PARTUUID=%s rw console=ttyS0 net.ifnames=0"
                                             % build.guid(PROFILE, "root").lower())


@pytest.mark.parametrize("cmdline", ["root=/dev/vda2; reboot", "root=$evil", "a  b", "root={nosuch}", "x\ny",
                                     'quiet "x"', ""])
def test_a_boot_cmdline_grub_would_read_as_more_is_refused(tmp_path, cmdline):
    (tmp_path / "mine.yml").write_text("extends: debian-12\nboot: {cmdline: %s}\n" % json.dumps(cmdline))
    with pytest.raises(ProfileError, match=r"mine.yml: boot.cmdline: .* is not a kernel command line"):
        load(str(tmp_path / "mine.yml"), check_paths=False)


def test_the_esp_and_its_grub_image_are_reproducible(tmp_path):
    images, grubs = [], []
    for run in ("a", "b"):
        out = tmp_path / run
        out.mkdir()
        esp_file = build.make_esp(PROFILE, out)
        images.append(esp_file.read_bytes())
        grubs.append(subprocess.run(["mtype", "-i", str(esp_file), "::/" + build.GRUB_EFI], capture_output=True,
                                    env=MTOOLS, check=True).stdout)
        time.sleep(2.1)             # FAT's times step by 2 s
    assert grubs[0] == grubs[1], "grub-mkimage made two different BOOTX64.EFI"
    assert images[0] == images[1]


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
    subprocess.run(["mdel", "-i", esp(disk), "::/" + build.GRUB_CFG], env=MTOOLS, check=True)
    problems = verify_image(disk)
    assert any("holds no ext4 file system" in p for p in problems)
    assert any("the build recorded 000" in p for p in problems)
    assert any("has no /EFI/BOOT/grub.cfg" in p for p in problems)
    with open(disk, "r+b") as fh:          # and the FAT's signature of partition 1
        fh.seek(build.ESP_START * build.SECTOR + 510)
        fh.write(b"\0\0")
    assert any("partition 1 holds no FAT32 file system" in p for p in verify_image(disk))
