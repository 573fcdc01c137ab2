# SPDX-License-Identifier: MIT
"""The one way vcafleet reads and writes sysfs: under a root, and never into danger.

Several plx87xx / plx87xx_dma / vop debugfs files that look read-only (0444)
start a DMA or inject an interrupt when read, and a plain directory walk of
debugfs has oopsed the host. So:

- every path is taken relative to a root (``vca_sysfs_root``, default /sys),
  which the lab points at the simulator's tree;
- nothing under debugfs is ever listed, and of the VCA drivers' debugfs files
  only a short allow-list of passive ones may be read;
- the known trigger files are refused by name anywhere, debugfs or not.
"""

from __future__ import annotations

import errno
import os

DEBUGFS = ("kernel", "debug")
VCA_DEBUGFS_DRIVERS = frozenset(("plx87xx", "plx87xx_dma", "vop"))
# Passive files: they format driver state and touch no hardware queue.
DEBUGFS_ALLOWED = frozenset(("msi_irq_info", "spad", "alm_state", "dma_reg", "desc_ring", "debug_trace"))
# Files that act when read (seed: SAFETY.md / GOTCHAS.md). Refused anywhere.
TRIGGER_FILES = frozenset(("intr_send", "memory_write", "memory_read", "issue_pending", "crash_me", "dma_test"))


class UnsafeSysfsPath(Exception):
    """A path that could act on the hardware when touched; nothing was read."""


class Sysfs(object):
    def __init__(self, root="/sys"):
        self.root = os.path.abspath(root or "/sys")

    def _parts(self, rel):
        parts = [p for p in str(rel).split("/") if p not in ("", ".")]
        if ".." in parts:
            raise UnsafeSysfsPath("%s: '..' is not allowed in a sysfs path" % rel)
        return parts

    def check(self, rel, listing=False):
        """Raise UnsafeSysfsPath unless reading (or listing) rel is safe; return the full path."""
        parts = self._parts(rel)
        full = os.path.join(self.root, *parts)
        real = os.path.realpath(full)
        real_root = os.path.realpath(self.root)
        real_parts = self._parts(os.path.relpath(real, real_root)) if real.startswith(real_root + os.sep) else parts
        for candidate in (parts, real_parts):
            name = candidate[-1] if candidate else ""
            if name in TRIGGER_FILES:
                raise UnsafeSysfsPath("%s: %s acts on the hardware when read; refused" % (rel, name))
            if tuple(candidate[:2]) == DEBUGFS or real.startswith("/sys/kernel/debug"):
                if listing:
                    raise UnsafeSysfsPath("%s: debugfs is never listed or walked; refused" % rel)
                if set(candidate) & VCA_DEBUGFS_DRIVERS and name not in DEBUGFS_ALLOWED:
                    raise UnsafeSysfsPath(
                        "%s: %s is not on the VCA debugfs allow-list (%s); refused"
                        % (rel, name, ", ".join(sorted(DEBUGFS_ALLOWED)))
                    )
        return full

    def exists(self, rel):
        return os.path.exists(self.check(rel))

    def read(self, rel):
        with open(self.check(rel)) as fh:
            return fh.read().strip()

    def read_int(self, rel):
        return int(self.read(rel))

    def read_optional(self, rel):
        """The stripped content, or None when the file is absent (a missing sensor is not 0)."""
        try:
            return self.read(rel)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.ENXIO):
                return None
            raise

    def listdir(self, rel):
        path = self.check(rel, listing=True)
        try:
            return sorted(os.listdir(path))
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                return []
            raise

    def write(self, rel, value):
        with open(self.check(rel), "w") as fh:
            fh.write("%s\n" % value)
