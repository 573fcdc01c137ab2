# SPDX-License-Identifier: MIT
"""Node sensors through vca_sysfs: coretemp, RAPL package energy and limits, throttle counters,
and the platform label (lab, hardware or unknown) from the VCA evidence found."""

from __future__ import annotations

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


def rapl_package_zones(sysfs):
    """Every package's powercap zone (package-0, package-1, ... on a machine of several sockets), found
    by name, in package order."""
    found = []
    for zone in sysfs.listdir(POWERCAP):
        if not zone.startswith("intel-rapl:") or zone.count(":") != 1:
            continue
        name = sysfs.read_optional("%s/%s/name" % (POWERCAP, zone)) or ""
        if name.startswith("package-") and name[len("package-"):].isdigit():
            found.append((int(name[len("package-"):]), "%s/%s" % (POWERCAP, zone)))
    return [zone for _, zone in sorted(found)]


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


LAB_MARKER = "vcasim"   # lab/sim/vcasim/tree.py SysfsTree.create() writes it at the tree's root
XEON_E3_1585L_V5 = "E3-1585L v5"
# Iris Pro P580 (SKL SRV GT4e): Linux i915_pciids.h INTEL_SKL_GT4_IDS, Intel compute-runtime's device table.
P580_PCI_ID = (0x8086, 0x193A)
# The PCI IDs plx87xx binds (plx_pci_tbl in modules/vca/plx87xx/plx_main.c, values in plx_hw.h, of
# Intel's VCA driver as published in OpenVisualCloud/VCAC-SW). tests/fixtures/vca-driver has none:
# its table is empty on purpose. The VCA's own Intel functions (card upstream 2953, node NT
# endpoints 2954-2956, CPU upstream 2958-295A) are the evidence; the PLX NT port IDs
# 87A0/87A1/87B0/87B1 are PLX's generic ones, found on other switches too, so they are listed
# as evidence but never prove a VCA on their own.
VCA_PCI_IDS = frozenset((0x8086, d) for d in (0x2953, 0x2954, 0x2955, 0x2956, 0x2958, 0x2959, 0x295A))
PLX_NT_PCI_IDS = frozenset((0x10B5, d) for d in (0x87A0, 0x87A1, 0x87B0, 0x87B1))
PCI_DEVICES = "bus/pci/devices"


def _pci_id(sysfs, dev):
    try:
        return (int(sysfs.read("%s/%s/vendor" % (PCI_DEVICES, dev)), 16),
                int(sysfs.read("%s/%s/device" % (PCI_DEVICES, dev)), 16))
    except (OSError, ValueError):
        return None


def cpu_model(proc_root="/proc"):
    """The first 'model name' of <proc_root>/cpuinfo, or None. sysfs has no stable place for it."""
    text = Sysfs(proc_root).read_optional("cpuinfo") or ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            return value.strip()
    return None


def platform_evidence(sysfs, proc_root="/proc"):
    """What the tree shows about the machine: the lab marker, /sys/class/vca, the CPU model,
    the P580, the VCA's PCI functions and PLX NT ports (as 'address vendor:device')."""
    p580, vca_pci, plx_nt = [], [], []
    for dev in sysfs.listdir(PCI_DEVICES):
        pci_id = _pci_id(sysfs, dev)
        if pci_id == P580_PCI_ID:
            p580.append(dev)
        elif pci_id in VCA_PCI_IDS:
            vca_pci.append("%s %04x:%04x" % (dev, *pci_id))
        elif pci_id in PLX_NT_PCI_IDS:
            plx_nt.append("%s %04x:%04x" % (dev, *pci_id))
    return {
        "lab_marker": sysfs.read_optional(LAB_MARKER),
        "class_vca": sysfs.exists("class/vca"),
        "cpu_model": cpu_model(proc_root),
        "p580": p580,
        "vca_pci": vca_pci,
        "plx_nt": plx_nt,
    }


def platform_label(evidence):
    """'lab', 'hardware' or 'unknown' from platform_evidence(); a coretemp driver alone proves nothing.

    The marker wins: nobody can create a file in the kernel's sysfs, so a tree that holds one is
    not it. /sys/class/vca alone is not enough: a VCA 1 node has it too, with another CPU and GPU.
    """
    if evidence["lab_marker"] is not None:
        return "lab"
    if evidence["vca_pci"]:
        return "hardware"
    node_cpu = XEON_E3_1585L_V5 in (evidence["cpu_model"] or "")
    if evidence["class_vca"] and (node_cpu or evidence["p580"]):
        return "hardware"
    return "unknown"


def platform(sysfs, proc_root="/proc"):
    return platform_label(platform_evidence(sysfs, proc_root))


def read_all(root="/sys", sample_seconds=1.0, proc_root="/proc"):
    sysfs = Sysfs(root)
    evidence = platform_evidence(sysfs, proc_root)
    temps = coretemp(sysfs)
    zone = rapl_package_zone(sysfs)
    cores = [v for k, v in temps.items() if k.startswith("Core")]
    result = {
        "platform": platform_label(evidence),
        "platform_evidence": evidence,
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
