"""Boot a built image under QEMU (software emulation is enough) and read the verifier's TAP.

The blockio disk boots as a card boots it: UEFI firmware (OVMF) loads GRUB from
the disk's EFI system partition, and GRUB the kernel and initramfs named in its
grub.cfg, with the profile's command line. No -kernel/-initrd. The boot test's
own kernel arguments (BOOTTEST_ARGS) reach the kernel through a GRUB environment
block (build.CMDLINE_ENV) written with mtools into a throwaway copy of the disk,
so the built disk is never changed. The volatile image still boots with
QEMU's -kernel/-initrd (its bootable form is a later step).

The image's vca-boottest.service runs vca-node-verify --kmsg when the kernel
command line says vca.boottest, then powers off; QEMU runs with -no-reboot.
The TAP lines come back on the serial console as kernel messages.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from . import build

TAP = re.compile(r"vca-node-verify: (.*)$")
PLAN = re.compile(r"^1\.\.(\d+)$")
RESULT = re.compile(r"^(ok|not ok) (\d+) - (.*?)(?: # (SKIP)? ?(.*))?$")
# devkmsg's default rate limit (10 lines per 5 s) drops most of the verifier's lines.
KERNEL_ARGS = "console=ttyS0 printk.devkmsg=on net.ifnames=0 vca.boottest vca.host=10.0.2.2 panic=-1"
# What the boot test adds to the disk's own command line (grub.cfg has root=, net.ifnames=0).
BOOTTEST_ARGS = "vca.boottest vca.host=10.0.2.2 printk.devkmsg=on panic=-1 console=ttyS0"
# Debian's ovmf: UEFI for x86_64 without Secure Boot or SMM (its QEMU descriptor
# 60-edk2-x86_64.json names the 4M pair); the code read-only, a copy of the variable store writable.
OVMF = [("/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"),
        ("/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd")]


def parse_tap(text):
    """The verifier's plan (None when no 1..N came) and its results, from the console text."""
    plan, results = None, []
    for line in text.splitlines():
        m = TAP.search(line)
        if not m:
            continue
        tap = m.group(1).strip()
        if p := PLAN.match(tap):
            plan = int(p.group(1))
        elif r := RESULT.match(tap):
            results.append({"n": int(r.group(2)), "name": r.group(3), "status":
                            "fail" if r.group(1) == "not ok" else ("skip" if r.group(4) else "pass"),
                            "detail": r.group(5) or ""})
    return plan, results


def tap_problems(plan, results):
    """Why the verifier's output fails the boot test, one line each; [] when it passes."""
    problems = []
    if plan is None:
        problems.append("no TAP plan (1..N) on the console; %d checks came" % len(results))
    elif len(results) != plan:
        problems.append("%d checks planned, %d came" % (plan, len(results)))
    failed = [r for r in results if r["status"] == "fail"]
    if failed:
        problems.append("not ok: %s" % ", ".join("%d %s" % (r["n"], r["name"]) for r in failed))
    return problems


def ovmf():
    """(code, vars template) of the first OVMF pair installed; SystemExit naming the package when none is."""
    for code, nvram in OVMF:
        if os.path.isfile(code) and os.path.isfile(nvram):
            return code, nvram
    raise SystemExit("vca-image: no OVMF firmware (%s): apt-get install ovmf" % ", ".join(c for c, _ in OVMF))


def grub_env(values):
    """A GRUB environment block (what grub-editenv writes): its signature, NAME=VALUE lines,
    '#' up to 1024 bytes. Values with a newline or backslash are refused (they would need escapes)."""
    body = "# GRUB Environment Block\n"
    for name, value in values.items():
        if "\n" in value or "\\" in value:
            raise ValueError("GRUB environment value %r: no newline or backslash" % value)
        body += "%s=%s\n" % (name, value)
    if len(body) > 1024:
        raise ValueError("GRUB environment block over 1024 bytes")
    return (body + "#" * (1024 - len(body))).encode()


def esp_offset(disk):
    """Byte offset of the disk's EFI system partition (partition 1); SystemExit when it has none."""
    table = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True,
                                      text=True).stdout)["partitiontable"]
    parts = table.get("partitions", [])
    if not parts or parts[0]["type"].upper() != build.ESP_TYPE:
        raise SystemExit("vca-image: %s has no EFI system partition (partition 1): it cannot boot from its "
                         "own bootloader; rebuild it" % disk)
    return parts[0]["start"] * build.SECTOR


def boot_copy(image, work, extra_args):
    """A copy of the disk (sparse) whose ESP carries build.CMDLINE_ENV with vca_cmdline_extra =
    extra_args, written by mcopy: the disk the boot test boots. The built image stays untouched."""
    work.mkdir(parents=True, exist_ok=True)
    copy = work / Path(image).name
    copy.unlink(missing_ok=True)
    subprocess.run(["cp", "--sparse=always", "--reflink=auto", str(image), str(copy)], check=True)
    env_file = work / "vca-cmdline.env"
    env_file.write_bytes(grub_env({"vca_cmdline_extra": extra_args}))
    subprocess.run(["mcopy", "-o", "-i", "%s@@%d" % (copy, esp_offset(copy)), str(env_file),
                    "::/" + build.CMDLINE_ENV], check=True, env=build.mtools_env(work), stdout=subprocess.DEVNULL)
    return copy


def boot(out, image=None, timeout=600, memory_mib=1536, volatile=False):
    """Boot out/<image> from its own ESP under OVMF (a copy of it, with BOOTTEST_ARGS), or
    (volatile) out/vmlinuz with the whole-root initramfs and no disk; returns
    (plan, results, seconds, console text)."""
    out = Path(out)
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    records = [r for r in records if isinstance(r, dict) and "image" in r]
    if not records:
        raise SystemExit("vca-image: no build record (<profile>.json) in %s" % out)
    if volatile and "volatile" not in records[0]:
        raise SystemExit("vca-image: %s has no volatile image (its profile's formats do not ask for one)" % out)
    image = image or out / records[0]["image"]
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise SystemExit("vca-image: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
    console = out / "boot-console.log"
    console.unlink(missing_ok=True)
    work = out / "boot-test"
    cmd = [qemu, "-machine", "q35", "-m", str(memory_mib), "-smp", "2", "-display", "none", "-no-reboot",
           "-serial", "file:%s" % console]
    # romfile=: no iPXE option ROM, so the firmware does not try a network boot
    net = ["-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0,romfile="]
    if volatile:    # no root=: the kernel runs /init from the initramfs, in tmpfs
        cmd += ["-snapshot", "-kernel", str(out / "vmlinuz"), "-initrd", str(out / records[0]["volatile"]),
                "-append", KERNEL_ARGS, *net]
    else:
        code, nvram = ovmf()
        disk = boot_copy(image, work, BOOTTEST_ARGS)
        variables = work / "OVMF_VARS.fd"
        shutil.copyfile(nvram, variables)
        cmd += ["-drive", "if=pflash,format=raw,unit=0,readonly=on,file=%s" % code,
                "-drive", "if=pflash,format=raw,unit=1,file=%s" % variables,
                "-drive", "if=none,id=disk0,format=raw,file=%s" % disk,
                "-device", "virtio-blk-pci,drive=disk0,bootindex=0", *net]
    start = time.monotonic()
    try:
        subprocess.run(cmd, timeout=timeout, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if work.exists():
            shutil.rmtree(work)
    seconds = time.monotonic() - start
    text = console.read_text(errors="replace") if console.exists() else ""
    return (*parse_tap(text), seconds, text)
