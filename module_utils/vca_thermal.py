# SPDX-License-Identifier: MIT
"""The thermal guard every probe that loads a node runs under.

One node of the seed fleet was lost to heat under sustained load, so a probe
samples the hottest core while it runs and stops before it reaches the limit
(default 90 C). A stopped probe reports `aborted: thermal` and the
temperature seen, never a figure.

It fails closed: without a coretemp sensor the guard is blind, and outside the
lab a blind probe does not run unless the caller says so (allow_no_sensor).
"""

from __future__ import annotations

import threading

from .vca_sensors import coretemp
from .vca_sensors import platform as find_platform
from .vca_sysfs import Sysfs

DEFAULT_LIMIT_C = 90.0


class NoThermalSensor(Exception):
    def __init__(self, platform):
        Exception.__init__(self, "no coretemp sensor on a %s platform: the probe does not run without the "
                                 "thermal guard (allow_no_sensor overrides)" % platform)
        self.platform = platform


# Where a node that runs hot is sent: the seeds' printed 120 mm shroud took card 0 from 92-94 C to 75-79 C.
COOLING_POINTER = "cooling: a fan shroud, shrouds/README.md (docs/SETUP.md, Cooling)"


class ThermalAbort(Exception):
    def __init__(self, temperature_c, limit_c):
        Exception.__init__(self, "hottest core reached %.1f C (limit %.1f C); %s"
                           % (temperature_c, limit_c, COOLING_POINTER))
        self.temperature_c = temperature_c
        self.limit_c = limit_c


def hottest_core_c(sysfs):
    """The hottest coretemp reading (cores and package), or None without a coretemp sensor."""
    temps = coretemp(sysfs)
    return max(temps.values()) if temps else None


class ThermalGuard(object):
    """Context manager: samples in a thread; check() raises ThermalAbort once tripped, and
    NoThermalSensor once a sensor is found missing where the probe may not run blind.

    Probes call check() between timed runs; a run already in flight finishes,
    so the limit should sit a few degrees under the throttle point.
    """

    def __init__(self, sysfs_root="/sys", limit_c=DEFAULT_LIMIT_C, interval_s=0.5, read=None, *,
                 platform=None, allow_no_sensor=False):
        """platform: vca_sensors.platform() of the machine, looked up under sysfs_root only when
        a sensor is missing and it was not given."""
        self.limit_c = float(limit_c)
        self.interval_s = interval_s
        self.sysfs_root = sysfs_root
        self._read = read or (lambda: hottest_core_c(Sysfs(sysfs_root)))
        self.platform = platform
        self.allow_no_sensor = bool(allow_no_sensor)
        self.max_seen_c = None
        self.samples = 0
        self.tripped_at_c = None
        self.sensor = "coretemp"
        self.blind = False
        self._stop = threading.Event()
        self._thread = None

    def sample(self):
        t = self._read()
        if t is None:
            self.sensor = "absent"
            if not self.may_run_blind():
                self.blind = True
            return None
        self.samples += 1
        self.max_seen_c = t if self.max_seen_c is None else max(self.max_seen_c, t)
        if t >= self.limit_c and self.tripped_at_c is None:
            self.tripped_at_c = t
        return t

    def may_run_blind(self):
        if self.allow_no_sensor:
            return True
        if self.platform is None:
            self.platform = find_platform(Sysfs(self.sysfs_root))
        return self.platform == "lab"

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self):
        self.sample()
        self.check()   # before the thread: __exit__ does not run when __enter__ raises
        self._thread = threading.Thread(target=self._loop, name="vca-thermal-guard", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return False

    def check(self):
        if self.blind:
            raise NoThermalSensor(self.platform)
        if self.tripped_at_c is not None:
            raise ThermalAbort(self.tripped_at_c, self.limit_c)

    def record(self):
        return {"limit_c": self.limit_c, "max_seen_c": self.max_seen_c, "samples": self.samples,
                "sensor": self.sensor, "allow_no_sensor": self.allow_no_sensor}
