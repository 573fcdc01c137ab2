"""An image's verifier judged against a card's sysfs and procfs, outside a card.

The card-shaped tree is the simulator's node tree (tree.py: cpufreq at the kernel's default,
powersave under intel_pstate; coretemp; RAPL) without its lab marker, plus what a card's kernel
and Intel's node drivers present once they are up: an E3-1585L v5 in cpuinfo, vop, vca_csa and
plx87xx in /proc/modules, /sys/class/vca/vca/state at net_device_ready, the Iris Pro P580 on PCI
bound to i915. None of it is the image's to set. What the image sets itself (the governor) is
set only by running the image's own boot units that systemd orders before its verifier, from
the image's tree, against this one; then the image's verifier judges it as a VCA node.

    python3 -m vcasim.card ROOTFS WORKDIR
ROOTFS holds the image's /etc and /usr/local/sbin (at least); prints the verifier's summary
(its JSON) with "booted": the units run. The verifier's exit status is not this one's.
"""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys
from pathlib import Path

from .model import load_params
from .tree import SysfsTree

VERIFY_UNIT = "vca-node-verify.service"
VCA_CPU = "Intel(R) Xeon(R) CPU E3-1585L v5 @ 3.00GHz"
P580_SLOT = "0000:00:02.0"
CARD_MODULES = ("vop", "vca_csa", "plx87xx")


def card_tree(work: Path, node: dict) -> tuple[Path, Path]:
    """(sysfs, procfs) roots under work, as a card's kernel boots one node."""
    tree = SysfsTree(work / "sys", node)
    tree.create()
    (tree.root / "vcasim").unlink()                    # a card's sysfs has no lab marker
    sysfs = tree.root
    (sysfs / "class/vca/vca").mkdir(parents=True)
    (sysfs / "class/vca/vca/state").write_text("net_device_ready\n")
    drivers = sysfs / "bus/pci/drivers/i915"
    drivers.mkdir(parents=True)
    gpu = sysfs / "bus/pci/devices" / P580_SLOT
    gpu.mkdir(parents=True)
    (gpu / "vendor").write_text("0x8086\n")
    (gpu / "device").write_text("0x193a\n")
    (gpu / "driver").symlink_to(drivers)
    cpus = node["cores"] * node["threads_per_core"]
    proc = work / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text("".join(f"processor\t: {n}\nmodel name\t: {VCA_CPU}\n\n" for n in range(cpus)))
    (proc / "modules").write_text("".join(f"{m} 16384 0 - Live 0x0000000000000000\n" for m in CARD_MODULES))
    (proc / "cmdline").write_text("root=/dev/vcablk0p2 rw net.ifnames=0\n")
    (proc / "meminfo").write_text("MemTotal:       32768000 kB\nMemAvailable:   30000000 kB\n")
    return sysfs, proc


def unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read(path)
    return parser


def units_before_the_verifier(rootfs: Path) -> list[tuple[str, configparser.ConfigParser]]:
    """The image's enabled units that systemd starts before the verifier (its After=, their Before=)."""
    system = rootfs / "etc/systemd/system"
    verifier_after = unit(system / VERIFY_UNIT)["Unit"].get("After", "").split()
    found = []
    for link in sorted((system / "multi-user.target.wants").iterdir()):
        path = in_tree(rootfs, link)
        if path is None:
            continue                      # a distribution's unit (/lib/systemd): no setting of the image's
        parsed = unit(path)
        if link.name in verifier_after or VERIFY_UNIT in parsed["Unit"].get("Before", "").split():
            found.append((link.name, parsed))
    return found


def in_tree(rootfs: Path, path: Path) -> Path | None:
    """path's file inside the image's tree (absolute links resolved there, not on this machine); None
    where the tree holds no such file."""
    for _ in range(8):
        if not path.is_symlink():
            return path if path.is_file() else None
        target = Path(os.readlink(path))
        path = rootfs / target.relative_to("/") if target.is_absolute() else path.parent / target
    return None


def boot(rootfs: Path, sysfs: Path) -> list[str]:
    """Run, as the boot would, each image unit that comes before the verifier, its program from the
    image's tree (a distribution's program, absent from the tree, is no setting of the image's)."""
    ran = []
    for name, parsed in units_before_the_verifier(rootfs):
        argv = parsed["Service"]["ExecStart"].split()
        program = rootfs / argv[0].lstrip("/")
        if not program.is_file():
            continue
        env = dict(os.environ, VCA_NODE_VERIFY_SYS=str(sysfs))
        done = subprocess.run([sys.executable, str(program), *argv[1:]], env=env, capture_output=True, text=True,
                              check=False, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{name}: {program} exited {done.returncode}: {(done.stdout + done.stderr).strip()}")
        ran.append(name)
    return ran


def verify(rootfs: Path, sysfs: Path, proc: Path, out: Path) -> dict:
    """The image's verifier on the tree; its JSON summary (the exit status says only 'a check failed')."""
    env = dict(os.environ, VCA_NODE_VERIFY_SYS=str(sysfs), VCA_NODE_VERIFY_PROC=str(proc),
               VCA_NODE_VERIFY_ETC=str(rootfs / "etc"))
    subprocess.run([sys.executable, str(rootfs / "usr/local/sbin/vca-node-verify"), "--json", str(out)],
                   env=env, capture_output=True, text=True, timeout=120, check=False)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python3 -m vcasim.card ROOTFS WORKDIR (WORKDIR empty or absent)", file=sys.stderr)
        return 2
    rootfs, work = Path(argv[0]), Path(argv[1])
    if not (rootfs / "usr/local/sbin/vca-node-verify").is_file():
        print(f"{rootfs}: no usr/local/sbin/vca-node-verify (not an image's tree)", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        print(f"{work}: not empty", file=sys.stderr)
        return 2
    sysfs, proc = card_tree(work, load_params()["node"])
    ran = boot(rootfs, sysfs)
    summary = verify(rootfs, sysfs, proc, work / "verify.json")
    print(json.dumps(dict(summary, booted=ran)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
