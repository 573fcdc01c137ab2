"""Build a node image from a profile: mmdebstrap into a directory, then a GPT disk with
an EFI system partition (GRUB for x86_64-efi) on partition 1 and the root file system on
partition 2, made by sfdisk, mkfs.fat + mtools and `mke2fs -d` (no loop device, no
mount); and, where the profile asks, the volatile image: a bare FAT32 volume with the same
GRUB, the kernel and the whole root as one initramfs, the file `vcactl boot` loads.
Reproducible: SOURCE_DATE_EPOCH, every mtime clamped to it, a fixed file-system UUID, hash
seed, FAT volume ids and GPT GUIDs, a sorted package set, and the files a first boot makes
for itself (ssh host keys, machine-id, logs) left out.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import struct
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from . import vcasetup
from .profile import agent_units, kernel_debs

SECTOR = 512
ESP_START = 2048                                    # sectors: after 1 MiB for the GPT
ESP_SECTORS = 64 * 2**20 // SECTOR                  # 64 MiB, FAT32 (the UEFI spec's file system for an ESP)
ROOT_START = ESP_START + ESP_SECTORS                # sectors: 65 MiB; partition 2, the root file system
LINUX_FS = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
ESP_TYPE = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
ESP_LABEL = "VCA-ESP"
VOLATILE_LABEL = "VCA-RAMDISK"                      # the LBP protocol's word for the buffer vcactl boot fills
# The ESP's files: the firmware's removable-media path, and the menu beside it.
GRUB_EFI = "EFI/BOOT/BOOTX64.EFI"
GRUB_CFG = "EFI/BOOT/grub.cfg"
# The volatile volume's own files, beside GRUB and its grub.cfg (as Intel's create_image.sh lays
# out vca_baremetal_*.img): the UEFI shell's fallback, the kernel, the whole root as an initramfs.
STARTUP_NSH = "startup.nsh"
STARTUP_NSH_TEXT = "fs0:\\EFI\\BOOT\\BOOTX64.EFI\n"
VOLATILE_KERNEL = "vmlinuz"
VOLATILE_INITRD = "initrd.img"
VOLATILE_FILES = (GRUB_EFI, GRUB_CFG, STARTUP_NSH, VOLATILE_KERNEL, VOLATILE_INITRD)
# Optional, absent from a built volume: the per-node overlay, a newc cpio (newc.py) that grub.cfg
# hands the kernel after the initramfs, so its files replace the image's.
VOLATILE_OVERLAY = "vca-overlay.cpio"
# Free room on the volatile volume for what a node's copy gets (the overlay, CMDLINE_ENV).
VOLATILE_SLACK_MIB = 16
# FAT32 wants at least 65525 clusters; mkfs.fat's smallest clusters (512 B) need 33 MiB for that.
FAT32_MIN_CLUSTERS = 65525
FAT32_MIN_MIB = 33
# Optional, absent from a built disk: a GRUB environment block whose vca_cmdline_extra grub.cfg
# appends to the kernel command line (the boot test writes one into its copy of the disk).
CMDLINE_ENV = "EFI/BOOT/vca-cmdline.env"
# Built into BOOTX64.EFI (grub-mkimage): no module directory on the ESP, nothing loaded later.
GRUB_MODULES = sorted(["part_gpt", "fat", "ext2", "normal", "linux", "configfile", "search", "search_fs_uuid",
                       "loadenv", "test", "echo", "efi_gop"])
DEFAULT_CMDLINE = "root=PARTUUID={root_partuuid} rw console=ttyS0 net.ifnames=0"
# Left out: every node makes its own at first boot, and they differ between two builds.
VOLATILE = [
    "etc/ssh/ssh_host_*", "var/lib/dbus/machine-id", "var/lib/systemd/random-seed",
    "var/cache/ldconfig/aux-cache", "var/cache/apt/*.bin", "var/lib/apt/lists/*", "var/cache/debconf/*-old",
    "var/lib/dpkg/*-old", "var/log/*.log", "var/log/apt/*", "etc/.pwd.lock", "var/cache/apt/archives/*.deb",
]


def log(msg):
    print("vca-image: %s" % msg, file=sys.stderr, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(str(c) for c in cmd))
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def guid(profile, what):
    """A fixed GUID per profile and purpose: the same on every build."""
    return str(uuid.uuid5(uuid.UUID(profile["image"]["fs_uuid"]), what)).upper()


def packages(profile):
    names = set(profile["packages"])
    if profile["kernel"]["source"] == "distribution":
        names |= set(profile["kernel"]["packages"])
    return sorted(names)


def useradd_argv(user):
    """useradd's arguments for one profile user, as a list: no shell in between."""
    groups = user.get("groups", [])
    return ["useradd", "--create-home", "--shell", "/bin/bash",
            *(["--groups", ",".join(groups)] if groups else []), "--", user["name"]]


def user_hooks(profile):
    """The customize hooks that add the profile's users. mmdebstrap runs a hook with
    `sh -c HOOK exec ROOTFS`, so each is a shell command: every value in it is quoted
    (the profile schema admits only plain user and group names as well). root is in every tree
    already: a profile lists it only for its authorized_keys."""
    return ['chroot "$1" ' + " ".join(shlex.quote(arg) for arg in useradd_argv(user))
            for user in profile.get("users", []) if user["name"] != "root"]


# mmdebstrap's hook options in the order of the phases it runs them in.
HOOK_PHASES = ("--setup-hook", "--extract-hook", "--essential-hook", "--customize-hook")


def mmdebstrap_argv(profile, rootfs, cache):
    """mmdebstrap's command line: the sorted package set (and Intel's .debs for a debs_dir kernel),
    the download cache synced in and out, the users, and Intel's card-side setup (vcasetup.hooks())
    where the profile has kernel.vca_userspace. The hooks are listed phase by phase, as they run:
    the --essential-hook that writes /etc/vca_config before every --customize-hook."""
    include = packages(profile)
    if profile["kernel"]["source"] == "debs_dir":
        include += [str(p) for p in kernel_debs(profile)]
    cmd = ["mmdebstrap", "--variant=%s" % profile.get("variant", "minbase"),
           "--components=%s" % ",".join(profile.get("components", ["main"])),
           "--include=%s" % ",".join(include),
           "--aptopt=Acquire::Languages \"none\"",
           "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
           "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*"]
    hooks = [
        # the package cache: in before the download, out after it, so a rebuild downloads nothing
        ("--setup-hook", 'mkdir -p "$1"/var/cache/apt/archives/'),
        # mmdebstrap splits a special hook's arguments as a shell would: quoted
        ("--setup-hook", "sync-in %s /var/cache/apt/archives/" % shlex.quote(str(cache))),
        ("--customize-hook", "sync-out /var/cache/apt/archives %s" % shlex.quote(str(cache))),
        *(("--customize-hook", hook) for hook in user_hooks(profile)),
        *vcasetup.hooks(profile),
    ]
    hooks.sort(key=lambda hook: HOOK_PHASES.index(hook[0]))      # stable: in order within a phase
    return [*cmd, *("%s=%s" % hook for hook in hooks), profile["suite"], str(rootfs), profile["mirror"]]


def bootstrap(profile, rootfs, cache):
    """mmdebstrap the sorted package set into rootfs; downloads cached in cache/."""
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(profile["image"]["source_date_epoch"]))
    run(mmdebstrap_argv(profile, rootfs, cache), env=env)


def write(root, rel, text, mode=0o644):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def passwd(rootfs):
    """name -> (uid, gid, home) from the tree's own etc/passwd: the image's accounts, not the build host's."""
    accounts = {}
    path = rootfs / "etc/passwd"
    for line in (path.read_text().splitlines() if path.is_file() else []):
        fields = line.split(":")
        if len(fields) >= 6 and fields[2].isdigit() and fields[3].isdigit():
            accounts.setdefault(fields[0], (int(fields[2]), int(fields[3]), fields[5]))
    return accounts


def authorize(rootfs, accounts, name, keys):
    """The user's ~/.ssh (0700) and authorized_keys (0600), both owned by the user, as sshd's
    StrictModes wants them; home is the one the tree's etc/passwd names (root's: /root)."""
    if name not in accounts:
        raise SystemExit("vca-image: user %s has authorized_keys but is not in the image's /etc/passwd" % name)
    uid, gid, home = accounts[name]
    ssh = rootfs / home.lstrip("/") / ".ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    ssh.chmod(0o700)
    os.chown(ssh, uid, gid)
    write(ssh, "authorized_keys", "".join(k.strip() + "\n" for k in keys), 0o600)
    os.chown(ssh / "authorized_keys", uid, gid)


def recipe(profile):
    """What a build is made from: the merged profile, every overlay file and this builder's code.
    Two builds of one recipe differ only where the archive moved on; the role builds once per recipe."""
    h = hashlib.sha256()
    h.update(json.dumps({k: v for k, v in profile.items() if k != "_files"}, sort_keys=True).encode())
    base = Path(profile["_files"][0]).resolve().parent.parent
    trees = [base / o for o in profile.get("overlays", [])] + [Path(__file__).resolve().parent]
    for tree in trees:
        for path in sorted(p for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            h.update(b"\0%s\0%o\0" % (str(path.relative_to(tree)).encode(), path.lstat().st_mode))
            h.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
    return h.hexdigest()[:16]


# Bumped when make_disk, make_esp or make_volatile change how a tree is laid onto the disk or the
# volatile volume: the one part of this builder's code that reaches a node beyond what content_id reads.
LAYOUT = 1
RECORD = "etc/vca-image.json"


def _tree_digest(h, rootfs):
    """Every path under rootfs but the record, in sorted order: its name, mode, owner, and its bytes,
    link target or device number. Not mtimes: the build clamps them to the profile's epoch."""
    for dirpath, dirnames, filenames in os.walk(rootfs):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, rootfs)
            if rel == RECORD:
                continue
            st = os.lstat(path)
            h.update(b"\0%s\0%o\0%d\0%d\0" % (os.fsencode(rel), st.st_mode, st.st_uid, st.st_gid))
            if stat.S_ISLNK(st.st_mode):
                h.update(os.fsencode(os.readlink(path)))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        h.update(block)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                h.update(b"%d" % st.st_rdev)


def content_id(profile, rootfs, bootloader=None):
    """The build_id: a digest of what ends up on a node (the finished tree, the boot menus, the
    disk's fixed ids and sizes, the bootloader, LAYOUT), not of this builder's code or the profile's
    text. A change to either that leaves every one of them as it was names the same build, and the
    fleet is not reimaged for it (the store files the new recipe under the build it already has)."""
    h = hashlib.sha256()
    h.update(json.dumps({"layout": LAYOUT, "image": profile["image"], "formats": sorted(profile.get("formats", [])),
                         "grub": grub_cfg(profile),
                         "volatile_grub": volatile_grub_cfg(profile, volatile_cmdline(profile)),
                         "bootloader": bootloader}, sort_keys=True).encode())
    _tree_digest(h, rootfs)
    return h.hexdigest()[:16]


def configure(profile, rootfs, base, packages_installed, bootloader=None):
    """Overlays, network, fleet keys, the image record; then the per-build files out.
    bootloader (grub_version()) goes into the build_id: the ESP's GRUB comes from the build host.
    packages_installed is not read: the package versions are in the tree's dpkg database."""
    for overlay in profile.get("overlays", []):
        shutil.copytree(base / overlay, rootfs, symlinks=True, dirs_exist_ok=True)
    # git keeps a file 0644 or 0755 and copytree gives each directory its overlay's mode: sudo's
    # drop-ins are 0440 in a 0750 directory, as the sudo package makes them
    sudoers = rootfs / "etc/sudoers.d"
    if sudoers.is_dir():
        sudoers.chmod(0o750)
        for path in sudoers.iterdir():
            if path.is_file() and not path.is_symlink():
                path.chmod(0o440)
    net = profile["network"]
    # ifupdown's dhcp method has no mtu option: the link is set before the lease is asked for.
    write(rootfs, "etc/network/interfaces.d/%s" % net["interface"],
          "auto {0}\niface {0} inet {1}\n    pre-up /sbin/ip link set dev $IFACE mtu {2}\n".format(
              net["interface"], "dhcp" if net.get("dhcp", True) else "manual", net["mtu"]))
    write(rootfs, "etc/hostname", "vca-node\n")
    write(rootfs, "etc/hosts", "127.0.0.1\tlocalhost\n127.0.1.1\tvca-node\n")
    write(rootfs, "etc/vca-node.conf", "# per-node values come from the node_image role's overlay\n"
          "IFACE=%s\nMTU=%d\nMEM_FLOOR_MIB=%d\nVCA_AGENT_UNITS=%s\n"
          % (net["interface"], net["mtu"], profile.get("verify", {}).get("mem_floor_mib", 256),
             " ".join(agent_units(profile))))
    accounts = passwd(rootfs)
    for user in profile.get("users", []):
        if user.get("authorized_keys"):
            authorize(rootfs, accounts, user["name"], user["authorized_keys"])
    for pattern in VOLATILE:
        for path in rootfs.glob(pattern):
            if path.is_file() or path.is_symlink():
                path.unlink()
    write(rootfs, "etc/machine-id", "")                 # systemd fills it on first boot
    boot_links(rootfs)                               # /boot/vmlinuz, /boot/initrd.img: what grub.cfg loads
    kernels = sorted(p.name[len("vmlinuz-"):] for p in (rootfs / "boot").glob("vmlinuz-*"))
    # build_id names this image by what is on it (content_id, the tree now finished but for this
    # record): a booted node reports it from /etc/vca-image.json, and the host's store files the
    # image under it. The recipe (what the build was made from) only decides whether to build.
    build_id = content_id(profile, rootfs, bootloader)
    record = {"build_id": build_id, "recipe": recipe(profile), "profile": profile["name"], "suite": profile["suite"],
              "kernel_version": kernels[-1] if kernels else None,
              "users": [{"name": u["name"], "authorized_keys": bool(u.get("authorized_keys"))}
                        for u in profile.get("users", [])],
              "source_date_epoch": profile["image"]["source_date_epoch"]}
    write(rootfs, RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def clamp_mtimes(rootfs, epoch):
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in dirnames + filenames:
            os.utime(os.path.join(dirpath, name), (epoch, epoch), follow_symlinks=False)
    os.utime(rootfs, (epoch, epoch))


def clamp_ctimes(fs, rootfs, epoch):
    """mke2fs 1.47.0 copies each file's ctime and atime from the tree; a ctime cannot be set
    there, and reading the tree moves atimes. Set both on every inode of the new file
    system instead, with one debugfs run."""
    lines = ['set_inode_field / ctime @%d' % epoch, 'set_inode_field / atime @%d' % epoch]
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in dirnames + filenames:
            rel = "/" + os.path.relpath(os.path.join(dirpath, name), rootfs)
            if '"' in rel or "\n" in rel:
                raise SystemExit("vca-image: cannot clamp the ctime of %r (a quote or newline in its name)" % rel)
            lines.append('set_inode_field "%s" ctime @%d' % (rel, epoch))
            lines.append('set_inode_field "%s" atime @%d' % (rel, epoch))
    script = fs.with_suffix(".debugfs")
    script.write_text("\n".join(lines) + "\n")
    env = dict(os.environ, E2FSPROGS_FAKE_TIME=str(epoch))     # or debugfs stamps the superblock with now
    run(["debugfs", "-w", "-f", script, fs], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    script.unlink()


def manifest(rootfs):
    out = subprocess.run(["dpkg-query", "--admindir=%s/var/lib/dpkg" % rootfs, "-W", "-f", "${Package}=${Version}\n"],
                         check=True, capture_output=True, text=True).stdout
    return sorted(line for line in out.splitlines() if line)


def boot_links(rootfs):
    """/boot/vmlinuz and /boot/initrd.img, the names grub.cfg loads, as links to the newest
    vmlinuz-VERSION and initrd.img-VERSION under /boot. Whatever stands there is replaced: a minbase
    Debian has /vmlinuz and /initrd.img (linux-base's links, in /), and Intel's kernel package makes
    none. Returns the version, or None for a tree with no kernel."""
    boot = rootfs / "boot"
    kernels = sorted(p.name[len("vmlinuz-"):] for p in boot.glob("vmlinuz-*"))
    if not kernels:
        return None
    for kind in ("vmlinuz", "initrd.img"):
        target = "%s-%s" % (kind, kernels[-1])
        if not (boot / target).is_file():
            raise SystemExit("vca-image: /boot/%s is missing: GRUB would load a kernel without it" % target)
        link = boot / kind
        if link.is_symlink() or link.is_file():
            link.unlink()
        link.symlink_to(target)
    return kernels[-1]


def kernel_cmdline(profile):
    """The kernel command line grub.cfg boots with: the profile's boot.cmdline (DEFAULT_CMDLINE when
    it has none) with {root_partuuid} (partition 2's fixed GUID, lower case as udev and blkid name
    it) and {fs_uuid} filled in. The schema admits nothing GRUB's script would read as more."""
    template = profile.get("boot", {}).get("cmdline", DEFAULT_CMDLINE)
    return (template.replace("{root_partuuid}", guid(profile, "root").lower())
            .replace("{fs_uuid}", profile["image"]["fs_uuid"]))


# Both menus: boot the one entry at once, vca_cmdline_extra from CMDLINE_ENV beside grub.cfg where it is.
GRUB_PREAMBLE = ("set timeout=0\n"
                 "set default=0\n"
                 "set vca_cmdline_extra=\n"
                 "if [ -f ${prefix}/%(envname)s ]; then\n"
                 "    load_env --file ${prefix}/%(envname)s vca_cmdline_extra\n"
                 "fi\n" % {"envname": CMDLINE_ENV.rsplit("/", 1)[1]})


def grub_cfg(profile):
    """The ESP's menu: the root file system found by its fixed UUID, the kernel and initramfs
    loaded from it, and vca_cmdline_extra (from CMDLINE_ENV on the ESP, where one is) appended."""
    return (
        "# vca-image %(name)s: boot the root file system on partition 2 (ext4, UUID %(uuid)s).\n"
        "# The kernel command line is the profile's boot.cmdline; vca_cmdline_extra, from the\n"
        "# GRUB environment block %(env)s where there is one, is appended to it.\n"
        "%(preamble)s"
        "if ! search --no-floppy --fs-uuid --set=root %(uuid)s; then\n"
        "    echo \"vca-image: no file system with UUID %(uuid)s (the root, partition 2)\"\n"
        "fi\n"
        "menuentry \"%(name)s\" {\n"
        "    linux /boot/vmlinuz %(cmdline)s ${vca_cmdline_extra}\n"
        "    initrd /boot/initrd.img\n"
        "}\n" % {"name": profile["name"], "uuid": profile["image"]["fs_uuid"], "env": "/" + CMDLINE_ENV,
                  "preamble": GRUB_PREAMBLE, "cmdline": kernel_cmdline(profile)})


# The arguments that name or mount a root device: a volatile boot has none.
ROOT_DEVICE_ARGS = ("root=", "rootfstype=", "rootflags=", "rootwait", "rw", "ro")


def volatile_kernel_args(rootfs, release):
    """What the volatile boot must add for this kernel (release, its config in the tree's /boot).
    The kernel sizes the rootfs tmpfs at half the memory it has set up when it mounts it, early;
    with CONFIG_DEFERRED_STRUCT_PAGE_INIT that is all but one 128 MiB section of the highest zone
    (since 4.17; 4.14 sets up at least 2 GiB of it), so a root of more than a few hundred MiB does
    not fit ("Initramfs unpacking failed: write error") however much memory the node has.
    early_page_ext (6.1 and later, with CONFIG_PAGE_EXTENSION) sets all memory up first. Others
    get nothing, and a note in the build log where their root may not fit."""
    config = rootfs / "boot" / ("config-%s" % release)
    lines = set(config.read_text(errors="replace").splitlines()) if config.is_file() else set()
    if "CONFIG_DEFERRED_STRUCT_PAGE_INIT=y" not in lines:
        return []
    version = re.match(r"(\d+)\.(\d+)", release)
    if version and (int(version.group(1)), int(version.group(2))) >= (6, 1) and "CONFIG_PAGE_EXTENSION=y" in lines:
        return ["early_page_ext"]
    log("note: kernel %s defers setting up struct pages and has no early_page_ext: its rootfs tmpfs may be "
        "too small for the volatile root" % release)
    return []


def volatile_cmdline(profile, extra=()):
    """The volatile boot's kernel command line: kernel_cmdline() without ROOT_DEVICE_ARGS, and extra
    (volatile_kernel_args()). With no root= (and no rootfstype=) the kernel unpacks the initramfs
    into tmpfs, not ramfs, which has no size and so no free room to report (init/do_mounts.c,
    init_rootfs()), runs its /init and mounts nothing over it."""
    args = [arg for arg in kernel_cmdline(profile).split()
            if not any(arg == a or (a.endswith("=") and arg.startswith(a)) for a in ROOT_DEVICE_ARGS)]
    return " ".join(args + [a for a in extra if a not in args])


def volatile_grub_cfg(profile, cmdline):
    """The volatile volume's menu: the kernel and the whole-root initramfs from the volume GRUB was
    loaded from (its root; the volume is a superfloppy, so that is the whole device), then the
    node's overlay (VOLATILE_OVERLAY) where one is on the volume: GRUB's initrd joins the files and
    the kernel unpacks the second newc archive over the first. vca_cmdline_extra as on the ESP."""
    return (
        "# vca-image %(name)s, volatile: /%(initrd)s is the whole root file system, unpacked into tmpfs.\n"
        "# The kernel command line is the profile's boot.cmdline without root=, rw or ro (there is no\n"
        "# root device), with what this kernel needs for a large root in tmpfs; vca_cmdline_extra,\n"
        "# from the GRUB environment block %(env)s where there is one, is appended.\n"
        "# /%(overlay)s, where there is one, is the node's own files (a newc cpio): unpacked after\n"
        "# the root, over it.\n"
        "%(preamble)s"
        "set vca_overlay=\n"
        "if [ -f /%(overlay)s ]; then\n"
        "    set vca_overlay=/%(overlay)s\n"
        "fi\n"
        "menuentry \"%(name)s (volatile)\" {\n"
        "    linux /%(kernel)s %(cmdline)s ${vca_cmdline_extra}\n"
        "    initrd /%(initrd)s ${vca_overlay}\n"
        "}\n" % {"name": profile["name"], "env": "/" + CMDLINE_ENV, "preamble": GRUB_PREAMBLE,
                  "overlay": VOLATILE_OVERLAY, "kernel": VOLATILE_KERNEL, "initrd": VOLATILE_INITRD,
                  "cmdline": cmdline})


# The programs a build runs beyond mmdebstrap's and e2fsprogs', and the package of each.
HOST_TOOLS = {"mkfs.fat": "dosfstools", "mcopy": "mtools", "mmd": "mtools",
              "grub-mkimage": "grub-common (with grub-efi-amd64-bin)", "sfdisk": "fdisk", "cpio": "cpio"}


def check_host():
    """Before anything is downloaded: the ESP's tools and GRUB's x86_64-efi modules are here."""
    missing = ["%s (%s)" % (tool, package) for tool, package in HOST_TOOLS.items() if not shutil.which(tool)]
    if not Path("/usr/lib/grub/x86_64-efi/linux.mod").is_file():
        missing.append("/usr/lib/grub/x86_64-efi (grub-efi-amd64-bin)")
    if missing:
        raise SystemExit("vca-image: missing on this host: %s (scripts/host-packages.txt)" % ", ".join(missing))


def grub_version():
    """The build host's GRUB, as grub-mkimage names itself (it makes BOOTX64.EFI)."""
    return subprocess.run(["grub-mkimage", "--version"], check=True, capture_output=True,
                          text=True).stdout.strip()


def mtools_env(epoch=None):
    """mtools with no host settings (an empty MTOOLSRC), no geometry check, and UTC: FAT keeps
    local times, so the zone would show in every time stamp. With epoch, SOURCE_DATE_EPOCH too:
    the time mtools gives what it makes itself (mmd's directories)."""
    env = dict(os.environ, MTOOLSRC=os.devnull, MTOOLS_SKIP_CHECK="1", TZ="UTC0", LC_ALL="C")
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = str(epoch)
    return env


def fat32_clusters(sector):
    """The number of clusters of the FAT32 file system whose boot sector this is (a volume's first
    512 bytes), or None when it is no FAT32 boot sector (the 55AA signature, a jump, a sane BPB,
    no FAT16 table size, "FAT32" as its type). A partition table's MBR is none."""
    if len(sector) < 512 or sector[510:512] != b"\x55\xaa" or sector[0] not in (0xEB, 0xE9):
        return None
    per_sector, per_cluster, reserved, fats = struct.unpack_from("<HBHB", sector, 11)
    total16, fat16 = struct.unpack_from("<H", sector, 19)[0], struct.unpack_from("<H", sector, 22)[0]
    total32, fat32 = struct.unpack_from("<II", sector, 32)
    if per_sector not in (512, 1024, 2048, 4096) or per_cluster not in (1, 2, 4, 8, 16, 32, 64, 128) \
            or not fats or fat16 or not fat32 or sector[82:90] != b"FAT32   ":
        return None
    return ((total32 or total16) - reserved - fats * fat32) // per_cluster


def fat_size_mib(tree, slack_mib):
    """MiB for a FAT32 volume that holds tree with slack_mib to spare: each file and directory
    rounded up to 4 KiB (the largest cluster mkfs.fat picks below 8 GiB), both FATs as large as
    512-byte clusters make them, the reserved sectors; at least FAT32_MIN_MIB."""
    data = 0
    for dirpath, _, filenames in os.walk(tree):
        data += 4096 + sum(-(-os.path.getsize(os.path.join(dirpath, f)) // 4096) * 4096 for f in filenames)
    total = data + slack_mib * 2**20
    total += 2 * 4 * (total // SECTOR + 2) + 32 * SECTOR
    return max(FAT32_MIN_MIB, -(-total // 2**20))


def make_fat(profile, purpose, tree, path, *, label, size_mib, cluster_sectors=None):
    """A FAT32 file system in the file path holding tree, the one FAT builder: mkfs.fat --invariant
    with a volume id fixed per profile and purpose (guid()) and the label; then each directory (mmd)
    and its files (mcopy -m: the mtimes, clamped to SOURCE_DATE_EPOCH, kept) in name order, each
    directory before what is in it, so neither the host's readdir order nor its clock shows.
    cluster_sectors None: mkfs.fat's choice for the size (512 B clusters to 260 MiB, 4 KiB above).
    No loop device, no mount. SystemExit when the result is not FAT32 with enough clusters."""
    epoch = profile["image"]["source_date_epoch"]
    clamp_mtimes(tree, epoch)
    path.unlink(missing_ok=True)
    # --invariant first: it also fixes the volume id, and the -i after it wins
    run(["mkfs.fat", "--invariant", "-i", guid(profile, purpose)[:8], "-n", label, "-F", "32", "-S", str(SECTOR),
         *(["-s", str(cluster_sectors)] if cluster_sectors else []), "-C", path, str(size_mib * 1024)],
        stdout=subprocess.DEVNULL)
    with open(path, "rb") as fh:
        clusters = fat32_clusters(fh.read(512))
    if clusters is None or clusters < FAT32_MIN_CLUSTERS:
        raise SystemExit("vca-image: %s: mkfs.fat made no FAT32 (%s clusters, FAT32 wants %d): %d MiB is too small"
                         % (path, clusters, FAT32_MIN_CLUSTERS, size_mib))
    env = mtools_env(epoch)
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames.sort()
        rel = Path(dirpath).relative_to(tree).as_posix()
        if rel != ".":
            run(["mmd", "-i", path, "::/" + rel], env=env)
        if filenames:
            run(["mcopy", "-m", "-Q", "-i", path, *(Path(dirpath) / f for f in sorted(filenames)),
                 "::/" if rel == "." else "::/%s/" % rel], env=env)
    return path


def grub_image(work, target):
    """GRUB for x86_64-efi (grub-mkimage, GRUB_MODULES built in, nothing loaded later) with an
    embedded config that reads grub.cfg beside it. $prefix is (the device GRUB was loaded
    from)/EFI/BOOT: -p names the directory, the firmware the device, the ESP (partition 1) or,
    for the volatile superfloppy, the whole volume. grub-mkimage's output is reproducible."""
    embedded = work / "embedded.cfg"
    embedded.write_text("configfile ${prefix}/grub.cfg\n")
    target.parent.mkdir(parents=True, exist_ok=True)
    run(["grub-mkimage", "-O", "x86_64-efi", "-p", "/EFI/BOOT", "-c", embedded, "-o", target, *GRUB_MODULES])
    embedded.unlink()


def _workdir(path):
    if path.exists():
        shutil.rmtree(path)
    (path / "tree").mkdir(parents=True)
    return path / "tree"


def make_esp(profile, out):
    """The EFI system partition as a file (make_fat(): 64 MiB, 512-byte clusters, label VCA-ESP):
    GRUB's BOOTX64.EFI and grub.cfg at the removable-media path."""
    tree = _workdir(out / "esp.d")
    grub_image(tree.parent, tree / GRUB_EFI)
    (tree / GRUB_CFG).write_text(grub_cfg(profile))
    esp = make_fat(profile, "esp", tree, out / "esp.fat", label=ESP_LABEL, size_mib=ESP_SECTORS * SECTOR // 2**20,
                   cluster_sectors=1)
    shutil.rmtree(tree.parent)
    return esp


def write_sparse(src, dst, offset):
    """Copy the file src into dst at byte offset, writing only the blocks that hold data."""
    with open(src, "rb") as fin, open(dst, "r+b") as fout:
        for block in iter(lambda: fin.read(1 << 20), b""):
            if block.count(0) != len(block):
                fout.seek(offset)
                fout.write(block)
            offset += len(block)


def make_disk(profile, rootfs, out):
    """root.ext4 from the tree and the ESP, then the GPT disk around them: partition 1 the EFI
    system partition, partition 2 the root file system (as `vcactl blockio open ... vcablk0` and
    the node_image role read it). No loop device, no mount."""
    img = profile["image"]
    fs = out / "root.ext4"
    fs.unlink(missing_ok=True)
    env = dict(os.environ, E2FSPROGS_FAKE_TIME=str(img["source_date_epoch"]),
               SOURCE_DATE_EPOCH=str(img["source_date_epoch"]))
    size_mib = img["size_mib"]
    run(["mke2fs", "-q", "-F", "-t", "ext4", "-m", "1", "-L", "vcaroot", "-U", img["fs_uuid"],
         "-E", "hash_seed=%s,root_owner=0:0,lazy_itable_init=0" % img["hash_seed"],
         "-d", rootfs, fs, "%dM" % size_mib], env=env)
    clamp_ctimes(fs, rootfs, img["source_date_epoch"])
    esp = make_esp(profile, out)
    fs_sectors = size_mib * 2**20 // SECTOR
    disk = out / ("%s.img" % profile["name"])
    disk.unlink(missing_ok=True)
    total = ROOT_START + fs_sectors + 2048                 # room for the backup GPT
    with open(disk, "wb") as fh:
        fh.truncate(total * SECTOR)
    layout = ("label: gpt\nlabel-id: %s\nunit: sectors\nfirst-lba: 2048\n"
              "start=%d, size=%d, type=%s, uuid=%s, name=\"esp\"\n"
              "start=%d, size=%d, type=%s, uuid=%s, name=\"vcaroot\"\n"
              % (guid(profile, "disk"), ESP_START, ESP_SECTORS, ESP_TYPE, guid(profile, "esp"),
                 ROOT_START, fs_sectors, LINUX_FS, guid(profile, "root")))
    run(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", disk], input=layout.encode())
    write_sparse(esp, disk, ESP_START * SECTOR)            # sparse: only blocks with data are written
    write_sparse(fs, disk, ROOT_START * SECTOR)
    esp.unlink()
    fs.unlink()
    return disk


def whole_root_initramfs(profile, rootfs, path):
    """The whole root file system as one gzip'd newc initramfs in path, /init -> /sbin/init.
    Reproducible: names sorted, mtimes clamped, cpio --reproducible, gzip without a name or time.
    gzip, not zstd: the 4.14 VCA kernel predates zstd initramfs. Returns the bytes the tree takes
    once unpacked into tmpfs (each regular file, hard links once, in 4 KiB pages)."""
    epoch = profile["image"]["source_date_epoch"]
    init = rootfs / "init"
    if not os.path.lexists(init):
        init.symlink_to("sbin/init")
        os.utime(init, (epoch, epoch), follow_symlinks=False)
        os.utime(rootfs, (epoch, epoch))
    names, inodes, size = ["."], set(), 0
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            names.append(os.path.relpath(full, rootfs))
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in inodes:
                inodes.add((st.st_dev, st.st_ino))
                size += -(-st.st_size // 4096) * 4096
    listing = "".join(n + "\0" for n in sorted(names)).encode()
    log("$ cpio -o -H newc --reproducible | gzip -n > %s" % path)
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz:
        proc = subprocess.Popen(["cpio", "--quiet", "-o", "-H", "newc", "--reproducible", "--null"], cwd=rootfs,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        feeder = threading.Thread(target=lambda: (proc.stdin.write(listing), proc.stdin.close()))
        feeder.start()
        for block in iter(lambda: proc.stdout.read(1 << 20), b""):
            gz.write(block)
        feeder.join()
        if proc.wait() != 0:
            raise SystemExit("vca-image: cpio failed making %s" % path)
    return size


def make_volatile(profile, rootfs, out):
    """The volatile (RAM) boot image, <profile>.volatile.img, in the form `vcactl boot <card> <cpu>
    <file>` loads (vcactl reads the file as it is, the driver copies it into a buffer the node's
    BIOS allocates, and the BIOS boots that as a UEFI disk): a bare FAT32 volume, no partition
    table, its boot sector at byte 0, as Intel's buildscripts/create_image.sh makes
    vca_baremetal_*.img (github.com/OpenVisualCloud/VCAC-SW). It holds GRUB at the removable-media
    path (the ESP's BOOTX64.EFI) with volatile_grub_cfg() beside it, /startup.nsh (the UEFI shell's
    fallback, as Intel ships it), the newest kernel of the tree and the whole root as one initramfs
    (whole_root_initramfs()): the kernel unpacks it into tmpfs and nothing survives a reboot.
    Sized from its contents (fat_size_mib(), VOLATILE_SLACK_MIB to spare for a node's overlay).
    Returns (the image, the bytes the root takes in tmpfs, the kernel command line)."""
    kernels = sorted((rootfs / "boot").glob("vmlinuz-*"))
    if not kernels:
        raise SystemExit("vca-image: no /boot/vmlinuz-* in the tree: the volatile image boots the tree's kernel")
    tree = _workdir(out / "volatile.d")
    grub_image(tree.parent, tree / GRUB_EFI)
    cmdline = volatile_cmdline(profile, volatile_kernel_args(rootfs, kernels[-1].name[len("vmlinuz-"):]))
    (tree / GRUB_CFG).write_text(volatile_grub_cfg(profile, cmdline))
    (tree / STARTUP_NSH).write_text(STARTUP_NSH_TEXT)
    shutil.copyfile(kernels[-1], tree / VOLATILE_KERNEL)
    root_bytes = whole_root_initramfs(profile, rootfs, tree / VOLATILE_INITRD)
    image = make_fat(profile, "volatile", tree, out / ("%s.volatile.img" % profile["name"]), label=VOLATILE_LABEL,
                     size_mib=fat_size_mib(tree, VOLATILE_SLACK_MIB))
    shutil.rmtree(tree.parent)
    return image, root_bytes, cmdline


def build(profile, out, cache=None, keep_rootfs=False):
    """Build every format the profile asks for into out/; returns the record written beside the image."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(profile["_files"][0]).resolve().parent.parent
    cache = Path(cache or os.environ.get("VCA_IMAGE_CACHE", Path.home() / ".cache" / "vca-image" / "apt"))
    check_host()
    rootfs = out / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    bootstrap(profile, rootfs, cache / profile["suite"])
    problems = vcasetup.check(profile, rootfs)
    if problems:
        raise SystemExit("vca-image: Intel's card-side setup is not in the image (%s): %s"
                         % (rootfs, "; ".join(problems)))
    installed = manifest(rootfs)
    bootloader = grub_version()
    record = configure(profile, rootfs, base, installed, bootloader)
    record["packages"] = installed
    record["boot"] = {"cmdline": kernel_cmdline(profile), "bootloader": bootloader}
    for kind in ("vmlinuz", "initrd.img"):           # the disk's kernel and initramfs, beside it for the record
        found = sorted((rootfs / "boot").glob("%s-*" % kind))
        if found:
            shutil.copyfile(found[-1], out / kind)
    clamp_mtimes(rootfs, profile["image"]["source_date_epoch"])
    disk = make_disk(profile, rootfs, out)
    if "volatile" in profile["formats"]:
        volatile, root_bytes, cmdline = make_volatile(profile, rootfs, out)
        record["volatile"] = volatile.name
        record["volatile_sha256"] = sha256(volatile)
        record["volatile_root_mib"] = -(-root_bytes // 2**20)       # what the root takes in RAM, unpacked
        record["boot"]["volatile_cmdline"] = cmdline
    if not keep_rootfs:
        shutil.rmtree(rootfs)
    record["image"] = disk.name
    record["sha256"] = sha256(disk)
    (out / ("%s.manifest" % profile["name"])).write_text(
        "".join(p + "\n" for p in record["packages"]) + "sha256 %s  %s\n" % (record["sha256"], disk.name)
        + ("sha256 %s  %s\n" % (record["volatile_sha256"], record["volatile"]) if "volatile" in record else ""))
    (out / ("%s.json" % profile["name"])).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
