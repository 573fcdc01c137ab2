# SPDX-License-Identifier: MIT
"""The fleet topology rule and the inventory checks built on it.

Node n is card n // 3, CPU n % 3, at 172.31.(n+1).1. The inventory carries
these values as host variables; this module only checks that they agree.

Every service group must hold a node, smem_background included, whatever the
number of cards: smem's fact extraction runs only on that lane (its search
embeddings fall back to the interactive lane, extraction does not). A one-card
fleet gives it one of its three nodes (inventory/production, the template); a
node may serve both lanes.
"""

from __future__ import annotations

NODES_PER_CARD = 3
NODE_VARS = ("vca_node", "vca_card", "vca_cpu", "vca_node_ip")
SERVICE_GROUPS = ("smem_interactive", "smem_background", "farm")
REQUIRED_GROUPS = ("vca_host", "vca_nodes", *SERVICE_GROUPS)


def expected(node: int) -> dict:
    return {
        "vca_card": node // NODES_PER_CARD,
        "vca_cpu": node % NODES_PER_CARD,
        "vca_node_ip": "172.31.%d.1" % (node + 1),
    }


def _as_int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _node_errors(nodes):
    errors = []
    seen = {}
    for host in sorted(nodes):
        hv = nodes[host] or {}
        missing = [v for v in NODE_VARS if hv.get(v) in (None, "")]
        errors.extend("%s: %s is not set" % (host, v) for v in missing)
        if "vca_node" in missing:
            continue
        n = _as_int(hv.get("vca_node"))
        if n is None or n < 0:
            errors.append("%s: vca_node is %r, expected a node number >= 0" % (host, hv.get("vca_node")))
            continue
        if n in seen:
            errors.append("%s: vca_node %d is also used by %s" % (host, n, seen[n]))
        seen[n] = host
        for var, want in sorted(expected(n).items()):
            got = hv.get(var)
            if var in missing:
                continue
            if (_as_int(got) if isinstance(want, int) else str(got)) != want:
                errors.append("%s: %s is %r, expected %r for node %d" % (host, var, got, want, n))
    return errors


def _card_group_errors(nodes, groups, node_set):
    errors = []
    for group in sorted(groups):
        if not (group.startswith("card") and group[4:].isdigit()):
            continue
        for host in sorted(groups[group]):
            got = _as_int((nodes.get(host) or {}).get("vca_card"))
            if host not in node_set:
                errors.append("%s: is in %s but not in vca_nodes" % (host, group))
            elif got is not None and got != int(group[4:]):
                errors.append("%s: vca_card is %d but the host is in group %s" % (host, got, group))
    return errors


def _membership_errors(groups, node_set, service_groups, required_groups):
    errors = ["group %s: is empty or missing" % g for g in required_groups if not groups.get(g)]
    errors.extend(
        "%s: is in both vca_host and vca_nodes" % h for h in sorted(set(groups.get("vca_host", [])) & node_set)
    )
    for group in [*service_groups, "dead"]:
        errors.extend(
            "%s: is in %s but not in vca_nodes" % (h, group) for h in sorted(groups.get(group, [])) if h not in node_set
        )
    dead = set(groups.get("dead", []))
    for group in service_groups:
        errors.extend(
            "%s: is dead but listed in service group %s" % (h, group) for h in sorted(dead & set(groups.get(group, [])))
        )
    return errors


def check_inventory(nodes, groups, service_groups=SERVICE_GROUPS, required_groups=REQUIRED_GROUPS):
    """Return a list of error strings, each naming the host (or group) and the field.

    nodes: {inventory_hostname: {vca_node, vca_card, vca_cpu, vca_node_ip}} for vca_nodes
    groups: {group name: [hosts]} as Ansible's `groups`
    """
    node_set = set(groups.get("vca_nodes", []))
    return (
        _node_errors(nodes)
        + _membership_errors(groups, node_set, list(service_groups), required_groups)
        + _card_group_errors(nodes, groups, node_set)
    )
