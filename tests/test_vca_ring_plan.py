"""The ring planner with the seed's per-node figures, and on synthetic fleets whose right answer is known
by construction (not the figures its constants were fitted to)."""

from __future__ import annotations

import itertools
import random

import pytest
from ansible.module_utils import vca_ring_plan
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


# ------------------------------------------------------- synthetic fleets: right answers by construction
#
# Every node sends exactly once and receives exactly once in a ring, so under the model every ring's
# bottleneck is min(every send, every recv) x efficiency, whatever the order: that is known without the
# planner. The planner's choice between rings is the rest of its sorted score (the second-slowest hop,
# and so on); exhaustive search is optimal for that score by definition, so no heuristic beats it.

def fleet(rng, n, lo=1000, hi=6000):
    return {i: {"send": rng.randint(lo, hi), "recv": rng.randint(lo, hi)} for i in range(n)}


def known_bottleneck(rates, eff=vca_ring_plan.DEFAULT_EFFICIENCY):
    return round(min(min(r["send"], r["recv"]) for r in rates.values()) * eff, 1)


def score(rates, order):
    return vca_ring_plan._ring_score(rates, order, vca_ring_plan.DEFAULT_EFFICIENCY)


@pytest.mark.parametrize("seed", range(20))
def test_bottleneck_of_a_random_fleet_is_the_slowest_send_or_recv(seed):
    rng = random.Random(seed)
    rates = fleet(rng, rng.randint(2, 7))
    plan = plan_ring(rates)
    assert plan["bottleneck_mib_s"] == pytest.approx(known_bottleneck(rates), abs=0.1)
    assert sorted(plan["order"]) == sorted(rates)


@pytest.mark.parametrize("seed", range(10))
def test_a_crippled_sender_is_the_bottleneck_and_sends_the_slowest_hop(seed):
    """It must send once in any ring, so its hop is the slowest; no order can hide it."""
    rng = random.Random(100 + seed)
    rates = fleet(rng, 5, lo=3000)
    cripple = rng.randrange(5)
    rates[cripple]["send"] = 200
    plan = plan_ring(rates)
    slowest = min(plan["legs"], key=lambda leg: leg["predicted_mib_s"])
    assert slowest["src"] == cripple and plan["bottleneck_mib_s"] == pytest.approx(200 * 0.96, abs=0.1)
    assert all(leg["predicted_mib_s"] > slowest["predicted_mib_s"] for leg in plan["legs"] if leg is not slowest)


def test_a_symmetric_fleet_gives_every_ring_the_same_cost():
    rates = {n: {"send": 4000, "recv": 4000} for n in range(6)}
    scores = {tuple(score(rates, [0, *rest])) for rest in itertools.permutations(range(1, 6))}
    assert len(scores) == 1
    plan = plan_ring(rates)
    assert {leg["predicted_mib_s"] for leg in plan["legs"]} == {3840.0} and plan["bottleneck_mib_s"] == 3840.0


@pytest.mark.parametrize("seed", range(10))
def test_exhaustive_and_heuristic_agree_on_small_synthetic_fleets(monkeypatch, seed):
    rng = random.Random(200 + seed)
    rates = fleet(rng, rng.randint(3, 7))
    exhaustive = plan_ring(rates)
    monkeypatch.setattr(vca_ring_plan, "EXHAUSTIVE_MAX_NODES", 1)
    heuristic = plan_ring(rates)
    assert exhaustive["method"] == "exhaustive" and heuristic["method"].startswith("greedy")
    assert heuristic["bottleneck_mib_s"] == exhaustive["bottleneck_mib_s"] == known_bottleneck(rates)
    assert score(rates, exhaustive["order"]) >= score(rates, heuristic["order"])
    best = max(score(rates, [0, *rest]) for rest in itertools.permutations(sorted(rates)[1:]))
    assert score(rates, exhaustive["order"]) == best


def test_relabelling_the_nodes_relabels_the_plan():
    rng = random.Random(7)
    rates = fleet(rng, 6)
    perm = dict(zip(range(6), [4, 0, 5, 1, 3, 2], strict=True))
    moved = {perm[n]: r for n, r in rates.items()}
    a, b = plan_ring(rates), plan_ring(moved)
    assert score(moved, b["order"]) == score(moved, [perm[n] for n in a["order"]])


def test_heuristic_beyond_the_exhaustive_limit_keeps_the_known_bottleneck():
    rates = fleet(random.Random(11), 12)
    plan = plan_ring(rates)
    assert plan["method"].startswith("greedy") and plan["bottleneck_mib_s"] == known_bottleneck(rates)


def test_a_seed_figure_not_used_for_fitting_the_7_0_14_matrix_best_direction():
    """The seed's 7.0.14 matrix measured 2 -> 1 at 4462 MiB/s (the ring figure, 4423, is the one the
    constants were checked against); the prediction for 2 -> 1 is within 5 % of it too."""
    (d21,) = [d for d in predict(SEED) if (d["src"], d["dst"]) == (2, 1)]
    assert abs(d21["predicted_mib_s"] / 4462 - 1) < 0.05
