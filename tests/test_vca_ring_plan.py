"""The ring planner with the seed's per-node figures."""

from __future__ import annotations

import pytest
from ansible.module_utils.vca_ring_plan import PlanError, direction_key, plan_ring, predict

SEED = {0: {"send": 3997, "recv": 3949}, 1: {"send": 2058, "recv": 4849}, 2: {"send": 5642, "recv": 3129}}


def test_best_and_worst_direction_match_the_seed_within_ten_percent():
    dirs = predict(SEED)
    best, worst = dirs[0], dirs[-1]
    assert (best["src"], best["dst"]) == (2, 1) and abs(best["predicted_mib_s"] / 4423 - 1) < 0.10
    assert (worst["src"], worst["dst"]) == (1, 2) and abs(worst["predicted_mib_s"] / 2020 - 1) < 0.10


def test_tie_on_the_binding_figure_ranks_the_lower_other_figure_worse():
    ranked = [(d["src"], d["dst"]) for d in predict(SEED)]
    assert ranked.index((1, 0)) < ranked.index((1, 2))
    # Not an accident of the sort's stability: the keys themselves differ.
    assert direction_key(SEED, 1, 2) < direction_key(SEED, 1, 0)
    relabelled = {0: SEED[1], 1: SEED[2], 2: SEED[0]}       # 1->2 becomes 0->1, 1->0 becomes 0->2
    ranked = [(d["src"], d["dst"]) for d in predict(relabelled)]
    assert ranked[-1] == (0, 1)


def test_ring_avoids_the_worst_direction():
    plan = plan_ring(SEED)
    assert plan["method"] == "exhaustive" and plan["order"] == [0, 2, 1]
    assert (1, 2) not in [(leg["src"], leg["dst"]) for leg in plan["legs"]]
    assert plan["bottleneck_mib_s"] == pytest.approx(2058 * 0.96, abs=0.1)


def test_dead_node_is_skipped_and_two_cards_make_one_ring():
    rates = dict(SEED)
    rates.update({3: {"send": 4000, "recv": 4000}, 4: {"send": 3000, "recv": 4500}, 5: {"send": 5000, "recv": 3500}})
    plan = plan_ring(rates, dead=[3])
    assert sorted(plan["order"]) == [0, 1, 2, 4, 5] and plan["skipped_dead"] == [3]
    assert all(3 not in (d["src"], d["dst"]) for d in predict(rates, dead=[3]))


def test_heuristic_beyond_the_exhaustive_limit_still_visits_every_node():
    rates = {n: {"send": 1000 + 100 * n, "recv": 3000 - 50 * n} for n in range(12)}
    plan = plan_ring(rates)
    assert plan["method"].startswith("greedy") and sorted(plan["order"]) == list(range(12))


@pytest.mark.parametrize("rates,dead,match", [
    (SEED, [7], "unknown node"),
    ({0: {"send": -1, "recv": 10}, 1: {"send": 1, "recv": 1}}, [], "rate >= 0"),
    ({"x": {"send": 1, "recv": 1}}, [], "not a node number"),
    ({0: {"send": 1}}, [], "send, recv"),
    ({0: {"send": 1, "recv": 1}}, [], "at least two"),
])
def test_bad_input_is_a_clear_error(rates, dead, match):
    with pytest.raises(PlanError, match=match):
        plan_ring(rates, dead=dead)
