"""The agent: a node's (or the host's) sensors in the Prometheus text format.

Everything is read through the same safe sysfs reader as vcafleet's Ansible
modules (vcamon.hw, links to module_utils/): allow-listed paths only, debugfs
never walked. A missing sensor is left out of the output (and
vcamon_sensor_present says so), never reported as 0.

However often it is asked, the agent runs `vcactl status` (on the host, as
root) and decides its platform at most once per sample interval: both are
cached with the time they were read.

Given a token (--token-file), it answers only requests that carry it as
``Authorization: Bearer <token>``; any other gets 401 and no figure.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from .auth import bearer, check_token, same
from .hw.vca_sensors import constraints, coretemp, energy_delta_uj, rapl_package_zone, read_all, throttle_counts
from .hw.vca_sysfs import Sysfs
from .hw.vcactl import STATES as VCA_STATES
from .hw.vcactl import parse_status
from .net import bind_address, is_loopback
from .store import PLATFORMS

LOG = logging.getLogger("vcamon.agent")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_LISTEN = "127.0.0.1:9478"


class TimedCache:
    """A value read at most once per interval (on clock), however many threads ask for it.

    The value is kept with the time it was read; a reader that finds it older
    than the interval reads it again, under a lock, so a burst of requests at a
    stale moment still reads once. A failed read (None) is cached too.
    """

    def __init__(self, read, interval, clock=time.monotonic):
        self.read = read
        self.interval = float(interval)
        self.clock = clock
        self.lock = threading.Lock()
        self.value = None
        self.read_at = None

    def get(self):
        with self.lock:
            now = self.clock()
            if self.read_at is None or not 0 <= now - self.read_at < self.interval:
                self.value = self.read()
                self.read_at = now
            return self.value


class PowerMeter:
    """Package watts from successive RAPL energy readings; a counter wrap is not a negative spike."""

    def __init__(self):
        self.last = None
        self.watts = None

    def update(self, energy_uj, max_range_uj, t):
        if self.last is not None and t > self.last[1]:
            self.watts = energy_delta_uj(self.last[0], energy_uj, max_range_uj) / (t - self.last[1]) / 1e6
        self.last = (energy_uj, t)
        return self.watts


class Sensors:
    """One reading of a node: temperatures, package power, limits, throttle counters, vcactl states."""

    def __init__(self, sysfs_root="/sys", vcactl=None, clock=time.monotonic, sample_interval=5.0, *,
                 filesystems=("/",), units=()):
        self.sysfs = Sysfs(sysfs_root)
        self.units = tuple(units)
        self._units = TimedCache(self._run_systemctl, sample_interval, clock)
        self.filesystems = tuple(filesystems)
        self.vcactl = vcactl
        self.clock = clock
        self.meter = PowerMeter()
        self.lock = threading.Lock()
        self._vca = TimedCache(self._run_vcactl, sample_interval, clock)
        self._platform = TimedCache(self._read_platform, sample_interval, clock)

    def sample_energy(self):
        """Take one energy reading; the sampler thread calls this every few seconds."""
        zone = rapl_package_zone(self.sysfs)
        if zone is None:
            return None
        energy = self.sysfs.read_optional(zone + "/energy_uj")
        top = self.sysfs.read_optional(zone + "/max_energy_range_uj")
        if energy is None or top is None:
            return None
        with self.lock:
            return self.meter.update(int(energy), int(top), self.clock())

    def free_space(self):
        """{mountpoint: (bytes free to unprivileged users, size)}; a path that is not there is left out."""
        out = {}
        for path in self.filesystems:
            try:
                st = os.statvfs(path)
            except OSError:
                continue
            out[path] = (st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize)
        return out

    def vca_states(self):
        """vcactl status per node (host only), read at most once per sample interval."""
        if not self.vcactl:
            return None
        return self._vca.get()

    def platform(self):
        """hardware | lab | unknown, as the sensors reader decides it (read_all()["platform"])."""
        return self._platform.get()

    def _read_platform(self):
        try:
            value = read_all(self.sysfs.root, sample_seconds=0)["platform"]
        except Exception as exc:  # a reader that cannot decide says so; it does not stop the agent
            LOG.warning("deciding the platform failed: %s", exc)
            return "unknown"
        return value if value in PLATFORMS else "unknown"

    def _run_vcactl(self):
        try:
            out = subprocess.run([self.vcactl, "status"], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            LOG.warning("vcactl status failed: %s", exc)
            return None
        return parse_status(out.stdout)

    def unit_states(self):
        """{unit: ActiveState} of the services matching the unit patterns, read at most once per interval."""
        if not self.units:
            return None
        return self._units.get()

    def _run_systemctl(self):
        try:
            out = subprocess.run(["systemctl", "list-units", "--type=service", "--all", "--plain", "--no-legend",
                                  "--no-pager", *self.units], capture_output=True, text=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            LOG.warning("systemctl list-units failed: %s", exc)
            return None
        return parse_units(out.stdout)

    def read(self):
        zone = rapl_package_zone(self.sysfs)
        limits = constraints(self.sysfs, zone) if zone else {}
        with self.lock:
            watts = self.meter.watts
        return {
            "temps": coretemp(self.sysfs),
            "power_w": watts if zone else None,
            "limits": limits,
            "rapl_enabled": (self.sysfs.read_optional(zone + "/enabled") == "1") if zone else None,
            "throttle": throttle_counts(self.sysfs),
            "vca": self.vca_states(),
            "platform": self.platform(),
            "filesystems": self.free_space(),
            "units": self.unit_states(),
        }


def parse_units(text):
    """`systemctl list-units --plain --no-legend` into {unit: ActiveState}; units not loaded are left out."""
    states = {}
    for line in text.splitlines():
        parts = line.split(None, 4)
        if len(parts) >= 4 and parts[0].endswith(".service") and parts[1] == "loaded":
            states[parts[0]] = parts[2]
    return states


def _limit_families(limits):
    limit = GaugeMetricFamily("vcamon_power_limit_watts", "RAPL limit in force", labels=["constraint"])
    window = GaugeMetricFamily("vcamon_power_limit_window_seconds", "RAPL time window", labels=["constraint"])
    for name, c in sorted(limits.items()):
        if c["power_limit_uw"] is not None:
            limit.add_metric([name], c["power_limit_uw"] / 1e6)
        if c["time_window_us"] is not None:
            window.add_metric([name], c["time_window_us"] / 1e6)
    return [limit, window]


def _throttle_family(throttle):
    events = CounterMetricFamily("vcamon_throttle_events", "thermal throttle count, one per physical core "
                                 "and package", labels=["scope", "id"])
    for core, count in sorted(throttle["core"].items()):
        events.add_metric(["core", core], count)
    for pkg, count in sorted(throttle["package"].items()):
        events.add_metric(["package", pkg], count)
    return events


def _vca_family(records):
    """A node's vcactl state as a set of series, one per state the driver defines (1 for its own, 0 for
    the others), so a change moves a value rather than starting a series; a state the driver does not
    define gets a series of its own."""
    state = GaugeMetricFamily("vcamon_vca_node_state", "vcactl status per node (1 = in this state, 0 = not)",
                              labels=["vca_node", "card", "cpu", "state", "state_class"])
    for r in records:
        ids = [str(r["node"]), str(r["card"]), str(r["cpu"])]
        for name, cls in sorted({**VCA_STATES, r["state"]: r["state_class"]}.items()):
            state.add_metric([*ids, name, cls], 1 if name == r["state"] else 0)
    return state


# systemd's ActiveStates: each unit has a series for every one (1 for its own), so a state change moves
# a value, not a label (a label per state would start a new series and end the old one at every change).
UNIT_STATES = ("active", "reloading", "inactive", "failed", "activating", "deactivating", "maintenance", "refreshing")


def _unit_families(units):
    active = GaugeMetricFamily("vcamon_unit_active", "1 while the service is active", labels=["unit"])
    state = GaugeMetricFamily("vcamon_unit_state", "1 for the service's systemd ActiveState, 0 for the others",
                              labels=["unit", "state"])
    for unit, now in sorted(units.items()):
        active.add_metric([unit], 1 if now == "active" else 0)
        for s in UNIT_STATES + (() if now in UNIT_STATES else (now,)):
            state.add_metric([unit, s], 1 if s == now else 0)
    return [active, state]


def families(reading, node):
    """Prometheus metric families for one reading; an absent sensor yields no family."""
    info = GaugeMetricFamily("vcamon_agent_info", "vcamon agent on this machine", labels=["node"])
    info.add_metric([node], 1)
    platform = GaugeMetricFamily("vcamon_platform_info", "where these figures come from: hardware, lab (the "
                                 "simulator) or unknown", labels=["platform"])
    platform.add_metric([reading.get("platform") or "unknown"], 1)
    present = GaugeMetricFamily("vcamon_sensor_present", "1 when the sensor exists here", labels=["sensor"])
    throttle = reading["throttle"]
    present.add_metric(["coretemp"], 1 if reading["temps"] else 0)
    present.add_metric(["rapl"], 1 if reading["limits"] or reading["power_w"] is not None else 0)
    present.add_metric(["core_throttle"], 1 if throttle["core"] else 0)
    present.add_metric(["package_throttle"], 1 if throttle["package"] else 0)
    out = [info, platform, present]
    if reading["temps"]:
        temp = GaugeMetricFamily("vcamon_temperature_celsius", "coretemp reading by label", labels=["sensor"])
        for label, value in sorted(reading["temps"].items()):
            temp.add_metric([label], value)
        out.append(temp)
    if reading["power_w"] is not None:
        out.append(GaugeMetricFamily("vcamon_package_power_watts", "RAPL package-0 power over the last sample",
                                     value=reading["power_w"]))
    if reading["limits"]:
        out += _limit_families(reading["limits"])
    if reading["rapl_enabled"] is not None:
        out.append(GaugeMetricFamily("vcamon_rapl_enabled", "1 when RAPL limits are enabled",
                                     value=1 if reading["rapl_enabled"] else 0))
    if throttle["core"] or throttle["package"]:
        out.append(_throttle_family(throttle))
    if reading["vca"] is not None:
        out.append(_vca_family(reading["vca"]))
    if reading.get("units"):
        out += _unit_families(reading["units"])
    if reading.get("filesystems"):
        free = GaugeMetricFamily("vcamon_filesystem_free_bytes", "free space a service may use", labels=["mountpoint"])
        size = GaugeMetricFamily("vcamon_filesystem_size_bytes", "the filesystem's size", labels=["mountpoint"])
        for path, (avail, total) in sorted(reading["filesystems"].items()):
            free.add_metric([path], avail)
            size.add_metric([path], total)
        out += [free, size]
    return out


class _Collector:
    def __init__(self, sensors, node):
        self.sensors = sensors
        self.node = node

    def collect(self):
        for family in families(self.sensors.read(), self.node):
            if family.samples:
                yield family


def exposition(sensors, node):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(sensors, node))
    return generate_latest(registry)


def start_agent(listen, node, sysfs_root="/sys", vcactl=None, sample_interval=5.0, *, token=None,
                clock=time.monotonic, filesystems=("/",), units=()):
    """The agent's HTTP server (not yet serving) and the event that stops its power sampler.

    With token, every request must carry it (Authorization: Bearer), else 401.
    """
    if token is not None:
        check_token(token)     # configured but empty or malformed: refuse to start, never serve it open
    sensors = Sensors(sysfs_root, vcactl, clock=clock, sample_interval=sample_interval, filesystems=filesystems,
                      units=units)
    stop = threading.Event()

    def sampler():
        while True:
            try:
                sensors.sample_energy()
            except OSError as exc:
                LOG.warning("energy reading failed: %s", exc)
            if stop.wait(sample_interval):
                return

    threading.Thread(target=sampler, name="vcamon-sampler", daemon=True).start()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if token and not same(bearer(self.headers), token):
                body = b"vcamon agent: a token is required (Authorization: Bearer <token>)\n"
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer realm="vcamon-agent"')
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            try:
                body = exposition(sensors, node)
            except Exception as exc:  # one bad read must not kill the agent
                LOG.exception("reading sensors failed")
                self.send_error(500, str(exc))
                return
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt, *args):
            LOG.debug(fmt, *args)

    server = ThreadingHTTPServer(bind_address(listen), Handler)
    if not token and not is_loopback(server.server_address[0]):
        LOG.warning("the agent answers anyone who reaches %s: give it a token (--token-file)", server.server_address[0])
    return server, stop


def serve(listen, node, sysfs_root="/sys", vcactl=None, sample_interval=5.0, *, token=None, filesystems=("/",),
          units=()):
    """Run the agent until interrupted."""
    server, stop = start_agent(listen, node, sysfs_root, vcactl, sample_interval, token=token,
                               filesystems=filesystems, units=units)
    LOG.info("vcamon agent for %s on %s (%s:%d, sysfs %s)%s", node, listen, *server.server_address[:2], sysfs_root,
             "; token required" if token else "")
    try:
        server.serve_forever()
    finally:
        stop.set()
        server.server_close()
