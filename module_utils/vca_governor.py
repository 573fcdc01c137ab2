# SPDX-License-Identifier: MIT
"""The CPU frequency governor of every CPU, through the cpufreq sysfs.

The node verifier wants `performance` on every CPU, so that a probe's figure is
not taken while the governor moves the clock under it. Every CPU is checked
before the first write, so a governor the driver does not offer changes nothing.
"""

from __future__ import annotations

import os
import sys

from .vca_sysfs import Sysfs

CPUS = "devices/system/cpu"


class GovernorError(Exception):
    """The governor could not be (or was not) set; the message names the node and the file."""


def cpufreq_dirs(sysfs):
    """(cpuN, its cpufreq directory) for every CPU that has one, in CPU order."""
    cpus = [c for c in sysfs.listdir(CPUS) if c.startswith("cpu") and c[3:].isdigit()]
    for cpu in sorted(cpus, key=lambda c: int(c[3:])):
        base = "%s/%s/cpufreq" % (CPUS, cpu)
        if sysfs.exists(base + "/scaling_governor"):
            yield cpu, base


def plan(sysfs, want, node="this node"):
    """[(cpu, file, before)] of the CPUs not running want; everything is checked first."""
    found = list(cpufreq_dirs(sysfs))
    if not found:
        raise GovernorError("%s: no CPU has cpufreq under %s/%s" % (node, sysfs.root, CPUS))
    changes, problems = [], []
    for cpu, base in found:
        offered = (sysfs.read_optional(base + "/scaling_available_governors") or "").split()
        if offered and want not in offered:
            problems.append("%s: %s offers %s, not %s (%s)" % (node, cpu, ", ".join(offered), want,
                                                             os.path.join(sysfs.root, base)))
            continue
        before = sysfs.read(base + "/scaling_governor")
        if before != want:
            changes.append((cpu, base + "/scaling_governor", before))
    if problems:
        raise GovernorError("; ".join(problems))
    return changes


def apply(sysfs, changes, want, node="this node"):
    for _, rel, _ in changes:
        try:
            sysfs.write(rel, want)
        except OSError as exc:
            raise GovernorError("%s: writing %s failed: %s" % (node, os.path.join(sysfs.root, rel), exc)) from exc
        held = sysfs.read_optional(rel)
        if held != want:
            raise GovernorError("%s: wrote %s to %s but it reads back %s"
                                % (node, want, os.path.join(sysfs.root, rel), held))


def governors(sysfs):
    """{cpuN: governor} as they are now."""
    return {cpu: sysfs.read(base + "/scaling_governor") for cpu, base in cpufreq_dirs(sysfs)}


def main(argv=None):
    """Boot unit: vca_governor GOVERNOR [SYSFS_ROOT]."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python3 -m vcafleet_node.vca_governor GOVERNOR [SYSFS_ROOT]\n")
        return 2
    want, sysfs = argv[0], Sysfs(argv[1] if len(argv) > 1 else "/sys")
    try:
        changes = plan(sysfs, want)
        apply(sysfs, changes, want)
    except (GovernorError, OSError) as exc:
        sys.stderr.write("vca-governor: %s\n" % exc)
        return 1
    for cpu, _, before in changes:
        sys.stdout.write("%s: %s -> %s\n" % (cpu, before, want))
    sys.stdout.write("every CPU runs %s\n" % want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
