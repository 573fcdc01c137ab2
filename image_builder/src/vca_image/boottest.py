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
RESULT = re.compile(r"^(ok|not ok) (\d+) - (.*?)(?: # (SKIP)? ?(.*))?$")


def boot(out, image=None, timeout=600, memory_mib=1536, volatile=False):
    """Boot out/<image> with out/vmlinuz and out/initrd.img, or (volatile) out/vmlinuz with the
    whole-root initramfs and no disk; returns (results, seconds, console text)."""
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
    args = "console=ttyS0 net.ifnames=0 vca.boottest vca.host=10.0.2.2 panic=-1"
    if volatile:    # no root=: the kernel runs /init from the initramfs, in tmpfs
        cmd += ["-initrd", str(out / records[0]["volatile"]), "-append", args]
    else:
        cmd += ["-initrd", str(out / "initrd.img"), "-append", "root=/dev/vda2 rw " + args,
                "-drive", "file=%s,format=raw,if=virtio" % image]
    start = time.monotonic()
    try:
        subprocess.run(cmd, timeout=timeout, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except subprocess.TimeoutExpired:
        pass
    seconds = time.monotonic() - start
    text = console.read_text(errors="replace") if console.exists() else ""
    results = []
    for line in text.splitlines():
        m = TAP.search(line)
        r = RESULT.match(m.group(1)) if m else None
        if r:
            results.append({"n": int(r.group(2)), "name": r.group(3), "status":
                            "fail" if r.group(1) == "not ok" else ("skip" if r.group(4) else "pass"),
                            "detail": r.group(5) or ""})
    return results, seconds, text
