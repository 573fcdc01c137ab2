# SPDX-License-Identifier: MIT
"""RAPL PL1/PL2 through the powercap sysfs: plan, validate, apply, restore stock.

PL1 is the constraint named long_term and PL2 the one named short_term; their
indexes differ between kernels, so they are always found by name. Everything
is validated before the first write, so a bad value changes nothing.
"""

from __future__ import annotations

import errno
import json
import os
import sys

from .vca_sensors import constraints, rapl_package_zone
from .vca_sysfs import Sysfs

LIMITS = (("pl1", "long_term"), ("pl2", "short_term"))
FIELDS = (("w", "power_limit_uw", 1e6), ("window_s", "time_window_us", 1e6))
MIN_POWER_UW = 1000000
# RAPL holds a limit in the steps of MSR_RAPL_POWER_UNIT (0xA0E03 on Skylake, the
# E3-1585L v5 included): power in 1/8 W, windows as 2^Y * (1 + F/4) units of
# 1/1024 s. A value written reads back rounded down to a step, so the wanted
# value is in force when what is held is at most one step below it, never above.
POWER_STEP_UW = 125000
TIME_UNIT_US = 976


def step(field, wanted_value):
    """How far below wanted_value RAPL may hold it, in the field's micro-units: one power step;
    for a window one F step at its magnitude plus the time unit the kernel truncates to."""
    if field == "power_limit_uw":
        return POWER_STEP_UW
    units = max(int(wanted_value) // TIME_UNIT_US, 1)
    return (1 << (units.bit_length() - 1)) * TIME_UNIT_US // 4 + TIME_UNIT_US


def in_force(field, actual, wanted_value):
    return actual is not None and 0 <= wanted_value - actual < step(field, wanted_value)


class PowerCapError(Exception):
    """The caps could not be (or were not) applied; the message names node and file."""


def wanted(pl1_w=None, pl2_w=None, pl1_window_s=None, pl2_window_s=None):
    """{constraint name: {sysfs field: micro-units}} of the values asked for; None is left out."""
    given = {"pl1_w": pl1_w, "pl2_w": pl2_w, "pl1_window_s": pl1_window_s, "pl2_window_s": pl2_window_s}
    result = {}
    for short, name in LIMITS:
        for suffix, field, scale in FIELDS:
            value = given["%s_%s" % (short, suffix)]
            if value is not None:
                result.setdefault(name, {})[field] = round(float(value) * scale)
    return result


def fmt_value(field, micro):
    if micro is None:
        return "absent"
    if field == "power_limit_uw":
        return "%g W" % (micro / 1e6)
    return "%g s" % (micro / 1e6)


class PowerCap(object):
    def __init__(self, sysfs, node="this node"):
        self.sysfs = sysfs
        self.node = node
        self.zone = rapl_package_zone(sysfs)
        if self.zone is None:
            raise PowerCapError("%s: no RAPL package-0 zone under %s/class/powercap" % (node, sysfs.root))
        self.constraints = constraints(sysfs, self.zone)

    def path(self, name, field):
        return "%s/constraint_%d_%s" % (self.zone, self.constraints[name]["index"], field)

    def current(self):
        """{constraint name: {field: micro-units}} for PL1 and PL2 as they are now."""
        return {
            name: {field: self.constraints[name][field] for _, field, _ in FIELDS}
            for _, name in LIMITS
            if name in self.constraints
        }

    def validate(self, want):
        """Every problem with the wanted values, as messages; an empty list means they may be written."""
        problems = []
        for name, fields in sorted(want.items()):
            if name not in self.constraints:
                problems.append("%s: %s has no constraint named %s (found: %s)"
                                % (self.node, self.zone, name, ", ".join(sorted(self.constraints)) or "none"))
                continue
            power = fields.get("power_limit_uw")
            if power is not None:
                top = self.constraints[name]["max_power_uw"]
                if power < MIN_POWER_UW or (top and power > top):
                    problems.append("%s: %s %s out of range [1 W, %s] (%s)"
                                    % (self.node, name, fmt_value("power_limit_uw", power),
                                       fmt_value("power_limit_uw", top) if top else "no max_power_uw",
                                       self.path(name, "max_power_uw")))
            window = fields.get("time_window_us")
            if window is not None and window <= 0:
                problems.append("%s: %s time window must be positive, got %s"
                                % (self.node, name, fmt_value("time_window_us", window)))
        pl1, pl2 = (want.get(name, {}).get("power_limit_uw") or self.constraints.get(name, {}).get("power_limit_uw")
                    for _, name in LIMITS)
        if want and pl1 and pl2 and pl2 < pl1:
            problems.append("%s: PL2 %s is below PL1 %s"
                            % (self.node, fmt_value("power_limit_uw", pl2), fmt_value("power_limit_uw", pl1)))
        return problems

    def plan(self, want):
        """The writes that would bring the zone to want: [(name, field, before, after)]."""
        problems = self.validate(want)
        if problems:
            raise PowerCapError("; ".join(problems))
        changes = []
        for name, fields in sorted(want.items()):
            for field, after in sorted(fields.items()):
                before = self.constraints[name][field]
                if not in_force(field, before, after):
                    changes.append((name, field, before, after))
        if changes:
            enabled_file = self.zone + "/enabled"
            if self.sysfs.read_optional(enabled_file) == "0":
                raise PowerCapError("%s: RAPL limits are locked: %s reads 0"
                                    % (self.node, os.path.join(self.sysfs.root, enabled_file)))
        return changes

    def apply(self, changes):
        for name, field, _, after in changes:
            rel = self.path(name, field)
            try:
                self.sysfs.write(rel, after)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EPERM):
                    raise PowerCapError("%s: RAPL limit is locked: writing %s gave %s"
                                        % (self.node, os.path.join(self.sysfs.root, rel),
                                           errno.errorcode[exc.errno])) from exc
                raise PowerCapError("%s: writing %s failed: %s"
                                    % (self.node, os.path.join(self.sysfs.root, rel), exc)) from exc
            held = self.sysfs.read_optional(rel)
            if held is None or not held.isdigit() or not in_force(field, int(held), after):
                raise PowerCapError("%s: wrote %s to %s but it reads back %s"
                                    % (self.node, fmt_value(field, after), os.path.join(self.sysfs.root, rel),
                                       held if held is not None else "nothing"))
            self.constraints[name][field] = int(held)


def describe(limits):
    """One line per constraint in watts and seconds, for --diff."""
    lines = []
    for short, name in LIMITS:
        if name in limits:
            lines.append("%s (%s): %s, window %s\n" % (short.upper(), name,
                                                      fmt_value("power_limit_uw", limits[name].get("power_limit_uw")),
                                                      fmt_value("time_window_us", limits[name].get("time_window_us"))))
    return "".join(lines)


def load_stock(path):
    """The limits recorded before vcafleet first wrote any, or None."""
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def save_stock(path, limits):
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(limits, fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)


def apply_config(path):
    """Boot-time re-application of the caps the role wrote to path (JSON: node, sysfs_root, limits)."""
    with open(path) as fh:
        config = json.load(fh)
    cap = PowerCap(Sysfs(config.get("sysfs_root", "/sys")), config.get("node", "this node"))
    changes = cap.plan(config.get("limits", {}))
    cap.apply(changes)
    return cap, changes


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    path = argv[0] if argv else "/etc/vcafleet/power-cap.json"
    try:
        cap, changes = apply_config(path)
    except (PowerCapError, OSError, ValueError) as exc:
        sys.stderr.write("vca-power-cap: %s\n" % exc)
        return 1
    for name, field, before, after in changes:
        sys.stdout.write("%s %s: %s -> %s\n" % (name, field, fmt_value(field, before), fmt_value(field, after)))
    sys.stdout.write("in force:\n" + describe(cap.current()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
