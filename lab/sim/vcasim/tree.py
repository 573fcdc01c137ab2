"""The simulated sysfs tree of one node: coretemp hwmon, intel-rapl, throttle counters.

Layout and units match the kernel's (millidegrees C, microjoules, microwatts,
microseconds). The simulator owns the sensor files; the limit files
(constraint_*_power_limit_uw, *_time_window_us, enabled) belong to whoever
configures the node, and are only created when missing.
"""

from __future__ import annotations

import os
from pathlib import Path

from .model import Limits, NodeModel
from .rapl import quantize_power_uw, quantize_window_us

RAPL = "class/powercap/intel-rapl:0"
HWMON_OTHER = "class/hwmon/hwmon0"   # a non-coretemp sensor first, so readers must match by name
HWMON_CORETEMP = "class/hwmon/hwmon1"


def _write(path: Path, value: str) -> None:
    """Replace a file's content atomically so a reader never sees half a value."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(f"{value}\n", encoding="ascii")
    os.replace(tmp, path)


def _ensure(path: Path, value: str) -> None:
    if not path.exists():
        _write(path, value)


class SysfsTree:
    def __init__(self, root: str | Path, node: dict):
        self.root = Path(root)
        self.node = node
        self.rapl = self.root / RAPL
        self.coretemp = self.root / HWMON_CORETEMP
        self.cpus = node["cores"] * node["threads_per_core"]
        self._held: dict[Path, int] = {}   # limit file -> the value RAPL holds for it

    def create(self) -> None:
        n = self.node
        # The marker vca_sensors.platform() labels 'lab' by; the kernel's sysfs can never hold it.
        self.root.mkdir(parents=True, exist_ok=True)
        _write(self.root / "vcasim", "vcafleet lab/sim: a simulated sysfs tree, not hardware")
        other = self.root / HWMON_OTHER
        other.mkdir(parents=True, exist_ok=True)
        _ensure(other / "name", "acpitz")
        _ensure(other / "temp1_input", "27800")

        self.coretemp.mkdir(parents=True, exist_ok=True)
        _ensure(self.coretemp / "name", "coretemp")
        crit = int(n["tjmax_c"] * 1000)
        labels = ["Package id 0"] + [f"Core {i}" for i in range(n["cores"])]
        for idx, label in enumerate(labels, start=1):
            _ensure(self.coretemp / f"temp{idx}_label", label)
            _ensure(self.coretemp / f"temp{idx}_crit", str(crit))
            _ensure(self.coretemp / f"temp{idx}_input", "35000")

        self.rapl.mkdir(parents=True, exist_ok=True)
        _ensure(self.rapl / "name", "package-0")
        _ensure(self.rapl / "enabled", "1")
        _ensure(self.rapl / "energy_uj", "0")
        _ensure(self.rapl / "max_energy_range_uj", str(n["max_energy_range_uj"]))
        for idx, name, watts, window, max_w in (
            (0, "long_term", n["pl1_stock_w"], n["pl1_window_s"], n["pl1_stock_w"]),
            (1, "short_term", n["pl2_stock_w"], n["pl2_window_s"], n["pl2_stock_w"]),
        ):
            _ensure(self.rapl / f"constraint_{idx}_name", name)
            _ensure(self.rapl / f"constraint_{idx}_power_limit_uw", str(int(watts * 1e6)))
            _ensure(self.rapl / f"constraint_{idx}_time_window_us", str(int(window * 1e6)))
            _ensure(self.rapl / f"constraint_{idx}_max_power_uw", str(int(max_w * 1e6)))

        for cpu in range(self.cpus):
            base = self.root / f"devices/system/cpu/cpu{cpu}"
            (base / "thermal_throttle").mkdir(parents=True, exist_ok=True)
            (base / "topology").mkdir(parents=True, exist_ok=True)
            _ensure(base / "thermal_throttle/core_throttle_count", "0")
            _ensure(base / "thermal_throttle/package_throttle_count", "0")
            _ensure(base / "topology/core_id", str(cpu % n["cores"]))
            _ensure(base / "topology/physical_package_id", "0")
            # cpufreq as intel_pstate offers it; the firmware's default is powersave.
            (base / "cpufreq").mkdir(exist_ok=True)
            _ensure(base / "cpufreq/scaling_driver", "intel_pstate")
            _ensure(base / "cpufreq/scaling_available_governors", "performance powersave")
            _ensure(base / "cpufreq/scaling_governor", "powersave")

    def read_limits(self) -> Limits:
        """The limits in force, found by constraint name as the kernel exposes them.

        A value written that RAPL cannot hold is stored as RAPL would store it,
        and the file then reads back that value, as the kernel's would. What a
        file holds when first read is the firmware's, already in RAPL's steps.
        """
        by_name = {}
        for idx in (0, 1):
            name = (self.rapl / f"constraint_{idx}_name").read_text().strip()
            by_name[name] = idx
        quantize = {
            "power_limit_uw": lambda v: quantize_power_uw(v, self.node["rapl_power_unit_bits"]),
            "time_window_us": lambda v: quantize_window_us(v, self.node["rapl_time_unit_bits"]),
        }

        def value(name: str, field: str) -> int:
            path = self.rapl / f"constraint_{by_name[name]}_{field}"
            written = int(path.read_text())
            if self._held.setdefault(path, written) == written:
                return written
            stored = self._held[path] = quantize[field](written)
            if stored != written:
                _write(path, str(stored))
            return stored

        return Limits(
            pl1_w=value("long_term", "power_limit_uw") / 1e6,
            pl2_w=value("short_term", "power_limit_uw") / 1e6,
            pl1_window_s=value("long_term", "time_window_us") / 1e6,
            enabled=(self.rapl / "enabled").read_text().strip() == "1",
        )

    def publish(self, model: NodeModel) -> None:
        _write(self.rapl / "energy_uj", str(model.energy_uj))
        temps = model.core_temps_c()
        _write(self.coretemp / "temp1_input", str(round(max(temps) * 1000)))
        for i, t in enumerate(temps):
            _write(self.coretemp / f"temp{i + 2}_input", str(round(t * 1000)))
        for cpu in range(self.cpus):
            tt = self.root / f"devices/system/cpu/cpu{cpu}/thermal_throttle"
            _write(tt / "core_throttle_count", str(model.core_events[cpu % self.node["cores"]]))
            _write(tt / "package_throttle_count", str(model.package_events))

    def restore(self, model: NodeModel) -> None:
        """Continue the counters from the files after a restart, as a running kernel would."""
        model.energy_uj = int((self.rapl / "energy_uj").read_text())
        for core in range(self.node["cores"]):
            path = self.root / f"devices/system/cpu/cpu{core}/thermal_throttle/core_throttle_count"
            model.core_events[core] = int(path.read_text())
        model.package_events = int(
            (self.root / "devices/system/cpu/cpu0/thermal_throttle/package_throttle_count").read_text()
        )
