"""CPU load of this lab node: the container's own cgroup, not the whole machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _container_cgroup() -> str:
    """The cgroup of PID 1 (the node's systemd); for v2 the parent of init.scope."""
    v1 = v2 = None
    for line in Path("/proc/1/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            v1 = path
        elif controllers == "":
            v2 = path
    if v1 is not None:
        return "v1:" + v1
    path = v2 or "/"
    if path.endswith("/init.scope"):
        path = path[: -len("/init.scope")]
    return "v2:" + path


class CpuUsage:
    """Seconds of CPU used by the node since some origin, from its cgroup."""

    def __init__(self) -> None:
        kind, path = _container_cgroup().split(":", 1)
        rel = path.lstrip("/")
        if kind == "v1":
            self.file = CGROUP / "cpuacct" / rel / "cpuacct.usage"
            self.scale = 1e-9
        else:
            self.file = CGROUP / rel / "cpu.stat"
            self.scale = 1e-6
        self.cpus = os.cpu_count() or 1

    def seconds(self) -> float:
        text = self.file.read_text()
        if self.file.name == "cpu.stat":
            for line in text.splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) * self.scale
            raise ValueError(f"no usage_usec in {self.file}")
        return int(text) * self.scale


class LoadMeter:
    """Load 0..1: CPU seconds per second over the CPUs the node can use."""

    def __init__(self, usage: CpuUsage | None = None, clock=time.monotonic):
        self.usage = usage or CpuUsage()
        self.clock = clock
        self.last = (self.clock(), self.usage.seconds())

    def sample(self) -> float:
        now, used = self.clock(), self.usage.seconds()
        dt, dused = now - self.last[0], used - self.last[1]
        self.last = (now, used)
        if dt <= 0:
            return 0.0
        return min(max(dused / dt / self.usage.cpus, 0.0), 1.0)


def load_input(path: Path | None) -> float | None:
    """The load a test has set for this node (0..1 in a file), or None to follow the CPU.

    A test that needs a known load writes it here instead of racing busy loops
    against whatever else the machine runs; removing the file hands back to the cgroup.
    """
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        load = float(text)
    except ValueError:
        raise ValueError(f"{path}: load must be a number from 0 to 1, got {text!r}") from None
    if not 0.0 <= load <= 1.0:
        raise ValueError(f"{path}: load must be from 0 to 1, got {load}")
    return load
