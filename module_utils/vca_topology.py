# SPDX-License-Identifier: MIT
"""The fleet topology rule and the inventory checks built on it.

Node n is card n // 3, CPU n % 3, at the first address of the (n+1)th /24 of
its host's node subnet: 172.31.(n+1).1 in the default 172.31.0.0/16. The
inventory carries these values as host variables; this module only checks
that they agree.

A fleet may have several VCA hosts (group vca_host). Each host has its own
node subnet (host variable vca_node_subnet, default 172.31.0.0/16; no two may
overlap) and its own node numbers (node 0 may exist under each host). A node
names its host with the host variable vca_host_name, which may be left unset
while there is one host only.

Every service group must hold a node, smem_background included, whatever the
number of cards: smem's fact extraction runs only on that lane (its search
embeddings fall back to the interactive lane, extraction does not). A one-card
fleet gives it one of its three nodes (inventory/production, the template); a
node may serve both lanes.
"""

from __future__ import annotations

import ipaddress
from itertools import combinations

NODES_PER_CARD = 3
NODE_VARS = ("vca_node", "vca_card", "vca_cpu", "vca_node_ip")
NODE_HOST_VAR = "vca_host_name"
HOST_SUBNET_VAR = "vca_node_subnet"
DEFAULT_NODE_SUBNET = "172.31.0.0/16"
# Node n takes the (n+1)th /24 of its host's subnet (the first /24 stays free, as on the cards).
NODE_LINK_PREFIX = 24
SERVICE_GROUPS = ("smem_interactive", "smem_background", "farm")
REQUIRED_GROUPS = ("vca_host", "vca_nodes", *SERVICE_GROUPS)


def max_node(subnet) -> int:
    """The highest node number a node subnet holds."""
    net = ipaddress.IPv4Network(str(subnet))
    return 2 ** (NODE_LINK_PREFIX - net.prefixlen) - 2


def expected(node: int, subnet=DEFAULT_NODE_SUBNET) -> dict:
    net = ipaddress.IPv4Network(str(subnet))
    return {
        "vca_card": node // NODES_PER_CARD,
        "vca_cpu": node % NODES_PER_CARD,
        "vca_node_ip": str(net.network_address + (node + 1) * 2 ** (32 - NODE_LINK_PREFIX) + 1),
    }


def _as_int(value):
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _host_subnets(hosts, names):
    """({host: IPv4Network}, errors) for the VCA hosts whose node subnet is usable."""
    subnets, errors = {}, []
    for name in sorted(names):
        raw = (hosts.get(name) or {}).get(HOST_SUBNET_VAR)
        raw = DEFAULT_NODE_SUBNET if raw in (None, "") else raw
        try:
            net = ipaddress.IPv4Network(str(raw))
        except ValueError as e:
            errors.append("%s: %s is %r, expected an IPv4 network such as %s (%s)"
                          % (name, HOST_SUBNET_VAR, raw, DEFAULT_NODE_SUBNET, e))
            continue
        if net.prefixlen > NODE_LINK_PREFIX - 1:
            errors.append("%s: %s %s is too small: node n takes its (n+1)th /24, so it needs /23 or wider"
                          % (name, HOST_SUBNET_VAR, net))
            continue
        subnets[name] = net
    for a, b in combinations(sorted(subnets), 2):
        if subnets[a].overlaps(subnets[b]):
            errors.append("%s and %s: their node subnets %s and %s overlap; give each host a %s of its own"
                          % (a, b, subnets[a], subnets[b], HOST_SUBNET_VAR))
    return subnets, errors


def _node_host(node, raw, vca_hosts):
    """(the VCA host that carries node, or None; an error or None)."""
    if raw in (None, ""):
        if len(vca_hosts) > 1:
            return None, ("%s: %s is not set; with several VCA hosts (%s) every node names the one it sits in"
                          % (node, NODE_HOST_VAR, ", ".join(vca_hosts)))
        return (vca_hosts[0] if vca_hosts else None), None
    if isinstance(raw, (list, tuple, set)) and len(raw) > 1:
        return None, ("%s: %s names more than one host (%s); a node sits in one host's card"
                      % (node, NODE_HOST_VAR, ", ".join(sorted(str(h) for h in raw))))
    if not isinstance(raw, str) or raw not in vca_hosts:
        return None, ("%s: %s is %r, expected one host of group vca_host (%s)"
                      % (node, NODE_HOST_VAR, raw, ", ".join(vca_hosts) or "none"))
    return raw, None


def _rule_errors(node, hv, n, subnet, where):
    """A node's card, cpu and address against its number; the address only when its host's subnet is known."""
    want_all = expected(n, subnet or DEFAULT_NODE_SUBNET)
    if subnet is None:
        del want_all["vca_node_ip"]
    errors = []
    for var, want in sorted(want_all.items()):
        got = hv.get(var)
        if got in (None, ""):
            continue    # reported as not set
        if (_as_int(got) if isinstance(want, int) else str(got)) != want:
            errors.append("%s: %s is %r, expected %r for node %d%s" % (node, var, got, want, n, where))
    return errors


def _node_errors(nodes, groups, hosts):
    vca_hosts = sorted(groups.get("vca_host", []))
    several = len(vca_hosts) > 1
    subnets, errors = _host_subnets(hosts, vca_hosts)
    layout = {h: {"node_subnet": str(subnets[h]) if h in subnets else None, "nodes": []} for h in vca_hosts}
    seen = {}
    for node in sorted(nodes):
        hv = nodes[node] or {}
        host, host_error = _node_host(node, hv.get(NODE_HOST_VAR), vca_hosts)
        errors.extend([host_error] if host_error else [])
        if host is not None:
            layout[host]["nodes"].append(node)
        missing = [v for v in NODE_VARS if hv.get(v) in (None, "")]
        errors.extend("%s: %s is not set" % (node, v) for v in missing)
        if "vca_node" in missing:
            continue
        n = _as_int(hv.get("vca_node"))
        if n is None or n < 0:
            errors.append("%s: vca_node is %r, expected a node number >= 0" % (node, hv.get("vca_node")))
            continue
        if host is not None and (host, n) in seen:
            errors.append("%s: vca_node %d is also used by %s%s"
                          % (node, n, seen[(host, n)], " under host %s" % host if several else ""))
        seen[(host, n)] = node
        subnet = subnets.get(host)
        if subnet is not None and n > max_node(subnet):
            errors.append("%s: node %d does not fit in %s's %s %s (its last node is %d)"
                          % (node, n, host, HOST_SUBNET_VAR, subnet, max_node(subnet)))
            continue
        # Name the host and its subnet once the fleet is more than one host on the default subnet.
        where = ""
        if subnet is not None and (several or str(subnet) != DEFAULT_NODE_SUBNET):
            where = " in %s's %s %s" % (host, HOST_SUBNET_VAR, subnet)
        errors.extend(_rule_errors(node, hv, n, subnet, where))
    return errors, layout


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


def fleet_layout(nodes, groups, hosts=None):
    """({vca host: {node_subnet, nodes}}, errors): which host carries each node, and the checks on hosts and nodes."""
    errors, layout = _node_errors(nodes, groups, hosts or {})
    return layout, errors


def inspect_inventory(nodes, groups, service_groups=SERVICE_GROUPS, required_groups=REQUIRED_GROUPS, hosts=None):
    """(errors, layout): check_inventory's errors and fleet_layout's layout from one pass."""
    node_set = set(groups.get("vca_nodes", []))
    node_errors, layout = _node_errors(nodes, groups, hosts or {})
    errors = (node_errors
              + _membership_errors(groups, node_set, list(service_groups), required_groups)
              + _card_group_errors(nodes, groups, node_set))
    return errors, layout


def check_inventory(nodes, groups, service_groups=SERVICE_GROUPS, required_groups=REQUIRED_GROUPS, hosts=None):
    """Return a list of error strings, each naming the host (or group) and the field.

    nodes: {inventory_hostname: {vca_host_name, vca_node, vca_card, vca_cpu, vca_node_ip}} for vca_nodes
    groups: {group name: [hosts]} as Ansible's `groups`
    hosts: {vca host: {vca_node_subnet}}; a host that is not there, or sets nothing, has 172.31.0.0/16
    """
    return inspect_inventory(nodes, groups, service_groups, required_groups, hosts)[0]
