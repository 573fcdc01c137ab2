# SPDX-License-Identifier: MIT
"""Predict node-to-node DMA rates and choose the ring order with the highest bottleneck.

Model (seed): a direction a->b runs at min(a's send, b's recv) x efficiency, 0.96 being the
seed's measured mean. Ranking ties: when two directions have the same binding figure, the
one whose other (non-binding) figure is also lower ranks worse. This is an assumption, not a
finding: it was chosen because it puts the seed's slowest measured direction (1->2: min 2058,
other 3129) below 1->0 (min 2058, other 3949); one observation from the session the model
came from validates nothing. The tests check the rule as stated on synthetic fleets only; a
card's own matrix is what will say whether it holds.

Ring search: exhaustive over Hamiltonian cycles (first node fixed) up to EXHAUSTIVE_MAX_NODES
live nodes; beyond that a heuristic: greedy (always the best next direction) from every start
node, best of those. The heuristic gives no optimality bound.
"""

from __future__ import annotations

import itertools

DEFAULT_EFFICIENCY = 0.96
EXHAUSTIVE_MAX_NODES = 9


class PlanError(ValueError):
    pass


def validate(node_rates, dead=()):
    """{node: {'send': MiB/s, 'recv': MiB/s}} checked; returns the live nodes, sorted."""
    if not isinstance(node_rates, dict) or not node_rates:
        raise PlanError("node_rates must be a non-empty mapping node -> {send, recv}")
    rates = {}
    for node, r in node_rates.items():
        try:
            n = int(node)
        except (TypeError, ValueError):
            raise PlanError("node %r is not a node number" % (node,)) from None
        if not isinstance(r, dict) or set(r) != {"send", "recv"}:
            raise PlanError("node %s: rates must be {send, recv}, got %r" % (n, r))
        for side in ("send", "recv"):
            v = r[side]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise PlanError("node %s: %s must be a rate >= 0 MiB/s, got %r" % (n, side, v))
        rates[n] = {"send": float(r["send"]), "recv": float(r["recv"])}
    unknown = sorted(set(int(d) for d in dead) - set(rates))
    if unknown:
        raise PlanError("dead node(s) %s have no rates: unknown node" % unknown)
    return rates, sorted(set(rates) - set(int(d) for d in dead))


def direction_key(rates, a, b, efficiency=DEFAULT_EFFICIENCY):
    """(predicted MiB/s, the non-binding figure): larger ranks better."""
    send, recv = rates[a]["send"], rates[b]["recv"]
    return (min(send, recv) * efficiency, max(send, recv))


def predict(node_rates, dead=(), efficiency=DEFAULT_EFFICIENCY):
    """Every ordered direction between live nodes, best first: [{src, dst, predicted_mib_s, binding}]."""
    if not 0 < efficiency <= 1:
        raise PlanError("efficiency must be in (0, 1], got %r" % efficiency)
    rates, live = validate(node_rates, dead)
    out = []
    for a, b in itertools.permutations(live, 2):
        key = direction_key(rates, a, b, efficiency)
        out.append({"src": a, "dst": b, "predicted_mib_s": round(key[0], 1),
                    "binding": "sender" if rates[a]["send"] <= rates[b]["recv"] else "receiver", "_key": key})
    out.sort(key=lambda d: d["_key"], reverse=True)
    for d in out:
        del d["_key"]
    return out


def _ring_score(rates, order, efficiency):
    """Ascending keys of the ring's directions: compared lexicographically, the bottleneck first."""
    return sorted(direction_key(rates, a, b, efficiency) for a, b in zip(order, order[1:] + order[:1], strict=True))


def plan_ring(node_rates, dead=(), efficiency=DEFAULT_EFFICIENCY):
    """The ring order with the highest bottleneck: {order, bottleneck_mib_s, legs, method}."""
    if not 0 < efficiency <= 1:
        raise PlanError("efficiency must be in (0, 1], got %r" % efficiency)
    rates, live = validate(node_rates, dead)
    if len(live) < 2:
        raise PlanError("a ring needs at least two live nodes, got %s" % live)
    if len(live) <= EXHAUSTIVE_MAX_NODES:
        method = "exhaustive"
        candidates = ([live[0], *rest] for rest in itertools.permutations(live[1:]))
    else:
        method = "greedy from every start (heuristic, no optimality bound)"
        candidates = (_greedy(rates, live, start, efficiency) for start in live)
    best = max(candidates, key=lambda order: _ring_score(rates, order, efficiency))
    legs = [{"src": a, "dst": b, "predicted_mib_s": round(direction_key(rates, a, b, efficiency)[0], 1)}
            for a, b in zip(best, best[1:] + best[:1], strict=True)]
    return {"order": best, "bottleneck_mib_s": min(leg["predicted_mib_s"] for leg in legs), "legs": legs,
            "method": method, "efficiency": efficiency, "skipped_dead": sorted(int(d) for d in dead)}


def _greedy(rates, live, start, efficiency):
    order, left = [start], set(live) - {start}
    while left:
        nxt = max(sorted(left), key=lambda b: direction_key(rates, order[-1], b, efficiency))
        order.append(nxt)
        left.remove(nxt)
    return order
