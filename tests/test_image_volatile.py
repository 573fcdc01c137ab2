"""The volatile image in the form `vcactl boot <card> <cpu> <file>` loads (a bare FAT32 volume: GRUB,
its grub.cfg, startup.nsh, the kernel, the whole root as an initramfs), the one FAT builder behind it
and the ESP, verify, and the per-node overlay as a newc cpio (the writer, its spec, its CLI)."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import subprocess
import time

import pytest
from ansible.module_utils.vca_node_image import NodeImageError, overlay_entries

from conftest import ROOT
from vca_image import boottest, build, cli, newc
from vca_image.cli import verify_image
from vca_image.profile import load

PROFILE = {"name": "tiny", "image": {"size_mib": 64, "fs_uuid": "2d1bd8b4-7c1e-4f5a-9a63-0c5f0e0a2b01",
                                     "hash_seed": "6a1f3c52-9b0e-4d27-8e44-3f1d2c7b9a10",
                                     "source_date_epoch": 1767225600},
           "boot": {"cmdline": "root=PARTUUID={root_partuuid} rw console=ttyS0 net.ifnames=0 rootwait"}}
MTOOLS = dict(os.environ, MTOOLS_SKIP_CHECK="1", MTOOLSRC=os.devnull)
KERNEL = "6.1.0-41-amd64"


def tree(root):
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text("vca-node\n")
    (root / "sbin").mkdir()
    (root / "sbin/init").write_text("#!/bin/sh\n")
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/tool").write_bytes(random.Random(1).randbytes(3 * 2**20))      # incompressible, the same twice
    os.link(root / "usr/bin/tool", root / "usr/bin/tool-again")
    (root / "boot").mkdir()
    (root / ("boot/vmlinuz-%s" % KERNEL)).write_text("kernel %s\n" % KERNEL)
    (root / ("boot/initrd.img-%s" % KERNEL)).write_text("initrd %s\n" % KERNEL)
    build.boot_links(root)
    build.clamp_mtimes(root, PROFILE["image"]["source_date_epoch"])
    return root


def mtype(image, name):
    return subprocess.run(["mtype", "-i", str(image), "::/" + name], capture_output=True, env=MTOOLS,
                          check=True).stdout


def listing(image):
    return subprocess.run(["mdir", "-b", "-/", "-i", str(image), "::/"], capture_output=True, text=True,
                          env=MTOOLS, check=True).stdout.split()


@pytest.fixture(scope="module")
def volatile(tmp_path_factory):
    out = tmp_path_factory.mktemp("volatile")
    image, root_bytes, _ = build.make_volatile(PROFILE, tree(out / "rootfs"), out)
    return image, root_bytes


def test_the_volatile_image_is_a_bare_fat32_volume_with_its_boot_sector_at_byte_0(volatile):
    image, _ = volatile
    with open(image, "rb") as fh:
        head = fh.read(1024)
    assert head[510:512] == b"\x55\xaa" and head[82:90] == b"FAT32   " and head[:1] in (b"\xeb", b"\xe9")
    assert head[71:82] == b"VCA-RAMDISK"
    assert head[67:71] == bytes.fromhex(build.guid(PROFILE, "volatile")[:8])[::-1], "its own fixed volume id"
    assert build.guid(PROFILE, "volatile") != build.guid(PROFILE, "esp")
    assert head[512:520] != b"EFI PART", "no GPT header at LBA 1"
    assert build.fat32_clusters(head[:512]) >= build.FAT32_MIN_CLUSTERS
    assert boottest.esp_offset(image) == 0, "a superfloppy: GRUB's FAT starts at byte 0"
    assert image.name == "tiny.volatile.img" and not list(image.parent.glob("*.cpio.gz"))
    assert sorted(p.name for p in image.parent.iterdir()) == ["rootfs", "tiny.volatile.img"], "scratch left"


def test_it_holds_grub_its_menu_startup_nsh_the_kernel_and_the_whole_root(volatile, tmp_path):
    image, _ = volatile
    assert {"::/EFI/BOOT/BOOTX64.EFI", "::/EFI/BOOT/grub.cfg", "::/startup.nsh", "::/vmlinuz",
            "::/initrd.img"} <= set(listing(image))
    assert "::/vca-overlay.cpio" not in listing(image) and "::/EFI/BOOT/vca-cmdline.env" not in listing(image)
    assert mtype(image, "startup.nsh") == b"fs0:\\EFI\\BOOT\\BOOTX64.EFI\n"
    assert mtype(image, "vmlinuz") == b"kernel %s\n" % KERNEL.encode()
    # the same GRUB as the ESP's: grub-mkimage's output depends on nothing but its arguments
    esp = build.make_esp(PROFILE, tmp_path)
    assert mtype(image, build.GRUB_EFI) == mtype(esp, build.GRUB_EFI)
    archive = gzip.decompress(mtype(image, "initrd.img"))
    names = subprocess.run(["cpio", "-tv", "--quiet"], input=archive, capture_output=True, check=True).stdout.decode()
    assert "init -> sbin/init" in names and " etc/hostname\n" in names and " usr/bin/tool\n" in names


def test_its_menu_boots_the_kernel_without_a_root_device_and_the_overlay_after_the_root(volatile):
    cfg = mtype(volatile[0], build.GRUB_CFG).decode()
    assert "    linux /vmlinuz console=ttyS0 net.ifnames=0 ${vca_cmdline_extra}\n" in cfg
    assert "    initrd /initrd.img ${vca_overlay}\n" in cfg
    assert "if [ -f /vca-overlay.cpio ]; then\n    set vca_overlay=/vca-overlay.cpio\nfi\n" in cfg
    assert "load_env --file ${prefix}/vca-cmdline.env vca_cmdline_extra" in cfg
    assert "search" not in cfg.replace("# ", ""), "GRUB's root is the volume it was loaded from"


@pytest.mark.parametrize("cmdline, volatile", [
    ("root=PARTUUID={root_partuuid} rw console=ttyS0 net.ifnames=0", "console=ttyS0 net.ifnames=0"),
    ("root=/dev/vcablk0p2 ro rootfstype=ext4 rootflags=noatime rootwait quiet", "quiet"),
    ("console=ttyS0,115200n8 rw.x=1 rootdelay=5 root", "console=ttyS0,115200n8 rw.x=1 rootdelay=5 root"),
])
def test_the_volatile_command_line_drops_what_names_or_mounts_a_root_device(cmdline, volatile):
    assert build.volatile_cmdline(dict(PROFILE, boot={"cmdline": cmdline})) == volatile


@pytest.mark.parametrize("release, config, args", [
    ("6.1.0-41-amd64", "CONFIG_DEFERRED_STRUCT_PAGE_INIT=y\nCONFIG_PAGE_EXTENSION=y\n", ["early_page_ext"]),
    ("6.1.0-41-amd64", "CONFIG_PAGE_EXTENSION=y\n# CONFIG_DEFERRED_STRUCT_PAGE_INIT is not set\n", []),
    ("6.1.0-41-amd64", "CONFIG_DEFERRED_STRUCT_PAGE_INIT=y\n", []),
    ("5.10.0-30-amd64", "CONFIG_DEFERRED_STRUCT_PAGE_INIT=y\nCONFIG_PAGE_EXTENSION=y\n", []),
    ("4.14.20-1.2.3.26.vca", None, []),
], ids=["deferred-6.1", "not-deferred", "no-page-ext", "before-6.1", "no-config"])
def test_a_kernel_that_defers_its_memory_setup_gets_early_page_ext(tmp_path, release, config, args):
    # else its rootfs tmpfs is sized from the little memory set up when it is mounted (QEMU q35, 4 GiB,
    # Debian's 6.1: 840 MiB, and "Initramfs unpacking failed: write error" for a 1.3 GiB root)
    (tmp_path / "boot").mkdir()
    if config is not None:
        (tmp_path / "boot" / ("config-%s" % release)).write_text(config)
    assert build.volatile_kernel_args(tmp_path, release) == args
    assert build.volatile_cmdline(PROFILE, args) == " ".join(["console=ttyS0", "net.ifnames=0", *args])


def test_the_volatile_menu_has_the_kernels_argument_and_the_record_says_so(tmp_path):
    root = tree(tmp_path / "rootfs")
    (root / ("boot/config-%s" % KERNEL)).write_text("CONFIG_DEFERRED_STRUCT_PAGE_INIT=y\nCONFIG_PAGE_EXTENSION=y\n")
    image, _, cmdline = build.make_volatile(PROFILE, root, tmp_path)
    assert cmdline == "console=ttyS0 net.ifnames=0 early_page_ext"
    assert "    linux /vmlinuz %s ${vca_cmdline_extra}\n" % cmdline in mtype(image, build.GRUB_CFG).decode()


def test_two_builds_of_one_tree_are_bit_identical(tmp_path, monkeypatch):
    digests = []
    for run, zone in (("a", "UTC0"), ("b", "JST-9")):
        monkeypatch.setenv("TZ", zone)          # FAT keeps local times: the build host's zone must not show
        root = tree(tmp_path / run / "rootfs")
        time.sleep(2.1)                          # FAT's times step by 2 s: the clock must not show either
        image, _, _ = build.make_volatile(PROFILE, root, tmp_path / run)
        digests.append(build.sha256(image))
    assert digests[0] == digests[1]


def test_the_fat_builder_names_every_file_in_order_and_never_walks_a_directory_itself(tmp_path, monkeypatch):
    # mcopy -s would copy in the build host's readdir order, which differs between file systems
    calls = []
    real = build.run
    monkeypatch.setattr(build, "run", lambda cmd, **kw: (calls.append([str(c) for c in cmd]), real(cmd, **kw))[1])
    src = tmp_path / "tree"
    for name in ("b/z", "b/a", "a", "c", "b/y/x"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text(name)
    build.make_fat(PROFILE, "test", src, tmp_path / "fat.img", label="TEST", size_mib=build.FAT32_MIN_MIB)
    mtools = [c for c in calls if c[0] in ("mmd", "mcopy")]
    assert not [c for c in mtools if "-s" in c]
    assert [(c[0], [os.path.relpath(a, src) for a in c[5:-1]] if c[0] == "mcopy" else c[-1]) for c in mtools] == [
        ("mcopy", ["a", "c"]), ("mmd", "::/b"), ("mcopy", ["b/a", "b/z"]), ("mmd", "::/b/y"), ("mcopy", ["b/y/x"])]
    assert [c[-1] for c in mtools if c[0] == "mcopy"] == ["::/", "::/b/", "::/b/y/"]
    assert mtype(tmp_path / "fat.img", "b/y/x") == b"b/y/x"


def free_bytes(image):
    listed = subprocess.run(["mdir", "-i", str(image), "::/"], capture_output=True, text=True, env=MTOOLS,
                            check=True).stdout
    return int(re.search(r"([\d ]+) bytes free", listed).group(1).replace(" ", ""))


def test_the_volume_is_sized_from_its_contents_with_room_and_never_below_fat32s_minimum(volatile, tmp_path):
    image, root_bytes = volatile
    assert image.stat().st_size == build.FAT32_MIN_MIB * 2**20, "a small tree: FAT32's smallest volume"
    assert free_bytes(image) >= build.VOLATILE_SLACK_MIB * 2**20
    assert root_bytes == 3 * 2**20 + 4 * 4096, "regular files in 4 KiB pages, the hard link once"
    big = tmp_path / "big"
    big.mkdir()
    (big / "initrd.img").write_bytes(b"\1" * 300 * 2**20)
    size = build.fat_size_mib(big, build.VOLATILE_SLACK_MIB)
    assert 300 + 16 < size <= 300 + 16 + 8
    fat = build.make_fat(PROFILE, "test", big, tmp_path / "big.img", label="T", size_mib=size)
    assert fat.stat().st_size == size * 2**20
    assert build.VOLATILE_SLACK_MIB * 2**20 <= free_bytes(fat) < (build.VOLATILE_SLACK_MIB + 8) * 2**20
    with pytest.raises(SystemExit, match=r"mkfs\.fat made no FAT32"):
        build.make_fat(PROFILE, "test", big, tmp_path / "fat.img", label="T", size_mib=32, cluster_sectors=1)


def test_a_tree_without_a_kernel_makes_no_volatile_image(tmp_path):
    (tmp_path / "rootfs/etc").mkdir(parents=True)
    with pytest.raises(SystemExit, match="no /boot/vmlinuz-"):
        build.make_volatile(PROFILE, tmp_path / "rootfs", tmp_path)


def test_fat32_boot_sectors_are_told_from_partition_tables_and_other_fats(volatile, tmp_path):
    disk = tmp_path / "disk.img"
    with open(disk, "wb") as fh:
        fh.truncate(8 * 2**20)
    subprocess.run(["sfdisk", "--quiet", str(disk)], input=b"label: gpt\nstart=2048, size=4096, type=L\n", check=True)
    assert build.fat32_clusters(disk.read_bytes()[:512]) is None, "a protective MBR is no FAT boot sector"
    fat12 = tmp_path / "fat12.img"
    subprocess.run(["mkfs.fat", "-C", str(fat12), "1024"], check=True, capture_output=True)
    assert build.fat32_clusters(fat12.read_bytes()[:512]) is None
    with open(volatile[0], "rb") as fh:
        sector = bytearray(fh.read(512))
    sector[510] = 0
    assert build.fat32_clusters(bytes(sector)) is None


def built_pair(tmp_path, monkeypatch):
    """A build directory as build() leaves it, from a stand-in bootstrap: the disk and the volatile image."""
    profile = load("debian-12", ROOT / "image_builder" / "profiles")
    profile["image"] = dict(profile["image"], size_mib=64)
    monkeypatch.setattr(build, "bootstrap", lambda p, rootfs, cache: tree(rootfs))
    monkeypatch.setattr(build, "manifest", lambda rootfs: ["base-files=12.4"])
    return profile, build.build(profile, tmp_path / "out", cache=tmp_path / "cache")


def test_a_build_records_the_volatile_image_and_verify_checks_it(tmp_path, monkeypatch, capsys):
    profile, record = built_pair(tmp_path, monkeypatch)
    out = tmp_path / "out"
    assert "volatile" in profile["formats"], "CI builds and boots it"
    assert record["volatile"] == "debian-12.volatile.img"
    assert record["volatile_sha256"] == build.sha256(out / "debian-12.volatile.img")
    assert record["volatile_root_mib"] >= 3
    assert record["boot"]["volatile_cmdline"] == "console=ttyS0 net.ifnames=0"
    assert not list(out.glob("*.cpio.gz")) and not (out / "volatile.d").exists() and not (out / "rootfs").exists()
    assert "sha256 %s  debian-12.volatile.img" % record["volatile_sha256"] in (out / "debian-12.manifest").read_text()
    assert json.loads((out / "debian-12.json").read_text())["volatile"] == record["volatile"]
    assert verify_image(out / "debian-12.img") == []
    assert verify_image(out / "debian-12.volatile.img") == []
    assert cli.main(["verify", str(out / "debian-12.img")]) == 0
    # broken: a file gone (and so its sha256), then the boot sector, then the image itself
    volatile = out / "debian-12.volatile.img"
    subprocess.run(["mdel", "-i", str(volatile), "::/startup.nsh"], env=MTOOLS, check=True)
    problems = verify_image(out / "debian-12.img")
    assert "%s: the volatile volume has no /startup.nsh" % volatile in problems
    assert any(p.startswith("%s: sha256 " % volatile) for p in problems)
    with open(volatile, "r+b") as fh:
        fh.seek(510)
        fh.write(b"\0\0")
    assert verify_image(out / "debian-12.img")[-1] == (
        "%s: no FAT32 boot sector at byte 0 (55AA, FAT32): not the bare FAT volume vcactl boot loads" % volatile)
    volatile.unlink()
    assert verify_image(out / "debian-12.img") == [
        "%s: the build made a volatile image, %s, and it is not there" % (out / "debian-12.img", volatile)]


# The per-node overlay as a newc cpio.
UID = 1234


def spec(tmp_path):
    key = tmp_path / "fleet.pub"
    key.write_text("ssh-ed25519 AAAA fleet\n")
    return {"/etc/vca-node.local.conf": "FLEET_USERS=root\n",
            "/root/.ssh/authorized_keys": {"src": str(key), "mode": "0600"},
            "/root/.ssh": {"state": "directory", "mode": "0700"},
            "/etc/ssh/ssh_host_ed25519_key": {"content": "PRIVATE\n", "mode": "0600"},
            "/home/vcaadmin/.ssh": {"state": "directory", "mode": "0700", "owner": UID, "group": str(UID)},
            "/home/vcaadmin/.ssh/authorized_keys": {"content": "k\n", "mode": "0600", "owner": "1234",
                                                    "group": 1234}}


def members(data):
    """(offset, name, mode, uid, gid, nlink, mtime, data) of each newc member, read as the kernel does."""
    out, at = [], 0
    while True:
        assert at % 4 == 0 and data[at:at + 6] == newc.MAGIC, at
        fields = [int(data[at + 6 + 8 * i:at + 14 + 8 * i], 16) for i in range(13)]
        namesize, filesize = fields[11], fields[6]
        name = data[at + 110:at + 110 + namesize - 1].decode()
        assert data[at + 110 + namesize - 1] == 0
        body = at + 110 + namesize + (-(110 + namesize) % 4)
        out.append((at, name, fields[1], fields[2], fields[3], fields[4], fields[5], data[body:body + filesize]))
        at = body + filesize + (-filesize % 4)
        if name == newc.TRAILER:
            assert at == len(data)
            return out


def test_the_overlay_archive_is_newc_with_only_the_named_entries_directories_first(tmp_path):
    data = newc.archive(spec(tmp_path), mtime=1767225600)
    found = members(data)
    assert [m[1] for m in found] == ["etc/ssh/ssh_host_ed25519_key", "etc/vca-node.local.conf",
                                     "home/vcaadmin/.ssh", "home/vcaadmin/.ssh/authorized_keys",
                                     "root/.ssh", "root/.ssh/authorized_keys", "TRAILER!!!"]
    by_name = {m[1]: m for m in found}
    assert by_name["root/.ssh"][2:6] == (0o040700, 0, 0, 2)
    assert by_name["root/.ssh/authorized_keys"][2:6] == (0o100600, 0, 0, 1)
    assert by_name["root/.ssh/authorized_keys"][7] == b"ssh-ed25519 AAAA fleet\n"
    assert by_name["home/vcaadmin/.ssh/authorized_keys"][2:5] == (0o100600, UID, UID)
    assert by_name["etc/vca-node.local.conf"][2] == 0o100644 and by_name["TRAILER!!!"][2:6] == (0, 0, 0, 1)
    assert {m[6] for m in found[:-1]} == {1767225600}
    assert newc.archive(spec(tmp_path), mtime=1767225600) == data, "the same spec, the same bytes"


def test_gnu_cpio_unpacks_it_with_each_entrys_mode_and_owner(tmp_path):
    unpacked = tmp_path / "root"
    unpacked.mkdir()
    subprocess.run(["cpio", "-idm", "--quiet", "--no-absolute-filenames"], cwd=unpacked,
                   input=newc.archive(spec(tmp_path)), check=True)
    def owner_mode(rel):
        st = (unpacked / rel).lstat()
        return st.st_uid, st.st_gid, "%04o" % (st.st_mode & 0o7777)
    assert owner_mode("root/.ssh") == (0, 0, "0700")
    assert owner_mode("root/.ssh/authorized_keys") == (0, 0, "0600")
    assert owner_mode("home/vcaadmin/.ssh/authorized_keys") == (UID, UID, "0600")
    assert (unpacked / "etc/vca-node.local.conf").read_text() == "FLEET_USERS=root\n"


def test_the_spec_is_read_as_the_disk_writer_reads_it(tmp_path):
    # module_utils/vca_node_image.py's overlay_entries is the format's other reader: numeric owners
    # give the same entries, and what it refuses this refuses too
    given = spec(tmp_path)
    theirs = [(p, e["state"], e["mode"], e["owner"], e["group"], e["content"], e["src"])
              for p, e in overlay_entries(given)]
    ours = [(p, e["state"], e["mode"], e["uid"], e["gid"], e["content"], e["src"]) for p, e in newc.entries(given)]
    assert ours == theirs
    for bad in ({"etc/x": "relative"}, {"/etc/x y": "space"}, {"/etc/../x": "dots"}, {"/etc/x/": "slash"},
                {"/etc/x": 5}, {"/etc/x": {"content": "a", "src": "/b"}}, {"/etc/x": {}},
                {"/etc/x": {"state": "directory", "content": "a"}}, {"/etc/x": {"state": "link"}},
                {"/etc/x": {"content": "a", "mode": 600}}, {"/etc/x": {"content": "a", "mode": "rw"}},
                {"/etc/x": {"content": "a", "colour": "red"}}, {"/etc/x": {"src": "relative/path"}},
                {"/etc/x": {"content": "a", "owner": -1}}, {"/etc/x": {"content": "a", "owner": True}},
                ["/etc/x"]):
        with pytest.raises(NodeImageError):
            overlay_entries(bad)
        with pytest.raises(newc.OverlayError):
            newc.entries(bad)


def test_an_owner_by_name_is_refused_there_being_no_disk_to_look_it_up_in(tmp_path):
    with pytest.raises(newc.OverlayError, match=r"overlay /home/vcaadmin/.ssh: owner 'vcaadmin' is a name: a "
                                                r"volatile overlay takes numeric ids"):
        newc.archive({"/home/vcaadmin/.ssh": {"state": "directory", "owner": "vcaadmin"}})
    with pytest.raises(newc.OverlayError, match="group 'sudo' is a name"):
        newc.archive({"/etc/x": {"content": "a", "group": "sudo"}})
    with pytest.raises(newc.OverlayError, match="cannot read its src"):
        newc.archive({"/etc/x": {"src": str(tmp_path / "nosuch")}})


def test_the_overlay_cpio_command_writes_the_archive_and_refuses_a_bad_spec(tmp_path, monkeypatch, capsys):
    (tmp_path / "spec.json").write_text(json.dumps(spec(tmp_path)))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1767225600")
    assert cli.main(["overlay-cpio", str(tmp_path / "spec.json"), str(tmp_path / "o.cpio")]) == 0
    assert (tmp_path / "o.cpio").read_bytes() == newc.archive(spec(tmp_path), mtime=1767225600)
    assert (tmp_path / "o.cpio").stat().st_mode & 0o777 == 0o600       # it holds a private host key
    assert "(6 entries, newc)" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text(json.dumps({"/root/.ssh": {"state": "directory", "owner": "root"}}))
    assert cli.main(["overlay-cpio", str(tmp_path / "bad.json"), str(tmp_path / "bad.cpio")]) == 1
    assert "owner 'root' is a name" in capsys.readouterr().err and not (tmp_path / "bad.cpio").exists()
