"""vca-image build | verify | boot-test | recipe | list-profiles."""

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
from .boottest import boot, boot_ssh, tap_problems
from .profile import ProfileError, list_profiles, load


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
    problems = []
    env = dict(os.environ, MTOOLS_SKIP_CHECK="1", MTOOLSRC=os.devnull)
    for name in (builder.GRUB_EFI, builder.GRUB_CFG):
        found = subprocess.run(["mdir", "-b", "-i", "%s@@%d" % (path, offset), "::/" + name],
                               check=False, capture_output=True, text=True, env=env)
        if found.returncode != 0:
            problems.append("%s: the EFI system partition has no /%s" % (path, name))
    return problems


def verify_image(path):
    """Problems with a built image (an empty list: it is what vcactl blockio expects)."""
    path = Path(path)
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
        digest = builder.sha256(path)
        if digest != record["sha256"]:
            problems.append("%s: sha256 %s, the build recorded %s" % (path, digest, record["sha256"]))
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
    if args.ssh_key and args.volatile:
        print("vca-image: --ssh-key boots the disk: the volatile image carries no overlay with its host key",
              file=sys.stderr)
        return 2
    if not args.ssh_key:
        plan, results, seconds, _ = boot(args.out, image=args.image, timeout=args.timeout, memory_mib=args.memory,
                                         volatile=args.volatile)
        report_checks(plan, results, seconds, "boot to verifier done")
        problems = tap_problems(plan, results)
    else:
        run = boot_ssh(args.out, args.ssh_key, args.host_key, user=args.user, image=args.image,
                       timeout=args.timeout, memory_mib=args.memory)
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


def main(argv=None):
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
    bt.add_argument("--memory", type=int, default=1536, help="MiB of guest memory (a volatile boot holds the root)")
    bt.add_argument("--image", help="boot this disk (a node's copy, its overlay written) instead of the build's; "
                                    "it is copied too, and stays as it was")
    bt.add_argument("--ssh-key", help="log in over ssh with this private key and run the verifier there "
                                      "(instead of reading it from the console)")
    bt.add_argument("--host-key", help="with --ssh-key: the guest's expected ssh_host_ed25519_key.pub; "
                                       "a login to any other host key fails the test")
    bt.add_argument("--user", default="vcaadmin", help="with --ssh-key: who logs in (needs sudo without a "
                                                       "password for the verifier; default vcaadmin)")
    r = sub.add_parser("recipe", help="print the digest of what a build of this profile is made from")
    r.add_argument("--profile", required=True)
    r.add_argument("--profiles-dir")
    lp = sub.add_parser("list-profiles", help="the profiles that can be built")
    lp.add_argument("--profiles-dir")
    args = ap.parse_args(argv)

    if args.command == "list-profiles":
        for name in list_profiles(args.profiles_dir):
            try:
                profile = load(name, args.profiles_dir, check_paths=False)
                print("%-14s %s" % (name, profile.get("description", "")))
            except ProfileError as exc:
                kind = "(abstract)" if "abstract: true" in str(exc) else "INVALID: %s" % exc
                print("%-14s %s" % (name, kind))
        return 0
    if args.command == "verify":
        problems = verify_image(args.image)
        for p in problems:
            print(p, file=sys.stderr)
        print("%s: %s" % (args.image, "ok" if not problems else "%d problem(s)" % len(problems)))
        return 1 if problems else 0
    if args.command == "boot-test":
        return boot_test(args)
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
