"""Intel's card-side VCA setup inside the image, as Intel's own image build does it.

Why: Intel's node package (vcass-modules-<kernel>) runs /sbin/vca_setup.sh from its
postinst (modules/postinstall-pak in github.com/OpenVisualCloud/VCAC-SW: `depmod
<kernel>`, then `vca_setup.sh` with no argument). vca_setup.sh (modules/scripts/
vca_setup.sh) sources /etc/vca_config without checking that it is there, so without the
file the postinst fails, and dpkg with it; and called with no argument it assumes the
HOST side (the host's module order, vca_mgr, in /etc/modprobe.d/vca.conf). Intel's
image build (buildscripts/archive_scripts/vca/postadd.sh) therefore writes
/etc/vca_config before the packages go in, then runs `depmod -a <kernel>` and
`/sbin/vca_setup.sh card` in the image. `card` writes the node's module order (vca_csa,
not the host's vca_mgr), the udev rule that brings up the VirtIO network through
VCA_ETH_SCRIPT, and enables vca_agent.service. hooks() does the same through
mmdebstrap; check() reads the result back, and the build stops on any problem.

Not known here (Intel's .debs are not ours, so this path has not run): modules/Makefile's
conf_install also installs a vca_config of its own (modules/scripts/vca_config, whose
VCA_ETH_RULE is under /etc/udev/rules.d, where postadd.sh's is under /lib/udev/rules.d),
so whether Intel's Ubuntu .deb carries /etc/vca_config, and whether dpkg then keeps the
one written first, depends on how that .deb was made. check() therefore takes the paths
it checks from the image's own /etc/vca_config, as vca_setup.sh did.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path, PurePosixPath

CONFIG = "/etc/vca_config"
# Intel's card-side values, as buildscripts/archive_scripts/vca/postadd.sh writes them: the
# card's PCI IDs and addresses, the files vca_setup.sh writes and the script the udev rule runs.
VCA_CONFIG = {
    "HOST_PORT": "8086:2950", "CARD_PORT": "8086:2953", "DMA_PORT": "8086:2952",
    "VCA0_DMA_BDF": "01:00.3", "VCA1_DMA_BDF": "01:00.4", "VCA_DRIVER_NAME": "plx87xx",
    "VCA0_CARD_IP": "172.31.1.1", "VCA0_HOST_IP": "172.31.1.254",
    "VCA1_CARD_IP": "172.31.2.1", "VCA1_HOST_IP": "172.31.2.254", "VCA_NET_MASK": "255.255.255.0",
    "VCA_ETH_RULE": "/lib/udev/rules.d/97-eth_up.rules", "VCA_MODPROBE_DEP_FILE": "/etc/modprobe.d/vca.conf",
    "VCA_ETH_SCRIPT": "/sbin/vca_eth_cfg.sh",
}
UNIT_DIRS = ("etc/systemd/system", "lib/systemd/system", "usr/lib/systemd/system")


def wanted(profile):
    """True when the profile installs Intel's node userspace (kernel.vca_userspace)."""
    return "vca_userspace" in profile["kernel"]


def config_text():
    """/etc/vca_config: shell, sourced by Intel's scripts."""
    return "#!/bin/bash\n# Intel VCA card-side configuration, written by vca-image before Intel's packages\n" + "".join(
        "export %s=%s\n" % (key, shlex.quote(value)) for key, value in VCA_CONFIG.items())


# depmod for every kernel in the tree, as postadd.sh's `depmod -a "$(ls /lib/modules/)"`:
# kernel.version is the .deb's version, which need not be the kernel release.
DEPMOD = ('set -e; found=; for dir in "$1"/lib/modules/*/; do release=$(basename "$dir"); '
          '[ "$release" != "*" ] || break; found=1; chroot "$1" depmod -a "$release"; done; '
          '[ -n "$found" ] || { echo "vca-image: no kernel under /lib/modules for depmod" >&2; exit 1; }')


def hooks(profile):
    """[(option, hook)] for mmdebstrap: /etc/vca_config before the packages (--essential-hook: after
    the Essential:yes packages, before the rest, Intel's among them), depmod and Intel's card-side
    setup after them (--customize-hook). mmdebstrap runs each as `sh -c HOOK exec ROOTFS`."""
    if not wanted(profile):
        return []
    write = "printf %%s %s > \"$1\"%s" % (shlex.quote(config_text()), CONFIG)
    return [("--essential-hook", write),
            ("--customize-hook", DEPMOD),
            ("--customize-hook", 'chroot "$1" /sbin/vca_setup.sh card')]


def inside(rootfs, path):
    """rootfs/path with each symbolic link on the way followed inside rootfs, an absolute target
    taken from rootfs as a chroot would (so /lib -> usr/lib works, and no check reads the build
    host's own /lib). The last component is followed too."""
    root = Path(rootfs)
    parts = [p for p in PurePosixPath(path).parts if p != "/"]
    current, hops = root, 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            current = current.parent if current != root else root
            continue
        candidate = current / part
        if candidate.is_symlink() and hops < 40:
            hops += 1
            target = os.readlink(candidate)
            parts = [p for p in PurePosixPath(target).parts if p != "/"] + parts
            if target.startswith("/"):
                current = root
            continue
        current = candidate
    return current


def read_config(rootfs):
    """The image's /etc/vca_config as KEY -> value (export KEY='value' lines), or None."""
    path = inside(rootfs, CONFIG)
    if not path.is_file():
        return None
    values = {}
    for line in path.read_text(errors="replace").splitlines():
        match = re.match(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line)
        if match:
            try:
                words = shlex.split(match.group(2), comments=True)
            except ValueError:
                continue
            values[match.group(1)] = words[0] if words else ""
    return values


def _unit_file(rootfs, unit):
    for directory in UNIT_DIRS:
        path = inside(rootfs, "%s/%s" % (directory, unit))
        if path.is_file():
            return path
    return None


def _enabled(rootfs, unit):
    system = inside(rootfs, "etc/systemd/system")
    return system.is_dir() and any(os.path.lexists(wants / unit) for wants in system.glob("*.wants"))


def check(profile, rootfs):
    """What Intel's card-side setup must have left in the image; [] when it did, else one line per
    problem: /etc/vca_config, the module order for the card (vca_csa, not the host's vca_mgr), the
    udev rule and the script it runs, and each agent unit there, with its program, and enabled."""
    if not wanted(profile):
        return []
    problems = []
    config = read_config(rootfs)
    if config is None:
        problems.append("no %s (Intel's scripts source it; vca-image writes it before the packages)" % CONFIG)
        config = {}
    paths = {key: config.get(key) or VCA_CONFIG[key]
             for key in ("VCA_MODPROBE_DEP_FILE", "VCA_ETH_RULE", "VCA_ETH_SCRIPT")}
    modprobe = inside(rootfs, paths["VCA_MODPROBE_DEP_FILE"])
    text = modprobe.read_text(errors="replace") if modprobe.is_file() else ""
    if not re.search(r"\bvca_csa\b", text) or re.search(r"\bvca_mgr\b", text):
        problems.append("%s is not the card side's module order (vca_csa, no vca_mgr): %s; `vca_setup.sh card` "
                        "did not run after the postinst's host-side setup"
                        % (paths["VCA_MODPROBE_DEP_FILE"], text.strip() or "missing"))
    rule = inside(rootfs, paths["VCA_ETH_RULE"])
    if not rule.is_file():
        problems.append("no %s (the node's VirtIO network comes up through it)" % paths["VCA_ETH_RULE"])
    elif paths["VCA_ETH_SCRIPT"] not in rule.read_text(errors="replace"):
        problems.append("%s does not run %s" % (paths["VCA_ETH_RULE"], paths["VCA_ETH_SCRIPT"]))
    if not inside(rootfs, paths["VCA_ETH_SCRIPT"]).is_file():
        problems.append("no %s (the script the udev rule runs)" % paths["VCA_ETH_SCRIPT"])
    for unit in profile["kernel"]["vca_userspace"]["agent_units"]:
        path = _unit_file(rootfs, unit)
        if path is None:
            problems.append("no unit file for %s (in /etc/systemd/system or /lib/systemd/system)" % unit)
            continue
        for line in path.read_text(errors="replace").splitlines():
            if line.strip().startswith("ExecStart="):
                words = line.strip()[len("ExecStart="):].lstrip("-@:+!").split()
                if words and words[0].startswith("/") and not inside(rootfs, words[0]).is_file():
                    problems.append("%s runs %s, which is not in the image" % (unit, words[0]))
        if not _enabled(rootfs, unit):
            problems.append("%s is not enabled (no link in /etc/systemd/system/*.wants)" % unit)
    return problems
