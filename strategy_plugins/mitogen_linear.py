# SPDX-License-Identifier: MIT
"""Mitogen's linear strategy (the mitogen package, requirements.txt): one Python interpreter per
machine for the whole run instead of one per task, which is most of a no-change run's time (issue
30, docs/LAB.md).

One fix on the way in: mitogen finds the module_utils a module needs by reading its imports, and
skips relative ones. Ours import each other relatively (`from .vca_sysfs import Sysfs`), because
the same files run on the nodes as plain packages (roles/power_cap/files/vcafleet_hw), so a
module whose module_utils import another failed with ModuleNotFoundError on the target."""

from __future__ import annotations

import mitogen.imports
from ansible_mitogen import module_finder
from ansible_mitogen.plugins.strategy.mitogen_linear import StrategyModule  # noqa: F401

_walk_imports = module_finder.walk_imports


def relative_imports(code):
    """Absolute names of the module-level `from .a import b` imports in code, compiled (as mitogen
    compiles it) with the module's dotted name as its file name."""
    for level, name, fromlist in mitogen.imports.codeobj_imports(code):
        if level <= 0:
            continue
        base = code.co_filename.rsplit(".", level)[0]
        full = f"{base}.{name}" if name else base
        yield full
        for leaf in fromlist:
            yield f"{full}.{leaf}"


def walk_imports(code, prefix=None):
    yield from _walk_imports(code, prefix)
    yield from (name for name in relative_imports(code) if name.startswith(prefix or ""))


module_finder.walk_imports = walk_imports
