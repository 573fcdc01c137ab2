# SPDX-License-Identifier: MIT
"""Mitogen's linear strategy (the mitogen package, requirements.txt): one Python interpreter per
machine for the whole run instead of one per task, which is most of a no-change run's time (issue
30, docs/LAB.md).

Two changes on the way in. Mitogen pins its processes to CPUs: on a machine of 2 or 3 it keeps CPU 0
for its connection multiplexer and puts the controller, every task's worker and ssh on CPU 1, so
the controller's own work (most of a no-change run) gets one core and the machine idles a third
of the time; there, its processes are left unpinned.

And mitogen finds the module_utils a module needs by reading its imports, and
skips relative ones. Ours import each other relatively (`from .vca_sysfs import Sysfs`), because
the same files run on the nodes as plain packages (roles/power_cap/files/vcafleet_hw), so a
module whose module_utils import another failed with ModuleNotFoundError on the target."""

from __future__ import annotations

import os

import mitogen.imports
from ansible_mitogen import affinity, module_finder
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule  # noqa: F401

_walk_imports = module_finder.walk_imports


def relative_imports(code):
    """Absolute names of the module-level `from .a.b import c` imports in code, compiled (as mitogen
    compiles it) with the module's dotted name as its file name, each package on the way named too.
    The code does not say whether it is a package's __init__ (where `.` is the package itself) or a
    module (where it is the module's package): both are named, and the one that does not exist is
    not found."""
    here = code.co_filename
    for level, name, fromlist in mitogen.imports.codeobj_imports(code):
        if level <= 0:
            continue
        for base in dict.fromkeys((here.rsplit(".", level)[0], here.rsplit(".", level - 1)[0] if level > 1 else here)):
            parts = name.split(".") if name else []
            for i in range(1, len(parts) + 1):
                yield ".".join([base, *parts[:i]])
            full = ".".join([base, *parts])
            for leaf in fromlist:
                yield f"{full}.{leaf}"


def walk_imports(code, prefix=None):
    yield from _walk_imports(code, prefix)
    yield from (name for name in relative_imports(code) if name.startswith(prefix or ""))


module_finder.walk_imports = walk_imports


def affinity_policy(cpu_count):
    """Mitogen's CPU pinning where it leaves the controller more than one core (4 CPUs and more),
    none below."""
    return affinity.policy if cpu_count >= 4 else affinity.Policy()


affinity.policy = affinity_policy(len(os.sched_getaffinity(0)))   # the CPUs this run may use
