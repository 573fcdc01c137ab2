"""Boot a built image under QEMU (software emulation is enough) and read the verifier's TAP.

The image's vca-boottest.service runs vca-node-verify --kmsg when the kernel
command line says vca.boottest, then powers off; QEMU runs with -no-reboot and
-snapshot (the image is not changed). The TAP lines come back on the serial
console as kernel messages.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

TAP = re.compile(r"vca-node-verify: (.*)$")
PLAN = re.compile(r"^1\.\.(\d+)$")
RESULT = re.compile(r"^(ok|not ok) (\d+) - (.*?)(?: # (SKIP)? ?(.*))?$")
# devkmsg's default rate limit (10 lines per 5 s) drops most of the verifier's lines.
KERNEL_ARGS = "console=ttyS0 printk.devkmsg=on net.ifnames=0 vca.boottest vca.host=10.0.2.2 panic=-1"


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


def boot(out, image=None, timeout=600, memory_mib=1536, volatile=False):
    """Boot out/<image> with out/vmlinuz and out/initrd.img, or (volatile) out/vmlinuz with the
    whole-root initramfs and no disk; returns (plan, results, seconds, console text)."""
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
    cmd = [qemu, "-machine", "q35", "-m", str(memory_mib), "-smp", "2", "-display", "none", "-no-reboot",
           "-snapshot", "-serial", "file:%s" % console,
           "-kernel", str(out / "vmlinuz"), "-netdev", "user,id=n0", "-device", "virtio-net-pci,netdev=n0"]
    if volatile:    # no root=: the kernel runs /init from the initramfs, in tmpfs
        cmd += ["-initrd", str(out / records[0]["volatile"]), "-append", KERNEL_ARGS]
    else:
        cmd += ["-initrd", str(out / "initrd.img"), "-append", "root=/dev/vda2 rw " + KERNEL_ARGS,
                "-drive", "file=%s,format=raw,if=virtio" % image]
    start = time.monotonic()
    try:
        subprocess.run(cmd, timeout=timeout, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except subprocess.TimeoutExpired:
        pass
    seconds = time.monotonic() - start
    text = console.read_text(errors="replace") if console.exists() else ""
    return (*parse_tap(text), seconds, text)
