"""Thermal and power model of one VCA 2 node (lab only).

Package power follows the node's CPU load between idle and full-load power,
is held under the RAPL limits written to the simulated powercap files, and
drives a first-order thermal model fitted to the seed figures. The hottest
core crossing the throttle point counts one throttle event per excursion and
cuts power while it lasts, as PROCHOT does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PARAMS_FILE = Path(__file__).resolve().parent.parent / "params.yml"


def load_params(path: str | Path = PARAMS_FILE) -> dict:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@dataclass
class Limits:
    """The RAPL limits in force, as read from the powercap files."""

    pl1_w: float
    pl2_w: float
    pl1_window_s: float
    enabled: bool = True


@dataclass
class NodeModel:
    node: dict
    airflow: dict
    temp_c: float = field(default=0.0)
    avg_power_w: float = field(default=0.0)
    power_w: float = field(default=0.0)
    energy_uj: int = 0
    core_events: list[int] = field(default_factory=list)
    package_events: int = 0
    throttling: list[bool] = field(default_factory=list)
    package_throttling: bool = False

    @classmethod
    def from_params(cls, params: dict, airflow: str) -> NodeModel:
        node = params["node"]
        try:
            flow = params["airflow"][airflow]
        except KeyError:
            raise ValueError(f"unknown airflow {airflow!r}; known: {sorted(params['airflow'])}") from None
        model = cls(node=node, airflow=flow)
        model.power_w = model.avg_power_w = node["idle_w"]
        model.temp_c = model.steady_temp_c(node["idle_w"])
        model.core_events = [0] * node["cores"]
        model.throttling = [False] * node["cores"]
        return model

    def steady_temp_c(self, power_w: float) -> float:
        return self.airflow["ambient_c"] + self.airflow["r_th_c_per_w"] * power_w

    def demand_w(self, load: float) -> float:
        load = min(max(load, 0.0), 1.0)
        return self.node["idle_w"] + load * (self.node["full_load_w"] - self.node["idle_w"])

    def core_temps_c(self) -> list[float]:
        return [self.temp_c + off for off in self.node["core_offsets_c"]]

    def step(self, dt: float, load: float, limits: Limits) -> None:
        """Advance the model by dt seconds at the given CPU load (0..1)."""
        if dt <= 0:
            return
        power = self.demand_w(load)
        if limits.enabled:
            # RAPL: PL2 bounds the instantaneous power, PL1 the running average
            # over its time window; once the average reaches PL1, PL1 holds.
            budget = limits.pl2_w if self.avg_power_w < limits.pl1_w else limits.pl1_w
            power = min(power, budget, limits.pl2_w)
        if any(self.throttling):
            power *= self.node["throttle_power_factor"]
        self.power_w = power

        window = max(limits.pl1_window_s, dt)
        self.avg_power_w += (power - self.avg_power_w) * (1.0 - math.exp(-dt / window))
        target = self.steady_temp_c(power)
        self.temp_c += (target - self.temp_c) * (1.0 - math.exp(-dt / self.node["thermal_tau_s"]))

        energy = self.energy_uj + round(power * dt * 1e6)
        self.energy_uj = energy % self.node["max_energy_range_uj"]
        self._count_throttle()

    def _count_throttle(self) -> None:
        hot, cool = self.node["throttle_c"], self.node["throttle_release_c"]
        for i, t in enumerate(self.core_temps_c()):
            if not self.throttling[i] and t >= hot:
                self.throttling[i] = True
                self.core_events[i] += 1
            elif self.throttling[i] and t < cool:
                self.throttling[i] = False
        package_hot = any(self.throttling)
        if package_hot and not self.package_throttling:
            self.package_events += 1
        self.package_throttling = package_hot
