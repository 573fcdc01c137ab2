# SPDX-License-Identifier: MIT
"""The fleet's roles: which machine runs each service the whole fleet shares.

A fleet may span several VCA hosts (group vca_host), but it runs one render
farm broker, one LLM front, one agent memory, one monitor and one build host.
The inventory names them in one dictionary, fleet_hosts ({role: vca host});
a role it leaves out falls to the first VCA host, so a one-host inventory
names nothing and runs as it always has. Each node belongs to its own host
(host variable vca_host_name, which a one-host fleet may leave unset). Group
extra_workers holds the owner's other Linux machines that run workers (the
farm's, the LLM front's): neither a VCA host nor a node, each on the LAN.
docs/SETUP.md has the table for owners.
"""

import ipaddress
from collections.abc import Mapping

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = r"""
name: fleet_host
short_description: the VCA host that plays a fleet role, or a node's own VCA host
description:
  - For each term, a fleet role (farm, llm_front, smem, monitor, image_builder), the host the
    inventory's C(fleet_hosts) mapping gives it, else the first host of group vca_host.
  - The term C(node_host) answers, for the host being templated, its own VCA host (its
    C(vca_host_name), which a one-host fleet may leave unset).
  - The term C(nodes) with C(of=HOST) answers the nodes (group vca_nodes) that sit in VCA host HOST,
    as a list (use query()).
  - The term C(lan_address) with C(of=HOST) answers VCA host (or extra worker) HOST's address on the LAN,
    the one rule for a service that binds there and for the routes to HOST's nodes. It is its
    C(vca_lan_address), else its C(ansible_host) when that is an IPv4 address on the LAN, else the address
    of its default IPv4 route when its facts were gathered. A host with none fails, naming the variable
    to set; a wildcard or loopback C(vca_lan_address) fails too.
  - The term C(extra_workers) answers group extra_workers (use query()), once each of them is checked to
    be neither a VCA host nor a node.
  - Bad input (an unknown role, a role given to a machine that is not a VCA host, an extra worker that
    is also a VCA host or a node) fails with the reason. docs/SETUP.md has the table.
options:
  _terms:
    description: fleet roles, node_host, nodes, lan_address or extra_workers
    required: true
  of:
    description: the VCA host whose nodes (term C(nodes)) are asked; for term C(lan_address), a VCA host or extra
      worker, or a list of them (one address each, in order, with query())
    type: raw
"""

EXAMPLES = r"""
farm_host: "{{ lookup('fleet_host', 'farm') }}"
proxy: "{{ hostvars[lookup('fleet_host', 'node_host')].ansible_host }}"
my_nodes: "{{ query('fleet_host', 'nodes', of=inventory_hostname) }}"
agent_address: "{{ lookup('fleet_host', 'lan_address', of='vcb-host') }}"
"""

RETURN = r"""
_raw:
  description: one inventory hostname per term
  type: list
  elements: str
"""


# The rule (plain functions: tests/test_fleet_roles.py calls them directly).

FLEET_ROLES = {
    "farm": "the render farm's broker (RabbitMQ), coordinator and API",
    "llm_front": "HAProxy in front of every LLM worker; the host worker of llm_workers_on_host is this host's",
    "smem": "the agent memory service (its API, database and backups)",
    "monitor": "Prometheus, the vcamon fleet page, the fleet report and the exposure audit's tables",
    "image_builder": "builds the node image and the llama-server binaries once for the whole fleet",
}
NODE_HOST = "node_host"   # not a fleet role: the asking node's own VCA host
NODES = "nodes"           # not a fleet role: the nodes of one VCA host
LAN_ADDRESS = "lan_address"   # not a fleet role: one VCA host's (or extra worker's) address on the LAN
EXTRA_WORKERS = "extra_workers"   # not a fleet role: the owner's other machines that run workers


class FleetError(ValueError):
    pass


def vca_hosts(groups: Mapping) -> list:
    hosts = list(groups.get("vca_host") or [])
    if not hosts:
        raise FleetError("the inventory has no VCA host (group vca_host is empty or missing)")
    return hosts


def extra_workers(groups: Mapping) -> list:
    """Group extra_workers, each checked to be neither a VCA host nor a node: a machine is one of the three."""
    workers = list(groups.get(EXTRA_WORKERS) or [])
    clashes = ["%s is in extra_workers and in %s" % (w, g) for w in workers for g in ("vca_host", "vca_nodes")
               if w in (groups.get(g) or [])]
    if clashes:
        raise FleetError("; ".join(clashes) + ": a machine is a VCA host, a node or an extra worker, one of them")
    return workers


def check_fleet_hosts(fleet_hosts, groups: Mapping) -> dict:
    """fleet_hosts as the inventory gives it, checked: a mapping of known roles to VCA hosts."""
    if fleet_hosts is None:
        return {}
    if not isinstance(fleet_hosts, Mapping):
        raise FleetError("fleet_hosts must be a mapping of fleet role to VCA host, got %r" % (fleet_hosts,))
    hosts = vca_hosts(groups)
    errors = []
    for role, host in fleet_hosts.items():
        if role not in FLEET_ROLES:
            errors.append("fleet_hosts names an unknown role %r (the roles: %s)" % (role, ", ".join(FLEET_ROLES)))
        elif host not in hosts:
            errors.append("fleet_hosts gives role %r to %r, which is not a VCA host (group vca_host: %s)"
                          % (role, host, ", ".join(hosts)))
    if errors:
        raise FleetError("; ".join(errors))
    return dict(fleet_hosts)


def fleet_host(role: str, groups: Mapping, fleet_hosts=None) -> str:
    """The VCA host that plays a fleet role: the inventory's choice, else the first VCA host."""
    if role not in FLEET_ROLES:
        raise FleetError("no fleet role %r (the roles: %s)" % (role, ", ".join(FLEET_ROLES)))
    chosen = check_fleet_hosts(fleet_hosts, groups)
    return chosen.get(role) or vca_hosts(groups)[0]


def node_host(node: str, groups: Mapping, host_name=None) -> str:
    """The VCA host a node sits in: its vca_host_name, which only a one-host fleet may leave unset."""
    hosts = vca_hosts(groups)
    if host_name:
        if host_name not in hosts:
            raise FleetError("%s names vca_host_name %r, which is not a VCA host (group vca_host: %s)"
                             % (node, host_name, ", ".join(hosts)))
        return host_name
    if len(hosts) > 1:
        raise FleetError("%s has no vca_host_name, and the fleet has %d VCA hosts (%s): name its host"
                         % (node, len(hosts), ", ".join(hosts)))
    return hosts[0]


def nodes_of(host: str, groups: Mapping, host_names: Mapping) -> list:
    """The nodes of group vca_nodes that sit in VCA host host, host_names being each one's vca_host_name."""
    if host not in vca_hosts(groups):
        raise FleetError("%r is not a VCA host (group vca_host: %s)" % (host, ", ".join(vca_hosts(groups))))
    return [n for n in groups.get("vca_nodes") or [] if node_host(n, groups, host_names.get(n)) == host]


def ipv4_address(text):
    """The IPv4 address text spells, or None (a name, another kind of address, or nothing)."""
    try:
        return ipaddress.IPv4Address(str(text))
    except ValueError:
        return None


def lan_address(host: str, groups: Mapping, vca_lan_address=None, ansible_host=None, default_route=None) -> str:
    """A VCA host's (or an extra worker's) address on the LAN, the one rule for every use (a service binds
    there, another host routes this one's nodes via it, a front reaches a worker there): its
    vca_lan_address, else its ansible_host when that is an IPv4 address on the LAN (a name may resolve
    elsewhere; loopback is a tunnel), else the address of its default IPv4 route when its facts were
    gathered. Never a wildcard or loopback address."""
    if host not in vca_hosts(groups) + extra_workers(groups):
        raise FleetError("%r is neither a VCA host (group vca_host: %s) nor an extra worker (group extra_workers: %s)"
                         % (host, ", ".join(vca_hosts(groups)), ", ".join(extra_workers(groups)) or "none"))
    if vca_lan_address:
        address = ipv4_address(vca_lan_address)
        if address is None:
            raise FleetError("%s: vca_lan_address is %r, not an IPv4 address" % (host, vca_lan_address))
        if address.is_unspecified or address.is_loopback:
            raise FleetError("%s: vca_lan_address is %s, which is no address on the LAN: set it to the machine's "
                             "own LAN address" % (host, vca_lan_address))
        return str(address)
    for value in (ansible_host, default_route):
        address = ipv4_address(value) if value else None
        if address is not None and not (address.is_unspecified or address.is_loopback):
            return str(address)
    route = ("its default route's address %r is none either" % default_route if default_route
             else "no default route address was gathered for it")
    raise FleetError("%s has no address on the LAN: set vca_lan_address (an IPv4 address) on it (its ansible_host "
                     "%r is no IPv4 address on the LAN, and %s)" % (host, ansible_host, route))


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        groups = variables.get("groups") or {}
        fleet_hosts = self._templar.template(variables.get("fleet_hosts"))
        hostvars = variables.get("hostvars") or {}
        answers = []
        try:
            for term in terms:
                if term in (NODES, LAN_ADDRESS) and kwargs.get("of") in (None, ""):
                    raise FleetError("the term %s needs of=<a VCA host%s>"
                                     % (term, " or an extra worker" if term == LAN_ADDRESS else ""))
                if term == NODES:
                    names = {n: hostvars[n].get("vca_host_name") if n in hostvars else None
                             for n in groups.get("vca_nodes") or []}
                    answers.extend(nodes_of(kwargs["of"], groups, names))
                elif term == LAN_ADDRESS:
                    machines = kwargs["of"] if isinstance(kwargs["of"], (list, tuple)) else [kwargs["of"]]
                    for machine in machines:
                        found = hostvars[machine] if machine in hostvars else {}
                        route = ((found.get("ansible_facts") or {}).get("default_ipv4") or {}).get("address")
                        answers.append(lan_address(machine, groups,
                                                   self._templar.template(found.get("vca_lan_address")),
                                                   self._templar.template(found.get("ansible_host")), route))
                elif term == EXTRA_WORKERS:
                    answers.extend(extra_workers(groups))
                elif term == NODE_HOST:
                    host_name = self._templar.template(variables.get("vca_host_name"))
                    answers.append(node_host(variables.get("inventory_hostname"), groups, host_name))
                else:
                    answers.append(fleet_host(term, groups, fleet_hosts))
        except FleetError as err:
            raise AnsibleLookupError(str(err)) from err
        return answers
