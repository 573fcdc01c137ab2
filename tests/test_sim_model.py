"""The lab simulator's thermal/power model against the seed figures it was fitted to."""

from __future__ import annotations

import pytest
from ansible.module_utils.vca_sensors import energy_delta_uj

from vcasim.model import Limits, NodeModel

STOCK = Limits(pl1_w=45.0, pl2_w=56.25, pl1_window_s=28.0)
CAPPED = Limits(pl1_w=35.0, pl2_w=40.0, pl1_window_s=28.0)


def run(model, seconds, load, limits, dt=1.0):
    powers, temps = [], []
    for _ in range(int(seconds / dt)):
        model.step(dt, load, limits)
        powers.append(model.power_w)
        temps.append(max(model.core_temps_c()))
    return powers, temps


def test_idle_node_sits_at_seed_idle_power_and_temperature(sim_params):
    model = NodeModel.from_params(sim_params, "shroud_120mm")
    powers, temps = run(model, 600, 0.0, STOCK)
    assert powers[-1] == pytest.approx(12.0)
    assert 35.0 <= temps[-1] <= 37.0      # seed: idle 35-37 C


@pytest.mark.parametrize("load, watts", [(0.0, 12.0), (0.25, 19.65), (0.5, 27.3), (1.0, 42.6)])
def test_power_follows_load(sim_params, load, watts):
    model = NodeModel.from_params(sim_params, "shroud_120mm")
    powers, _ = run(model, 5, load, STOCK)
    assert powers[-1] == pytest.approx(watts)


def test_stock_limits_on_stock_airflow_reach_the_seed_94c_and_throttle(sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    powers, temps = run(model, 1800, 1.0, STOCK)
    assert 92.0 <= max(temps) <= 95.0     # seed: 92-94 C at stock limits
    assert sum(model.core_events) > 0     # seed: thousands of throttle events on card 1
    assert model.package_events > 0
    assert min(powers[-600:]) < 42.6      # throttling cuts power while it lasts


def test_pl1_cap_holds_power_and_keeps_81c_without_throttling(sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    powers, temps = run(model, 1800, 1.0, CAPPED)
    assert max(powers) <= 40.0 + 1e-9              # PL2 bounds every instant
    assert max(powers[-1200:]) <= 35.0 + 1e-9      # once the PL1 budget is spent, PL1 holds
    assert sum(powers[-1200:]) / 1200 == pytest.approx(35.0)
    assert 78.0 <= temps[-1] <= 83.0               # seed: 81 C at PL1 35 W
    assert sum(model.core_events) == 0 and model.package_events == 0   # seed: zero throttle events


def test_pl2_allows_a_burst_above_pl1_before_the_budget_is_spent(sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    powers, _ = run(model, 10, 1.0, CAPPED)
    assert powers[0] == pytest.approx(40.0)


def test_shroud_profile_matches_the_seed_shroud_figure(sim_params):
    model = NodeModel.from_params(sim_params, "shroud_120mm")
    assert model.steady_temp_c(121.0 / 3) == pytest.approx(77.0, abs=0.5)   # seed: 75-79 C at ~121 W/card
    _, temps = run(model, 1800, 1.0, STOCK)
    assert temps[-1] < 82.0 and sum(model.core_events) == 0


def test_disabled_rapl_does_not_cap(sim_params):
    model = NodeModel.from_params(sim_params, "shroud_120mm")
    powers, _ = run(model, 300, 1.0, Limits(pl1_w=20.0, pl2_w=25.0, pl1_window_s=28.0, enabled=False))
    assert powers[-1] == pytest.approx(42.6)


def test_energy_counter_wraps_at_max_energy_range(sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    top = sim_params["node"]["max_energy_range_uj"]
    model.energy_uj = top - 5_000_000          # 5 J before the wrap
    model.step(1.0, 1.0, STOCK)                # 42.6 J in one second
    assert model.energy_uj == 42_600_000 - 5_000_000
    assert energy_delta_uj(top - 5_000_000, model.energy_uj, top) == 42_600_000


def test_one_excursion_counts_one_event_per_hot_core(sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    model.temp_c = 93.5                      # core 0 (offset 0) is over 93, the others are not
    model._count_throttle()
    model._count_throttle()                  # still hot: the same excursion
    assert model.core_events == [1, 0, 0, 0] and model.package_events == 1
    model.temp_c = 92.5                      # inside the 1 C hysteresis: still the same excursion
    model._count_throttle()
    assert model.core_events == [1, 0, 0, 0]
    model.temp_c = 90.0
    model._count_throttle()
    model.temp_c = 94.5                      # a new excursion: 94.5, 93.5, 92.5, 93.0 -> cores 0, 1, 3
    model._count_throttle()
    assert model.core_events == [2, 1, 0, 1] and model.package_events == 2


def test_unknown_airflow_is_a_clear_error(sim_params):
    with pytest.raises(ValueError, match="unknown airflow 'turbo'"):
        NodeModel.from_params(sim_params, "turbo")
