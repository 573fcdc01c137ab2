"""Build a node image from a profile: mmdebstrap into a directory, then a GPT disk with
the root file system on partition 2, made by sfdisk and `mke2fs -d` (no loop device,
no mount). Reproducible: SOURCE_DATE_EPOCH, every mtime clamped to it, a fixed
file-system UUID, hash seed and GPT GUIDs, a sorted package set, and the files a
first boot makes for itself (ssh host keys, machine-id, logs) left out.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

from .profile import agent_units, kernel_debs

SECTOR = 512
ROOT_START = 4096                                   # sectors: 1 MiB GPT + 1 MiB BIOS-boot partition
LINUX_FS = "0FC63DAF-8483-4772-8E79-3D69D8477DE4"
BIOS_BOOT = "21686148-6449-6E6F-744E-656564454649"
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
    (the profile schema admits only plain user and group names as well)."""
    return ['chroot "$1" ' + " ".join(shlex.quote(arg) for arg in useradd_argv(user))
            for user in profile.get("users", [])]


def bootstrap(profile, rootfs, cache):
    """mmdebstrap the sorted package set into rootfs; downloads cached in cache/."""
    cache.mkdir(parents=True, exist_ok=True)
    include = packages(profile)
    if profile["kernel"]["source"] == "debs_dir":
        include += [str(p) for p in kernel_debs(profile)]
    cmd = ["mmdebstrap", "--variant=%s" % profile.get("variant", "minbase"),
           "--components=%s" % ",".join(profile.get("components", ["main"])),
           "--include=%s" % ",".join(include),
           "--aptopt=Acquire::Languages \"none\"",
           "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-include=/usr/share/doc/*/copyright",
           "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/locale/*",
           # the package cache: in before the download, out after it, so a rebuild downloads nothing
           '--setup-hook=mkdir -p "$1"/var/cache/apt/archives/',
           # mmdebstrap splits a special hook's arguments as a shell would: quoted
           "--setup-hook=sync-in %s /var/cache/apt/archives/" % shlex.quote(str(cache)),
           "--customize-hook=sync-out /var/cache/apt/archives %s" % shlex.quote(str(cache))]
    cmd += ["--customize-hook=%s" % hook for hook in user_hooks(profile)]
    cmd += [profile["suite"], str(rootfs), profile["mirror"]]
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(profile["image"]["source_date_epoch"]))
    run(cmd, env=env)


def write(root, rel, text, mode=0o644):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


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


def configure(profile, rootfs, base, packages_installed):
    """Overlays, network, fleet keys, the image record; then the per-build files out."""
    for overlay in profile.get("overlays", []):
        shutil.copytree(base / overlay, rootfs, symlinks=True, dirs_exist_ok=True)
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
    for user in profile.get("users", []):
        if user.get("authorized_keys"):
            home = rootfs / ("root" if user["name"] == "root" else "home/%s" % user["name"])
            write(home, ".ssh/authorized_keys", "".join(k.strip() + "\n" for k in user["authorized_keys"]), 0o600)
    for pattern in VOLATILE:
        for path in rootfs.glob(pattern):
            if path.is_file() or path.is_symlink():
                path.unlink()
    write(rootfs, "etc/machine-id", "")                 # systemd fills it on first boot
    kernels = sorted(p.name[len("vmlinuz-"):] for p in (rootfs / "boot").glob("vmlinuz-*"))
    # build_id names this image by content (recipe + the package versions it got): a booted
    # node reports it from /etc/vca-image.json, and the host's store files the image under it.
    build = recipe(profile)
    build_id = hashlib.sha256(("%s\n" % build + "\n".join(packages_installed)).encode()).hexdigest()[:16]
    record = {"build_id": build_id, "recipe": build, "profile": profile["name"], "suite": profile["suite"],
              "kernel_version": kernels[-1] if kernels else None,
              "users": [{"name": u["name"], "authorized_keys": bool(u.get("authorized_keys"))}
                        for u in profile.get("users", [])],
              "source_date_epoch": profile["image"]["source_date_epoch"]}
    write(rootfs, "etc/vca-image.json", json.dumps(record, indent=1, sort_keys=True) + "\n")
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


def make_disk(profile, rootfs, out):
    """root.ext4 from the tree, then the GPT disk around it: no loop device, no mount."""
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
    fs_sectors = size_mib * 2**20 // SECTOR
    disk = out / ("%s.img" % profile["name"])
    total = ROOT_START + fs_sectors + 2048                 # room for the backup GPT
    with open(disk, "wb") as fh:
        fh.truncate(total * SECTOR)
    layout = ("label: gpt\nlabel-id: %s\nunit: sectors\nfirst-lba: 2048\n"
              "start=2048, size=2048, type=%s, uuid=%s, name=\"bios\"\n"
              "start=%d, size=%d, type=%s, uuid=%s, name=\"vcaroot\"\n"
              % (guid(profile, "disk"), BIOS_BOOT, guid(profile, "bios"), ROOT_START, fs_sectors, LINUX_FS,
                 guid(profile, "root")))
    run(["sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", disk], input=layout.encode())
    with open(fs, "rb") as src, open(disk, "r+b") as dst:       # sparse: only blocks with data are written
        offset = ROOT_START * SECTOR
        for block in iter(lambda: src.read(1 << 20), b""):
            if block.count(0) != len(block):
                dst.seek(offset)
                dst.write(block)
            offset += len(block)
    fs.unlink()
    return disk


def make_volatile(profile, rootfs, out):
    """The volatile (RAM) boot image: the whole root file system as one gzip'd newc initramfs,
    /init -> /sbin/init, booted with the build's vmlinuz and no disk (the kernel unpacks it
    into tmpfs; nothing survives a reboot). Reproducible: names sorted, mtimes clamped,
    cpio --reproducible, gzip without a name or time. gzip, not zstd: the 4.14 VCA kernel
    predates zstd initramfs."""
    epoch = profile["image"]["source_date_epoch"]
    init = rootfs / "init"
    if not os.path.lexists(init):
        init.symlink_to("sbin/init")
        os.utime(init, (epoch, epoch), follow_symlinks=False)
        os.utime(rootfs, (epoch, epoch))
    names = ["."]
    for dirpath, dirnames, filenames in os.walk(rootfs):
        for name in dirnames + filenames:
            names.append(os.path.relpath(os.path.join(dirpath, name), rootfs))
    listing = "".join(n + "\0" for n in sorted(names)).encode()
    path = out / ("%s.volatile.cpio.gz" % profile["name"])
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
    return path


def build(profile, out, cache=None, keep_rootfs=False):
    """Build every format the profile asks for into out/; returns the record written beside the image."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = Path(profile["_files"][0]).resolve().parent.parent
    cache = Path(cache or os.environ.get("VCA_IMAGE_CACHE", Path.home() / ".cache" / "vca-image" / "apt"))
    rootfs = out / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    bootstrap(profile, rootfs, cache / profile["suite"])
    installed = manifest(rootfs)
    record = configure(profile, rootfs, base, installed)
    record["packages"] = installed
    for kind in ("vmlinuz", "initrd.img"):           # for QEMU's -kernel/-initrd and for vcactl
        found = sorted((rootfs / "boot").glob("%s-*" % kind))
        if found:
            shutil.copyfile(found[-1], out / kind)
    clamp_mtimes(rootfs, profile["image"]["source_date_epoch"])
    disk = make_disk(profile, rootfs, out)
    if "volatile" in profile["formats"]:
        volatile = make_volatile(profile, rootfs, out)
        record["volatile"] = volatile.name
        record["volatile_sha256"] = sha256(volatile)
    if not keep_rootfs:
        shutil.rmtree(rootfs)
    record["image"] = disk.name
    record["sha256"] = sha256(disk)
    (out / ("%s.manifest" % profile["name"])).write_text(
        "".join(p + "\n" for p in record["packages"]) + "sha256 %s  %s\n" % (record["sha256"], disk.name)
        + ("sha256 %s  %s\n" % (record["volatile_sha256"], record["volatile"]) if "volatile" in record else ""))
    (out / ("%s.json" % profile["name"])).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record
