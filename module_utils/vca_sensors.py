# SPDX-License-Identifier: MIT
"""Node sensors through vca_sysfs: coretemp, RAPL package energy and limits, throttle counters."""

from __future__ import annotations

import os
import time

from .vca_sysfs import Sysfs

POWERCAP = "class/powercap"
HWMON = "class/hwmon"
CPUS = "devices/system/cpu"


def coretemp_dirs(sysfs):
    """(hwmonN, path) of every hwmon whose name is coretemp: matched by name, never by number."""
    for hw in sysfs.listdir(HWMON):
        base = "%s/%s" % (HWMON, hw)
        if sysfs.read_optional(base + "/name") == "coretemp":
            yield hw, base


def coretemp(sysfs):
    """{label: degrees C} from every hwmon whose name is coretemp; hwmonN numbers move across boots.

    A label seen twice (two coretemp devices on a multi-package host) gets the
    hwmon directory as a suffix rather than silently overwriting the first.
    """
    temps = {}
    for hw, base in coretemp_dirs(sysfs):
        for entry in sysfs.listdir(base):
            if not (entry.startswith("temp") and entry.endswith("_input")):
                continue
            idx = entry[len("temp"):-len("_input")]
            label = sysfs.read_optional("%s/temp%s_label" % (base, idx)) or "temp%s" % idx
            value = sysfs.read_optional("%s/%s" % (base, entry))
            if value is None:
                continue
            key = label if label not in temps else "%s (%s)" % (label, hw)
            temps[key] = int(value) / 1000.0
    return temps


def rapl_package_zone(sysfs):
    """The powercap zone of package 0, found by its name (package-0), never by index."""
    for zone in sysfs.listdir(POWERCAP):
        if not zone.startswith("intel-rapl:") or zone.count(":") != 1:
            continue
        if sysfs.read_optional("%s/%s/name" % (POWERCAP, zone)) == "package-0":
            return "%s/%s" % (POWERCAP, zone)
    return None


def constraints(sysfs, zone):
    """{constraint name: {index, power_limit_uw, time_window_us, max_power_uw}} of a zone."""
    found = {}
    for entry in sysfs.listdir(zone):
        if not (entry.startswith("constraint_") and entry.endswith("_name")):
            continue
        idx = entry[len("constraint_"):-len("_name")]
        name = sysfs.read("%s/%s" % (zone, entry))
        item = {"index": int(idx)}
        for field in ("power_limit_uw", "time_window_us", "max_power_uw"):
            value = sysfs.read_optional("%s/constraint_%s_%s" % (zone, idx, field))
            item[field] = int(value) if value not in (None, "") else None
        found[name] = item
    return found


def energy_delta_uj(before, after, max_range_uj):
    """Energy between two counter readings; a wrap at max_energy_range_uj is not a negative spike."""
    return (after - before) % max_range_uj


def package_power_w(sysfs, zone, seconds=1.0, clock=time.monotonic, sleep=time.sleep):
    max_range = sysfs.read_int(zone + "/max_energy_range_uj")
    e0, t0 = sysfs.read_int(zone + "/energy_uj"), clock()
    sleep(seconds)
    e1, t1 = sysfs.read_int(zone + "/energy_uj"), clock()
    if t1 <= t0:
        return None
    return energy_delta_uj(e0, e1, max_range) / (t1 - t0) / 1e6


def throttle_counts(sysfs):
    """Throttle counters deduplicated by topology: one per physical core, one per package.

    Hyper-thread siblings report the same core counter; a package counter may be
    missing on some CPUs and is then absent, not zero.
    """
    cores, packages = {}, {}
    for cpu in sysfs.listdir(CPUS):
        if not (cpu.startswith("cpu") and cpu[3:].isdigit()):
            continue
        base = "%s/%s" % (CPUS, cpu)
        pkg = sysfs.read_optional(base + "/topology/physical_package_id") or "0"
        core = sysfs.read_optional(base + "/topology/core_id") or cpu[3:]
        core_count = sysfs.read_optional(base + "/thermal_throttle/core_throttle_count")
        if core_count is not None:
            cores.setdefault("%s:%s" % (pkg, core), int(core_count))
        pkg_count = sysfs.read_optional(base + "/thermal_throttle/package_throttle_count")
        if pkg_count is not None:
            packages.setdefault(pkg, int(pkg_count))
    return {"core": cores, "package": packages}


def platform(sysfs):
    """'hardware' only when a real coretemp driver backs the sensors; the lab tree has none."""
    for _, base in coretemp_dirs(sysfs):
        driver = os.path.join(sysfs.root, base, "device", "driver")
        if os.path.islink(driver) and os.path.basename(os.readlink(driver)) == "coretemp":
            return "hardware"
    return "lab"


def read_all(root="/sys", sample_seconds=1.0):
    sysfs = Sysfs(root)
    temps = coretemp(sysfs)
    zone = rapl_package_zone(sysfs)
    cores = [v for k, v in temps.items() if k.startswith("Core")]
    result = {
        "platform": platform(sysfs),
        "sysfs_root": sysfs.root,
        "temperatures_c": temps,
        "package_temp_c": temps.get("Package id 0"),
        "hottest_core_c": max(cores) if cores else None,
        "package_power_w": None,
        "limits": {},
        "rapl_enabled": None,
        "throttle": throttle_counts(sysfs),
    }
    if zone:
        result["rapl_enabled"] = sysfs.read_optional(zone + "/enabled") == "1"
        for name, c in constraints(sysfs, zone).items():
            result["limits"][name] = {
                "power_limit_w": c["power_limit_uw"] / 1e6 if c["power_limit_uw"] is not None else None,
                "time_window_s": c["time_window_us"] / 1e6 if c["time_window_us"] is not None else None,
            }
        if sample_seconds > 0:
            power = package_power_w(sysfs, zone, sample_seconds)
            result["package_power_w"] = round(power, 2) if power is not None else None
    return result
