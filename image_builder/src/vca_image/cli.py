"""vca-image build | verify | boot-test | overlay-cpio | recipe | list-profiles."""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

from . import build as builder
from . import newc
from .boottest import boot, boot_ssh, build_record, fat_has, image_of, memory_for, tap_problems
from .profile import ProfileError, list_profiles, load


def fat_missing(path, offset, names, where):
    """One problem for each of names (paths in the FAT at offset in path) mdir does not find."""
    problems = []
    for name in names:
        found = subprocess.run(["mdir", "-b", "-i", "%s@@%d" % (path, offset), "::/" + name],
                               check=False, capture_output=True, text=True, env=builder.mtools_env())
        if found.returncode != 0:
            problems.append("%s: %s has no /%s" % (path, where, name))
    return problems


def esp_problems(path, parts):
    """Partition 1 must be an EFI system partition holding FAT with GRUB where the firmware
    looks for it (the removable-media path) and its grub.cfg (read with mtools, no mount)."""
    if not parts or parts[0]["type"].upper() != builder.ESP_TYPE:
        return ["%s: partition 1 is not an EFI system partition (the firmware boots GRUB from it)" % path]
    offset = parts[0]["start"] * builder.SECTOR
    with open(path, "rb") as fh:
        fh.seek(offset)
        boot = fh.read(512)
    if boot[510:512] != b"\x55\xaa" or boot[82:90] != b"FAT32   ":
        return ["%s: partition 1 holds no FAT32 file system" % path]
    return fat_missing(path, offset, (builder.GRUB_EFI, builder.GRUB_CFG), "the EFI system partition")


def sha256_problems(path, recorded):
    digest = builder.sha256(path)
    return [] if digest == recorded else ["%s: sha256 %s, the build recorded %s" % (path, digest, recorded)]


def volatile_problems(path, recorded=None):
    """The volatile image must be what `vcactl boot` loads: a bare FAT32 volume (its boot sector at
    byte 0 with 55AA and FAT32, enough clusters, no partition table) holding GRUB, its grub.cfg,
    startup.nsh, the kernel and the initramfs (build.VOLATILE_FILES, read with mtools, no mount);
    and, where the build recorded one, its sha256."""
    with open(path, "rb") as fh:
        head = fh.read(1024)
    clusters = builder.fat32_clusters(head[:512])
    if clusters is None:
        return ["%s: no FAT32 boot sector at byte 0 (55AA, FAT32): not the bare FAT volume vcactl boot loads" % path]
    problems = []
    if clusters < builder.FAT32_MIN_CLUSTERS:
        problems.append("%s: %d clusters, fewer than FAT32 has (%d)" % (path, clusters, builder.FAT32_MIN_CLUSTERS))
    problems += fat_missing(path, 0, builder.VOLATILE_FILES, "the volatile volume")
    return problems + (sha256_problems(path, recorded) if recorded else [])


def verify_image(path):
    """Problems with a built image (an empty list: it is what vcactl blockio expects), and with the
    volatile image its build made beside it. A volatile image given itself is checked as one."""
    path = Path(path)
    with open(path, "rb") as fh:
        if builder.fat32_clusters(fh.read(512)) is not None:
            record_file = path.parent / (path.name.removesuffix(".volatile.img") + ".json")
            record = json.loads(record_file.read_text()) if record_file.is_file() else {}
            return volatile_problems(path, record.get("volatile_sha256") if record.get("volatile") == path.name
                                     else None)
    problems = []
    table = json.loads(subprocess.run(["sfdisk", "--json", str(path)], check=True, capture_output=True,
                                      text=True).stdout)["partitiontable"]
    parts = table.get("partitions", [])
    if table.get("label") != "gpt":
        problems.append("%s: not a GPT disk" % path)
    problems += esp_problems(path, parts)
    if len(parts) < 2 or parts[1]["type"].upper() != builder.LINUX_FS:
        problems.append("%s: partition 2 is not a Linux file system (vcactl blockio roots on it)" % path)
        return problems
    with open(path, "rb") as fh:
        fh.seek(parts[1]["start"] * builder.SECTOR + 1024)
        sb = fh.read(1024)
    magic = struct.unpack_from("<H", sb, 0x38)[0]
    if magic != 0xEF53:
        problems.append("%s: partition 2 holds no ext4 file system" % path)
    label = sb[0x78:0x88].rstrip(b"\0").decode()
    if label != "vcaroot":
        problems.append("%s: root file system label is %r, not vcaroot" % (path, label))
    record_file = path.with_suffix(".json")
    if record_file.exists():
        record = json.loads(record_file.read_text())
        problems += sha256_problems(path, record["sha256"])
        if record.get("volatile"):
            volatile = path.parent / record["volatile"]
            if not volatile.is_file():
                problems.append("%s: the build made a volatile image, %s, and it is not there" % (path, volatile))
            else:
                problems += volatile_problems(volatile, record.get("volatile_sha256"))
    return problems


def report_checks(plan, results, seconds, what):
    """The verifier's checks, one line each, and the count line."""
    for r in results:
        detail = " (%s)" % r["detail"] if r["detail"] else ""
        print("%-4s %2d %s%s" % (r["status"].upper(), r["n"], r["name"], detail))
    count = {s: sum(r["status"] == s for r in results) for s in ("pass", "fail", "skip")}
    print("%s: %.0f s; %d of %s checks, %d pass, %d fail, %d skip (hardware absent)"
          % (what, seconds, len(results), "?" if plan is None else plan, count["pass"], count["fail"], count["skip"]))


def boot_test(args):
    """Boot the build under QEMU; 0 only when every check the verifier planned came and none is not ok
    (and, over ssh, the login took the expected host key only and the guest powered off)."""
    if bool(args.ssh_key) != bool(args.host_key):
        print("vca-image: --ssh-key and --host-key go together (the login needs the key to expect)", file=sys.stderr)
        return 2
    if args.overlay and not args.volatile:
        print("vca-image: --overlay is for --volatile: a disk's overlay is written into the disk "
              "(scripts/node-disk-overlay.py), then booted with --image", file=sys.stderr)
        return 2
    if args.overlay and not Path(args.overlay).is_file():
        print("vca-image: --overlay %s: no such file" % args.overlay, file=sys.stderr)
        return 2
    if args.ssh_key and args.volatile and not args.overlay and not (
            args.image and fat_has(args.image, builder.VOLATILE_OVERLAY)):
        print("vca-image: --ssh-key with --volatile needs the node's overlay (its host key, the fleet's key): "
              "--overlay OVERLAY.cpio (vca-image overlay-cpio), or --image VOLUME with /%s on it"
              % builder.VOLATILE_OVERLAY, file=sys.stderr)
        return 2
    record = build_record(args.out, args.volatile)
    memory = args.memory or memory_for(record, args.volatile, image_of(args.out, record, args.image, args.volatile))
    what = "the volatile image" if args.volatile else "the disk"
    print("booting %s under OVMF with %d MiB of memory" % (what, memory))
    if not args.ssh_key:
        plan, results, seconds, _ = boot(args.out, image=args.image, timeout=args.timeout, memory_mib=memory,
                                         volatile=args.volatile, overlay=args.overlay)
        report_checks(plan, results, seconds, "boot to verifier done")
        problems = tap_problems(plan, results)
    else:
        run = boot_ssh(args.out, args.ssh_key, args.host_key, user=args.user, image=args.image,
                       timeout=args.timeout, memory_mib=memory, volatile=args.volatile, overlay=args.overlay)
        plan, results, t = run["plan"], run["results"], run["timings"]
        report_checks(plan, results, t.get("verifier", run["seconds"]), "boot to verifier over ssh done")
        def at(key):
            return "%.0f s" % t[key] if key in t else "-"
        print("ssh on 127.0.0.1:%d: sshd answered after %s, login as %s after %s, boot finished (%s) after %s, "
              "verifier done after %s, powered off after %s"
              % (run["port"], at("ssh"), args.user, at("login"), run.get("system_state", "-"), at("system"),
                 at("verifier"), at("poweroff")))
        print("a login expecting another host key: %s" % {True: "refused", False: "NOT refused"}.get(
            run.get("wrong_host_key_refused"), "not tried"))
        problems = run["problems"] + (tap_problems(plan, results, "from ssh") if "login" in t else [])
    for p in problems:
        print("vca-image: boot test failed: %s" % p, file=sys.stderr)
    if problems:
        print("vca-image: the console is in %s" % (Path(args.out) / "boot-console.log"), file=sys.stderr)
    return 1 if problems else 0


def overlay_cpio(spec_path, out):
    """vca-image overlay-cpio SPEC.json OUT.cpio: 0 once written, 1 with the reason when the spec is refused."""
    try:
        spec = json.loads(Path(spec_path).read_text())
        data = newc.archive(spec, mtime=int(os.environ.get("SOURCE_DATE_EPOCH", "0")))
    except (OSError, ValueError, newc.OverlayError) as exc:
        print("vca-image: overlay-cpio: %s: %s" % (spec_path, exc), file=sys.stderr)
        return 1
    # 0600: the overlay holds the node's private host key
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    print("%s  %s (%d entries, newc)" % (builder.sha256(out), out, len(spec)))
    return 0


def parser():
    ap = argparse.ArgumentParser(prog="vca-image", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build a profile's image")
    b.add_argument("--profile", required=True, help="a profile name (see list-profiles) or a .yml path")
    b.add_argument("--out", required=True)
    b.add_argument("--cache", help="package download cache (default ~/.cache/vca-image/apt, or VCA_IMAGE_CACHE)")
    b.add_argument("--profiles-dir")
    v = sub.add_parser("verify", help="check a built image's layout, file system and sha256")
    v.add_argument("image")
    bt = sub.add_parser("boot-test", help="boot a build's image under QEMU and check the verifier's TAP")
    bt.add_argument("out", help="the build's --out directory (image, vmlinuz, initrd.img)")
    bt.add_argument("--timeout", type=int, default=600)
    bt.add_argument("--volatile", action="store_true", help="boot the volatile (RAM) image instead of the disk")
    bt.add_argument("--memory", type=int, help="MiB of guest memory (default 1536 for the disk; for --volatile, "
                                               "from the root's size the build recorded: see memory_for)")
    bt.add_argument("--image", help="boot this disk (a node's copy, its overlay written) or, with --volatile, "
                                    "this volatile volume instead of the build's; it is copied too, and stays "
                                    "as it was")
    bt.add_argument("--overlay", help="with --volatile: a node's overlay (vca-image overlay-cpio) to put on the "
                                      "copy as /%s" % builder.VOLATILE_OVERLAY)
    bt.add_argument("--ssh-key", help="log in over ssh with this private key and run the verifier there "
                                      "(instead of reading it from the console)")
    bt.add_argument("--host-key", help="with --ssh-key: the guest's expected ssh_host_ed25519_key.pub; "
                                       "a login to any other host key fails the test")
    bt.add_argument("--user", default="vcaadmin", help="with --ssh-key: who logs in (root, or a user with sudo "
                                                       "without a password for the verifier; default vcaadmin)")
    oc = sub.add_parser("overlay-cpio", help="write a node's overlay as a newc cpio for a volatile boot")
    oc.add_argument("spec", help="JSON: absolute path -> text, or {content|src, mode, owner, group, state}, as "
                                 "scripts/node-disk-overlay.py takes it, with numeric owner and group")
    oc.add_argument("cpio", help="the archive to write (mtime on every entry: $SOURCE_DATE_EPOCH, else 0)")
    r = sub.add_parser("recipe", help="print the digest of what a build of this profile is made from")
    r.add_argument("--profile", required=True)
    r.add_argument("--profiles-dir")
    lp = sub.add_parser("list-profiles", help="the profiles that can be built")
    lp.add_argument("--profiles-dir")
    return ap


def verify(image):
    problems = verify_image(image)
    for p in problems:
        print(p, file=sys.stderr)
    print("%s: %s" % (image, "ok" if not problems else "%d problem(s)" % len(problems)))
    return 1 if problems else 0


def main(argv=None):
    args = parser().parse_args(argv)
    if args.command == "list-profiles":
        for name in list_profiles(args.profiles_dir):
            try:
                profile = load(name, args.profiles_dir, check_paths=False)
                print("%-14s %s" % (name, profile.get("description", "")))
            except ProfileError as exc:
                kind = "(abstract)" if "abstract: true" in str(exc) else "INVALID: %s" % exc
                print("%-14s %s" % (name, kind))
        return 0
    commands = {"verify": lambda: verify(args.image), "boot-test": lambda: boot_test(args),
                "overlay-cpio": lambda: overlay_cpio(args.spec, args.cpio)}
    if args.command in commands:
        return commands[args.command]()
    try:
        profile = load(args.profile, args.profiles_dir)     # every profile error before any download
    except ProfileError as exc:
        print("vca-image: %s" % exc, file=sys.stderr)
        return 2
    if args.command == "recipe":
        print(builder.recipe(profile))
        return 0
    start = time.monotonic()
    record = builder.build(profile, args.out, args.cache)
    print("%s  %s" % (record["sha256"], Path(args.out) / record["image"]))
    print("built %s in %.0f s (%d packages), build_id %s"
          % (profile["name"], time.monotonic() - start, len(record["packages"]), record["build_id"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
