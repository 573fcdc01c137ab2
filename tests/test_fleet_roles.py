"""lookup_plugins/fleet_host.py: which machine plays each fleet role, and which host each node sits in.

The rule's functions are called directly; then the roles' own defaults are read by the real
ansible-playbook on a two-host inventory that hands every role to the second host, so a role that
still picked "the first VCA host" on its own would answer vca-host and fail here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest

from conftest import ROOT, ansible_playbook

spec = importlib.util.spec_from_file_location("fleet_host", ROOT / "lookup_plugins/fleet_host.py")
fleet = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fleet)

GROUPS = {"vca_host": ["vca-host", "vcb-host"], "vca_nodes": ["vca-node0", "vcb-node0", "vcb-node1"]}
HOST_NAMES = {"vca-node0": "vca-host", "vcb-node0": "vcb-host", "vcb-node1": "vcb-host"}


def test_a_role_the_inventory_leaves_out_falls_to_the_first_host():
    assert fleet.fleet_host("farm", GROUPS) == "vca-host"
    assert fleet.fleet_host("farm", GROUPS, {"smem": "vcb-host"}) == "vca-host"
    assert fleet.fleet_host("smem", GROUPS, {"smem": "vcb-host"}) == "vcb-host"


@pytest.mark.parametrize("fleet_hosts, said", [
    ({"brokr": "vca-host"}, "fleet_hosts names an unknown role 'brokr'"),
    ({"farm": "vca-node0"}, "fleet_hosts gives role 'farm' to 'vca-node0', which is not a VCA host"),
    (["farm"], "fleet_hosts must be a mapping"),
])
def test_bad_fleet_hosts_are_refused_with_the_reason(fleet_hosts, said):
    with pytest.raises(fleet.FleetError, match=re.escape(said)):
        fleet.fleet_host("monitor", GROUPS, fleet_hosts)


def test_an_unknown_role_and_an_empty_fleet_are_refused():
    with pytest.raises(fleet.FleetError, match="no fleet role 'broker'"):
        fleet.fleet_host("broker", GROUPS)
    with pytest.raises(fleet.FleetError, match="no VCA host"):
        fleet.fleet_host("farm", {"vca_nodes": ["n"]})


def test_each_node_sits_in_its_own_host():
    assert fleet.nodes_of("vcb-host", GROUPS, HOST_NAMES) == ["vcb-node0", "vcb-node1"]
    assert fleet.nodes_of("vca-host", GROUPS, HOST_NAMES) == ["vca-node0"]
    one_host = {"vca_host": ["vca-host"], "vca_nodes": ["vca-node0", "vca-node1"]}
    assert fleet.nodes_of("vca-host", one_host, {}) == ["vca-node0", "vca-node1"]   # unset: the only host
    with pytest.raises(fleet.FleetError, match="vcb-node1 has no vca_host_name, and the fleet has 2 VCA hosts"):
        fleet.nodes_of("vca-host", GROUPS, {**HOST_NAMES, "vcb-node1": None})
    with pytest.raises(fleet.FleetError, match="names vca_host_name 'vcc-host', which is not a VCA host"):
        fleet.node_host("vcb-node1", GROUPS, "vcc-host")


@pytest.mark.parametrize("lan, ansible_host, route, answer", [
    ("192.0.2.11", "vcb-host.example.lan", "192.0.2.99", "192.0.2.11"),     # vca_lan_address first
    (None, "192.0.2.12", "192.0.2.99", "192.0.2.12"),                       # else an IPv4 ansible_host
    ("", "192.0.2.12", None, "192.0.2.12"),
    (None, "vcb-host.example.lan", "192.0.2.99", "192.0.2.99"),            # else the default route's
    (None, "127.0.0.1", "192.0.2.99", "192.0.2.99"),                       # (loopback: a tunnel)
])
def test_a_hosts_lan_address(lan, ansible_host, route, answer):
    assert fleet.lan_address("vcb-host", GROUPS, lan, ansible_host, route) == answer


@pytest.mark.parametrize("host, lan, ansible_host, route, said", [
    ("vcb-host", None, "vcb-host.example.lan", None, "vcb-host has no address on the LAN: set vca_lan_address"),
    ("vcb-host", None, "2001:db8::2", None, "its ansible_host '2001:db8::2' is no IPv4 address on the LAN, and no "
     "default route address was gathered for it"),
    ("vcb-host", None, "127.0.0.1", "127.0.0.1", "its default route's address '127.0.0.1' is none either"),
    ("vcb-host", "vcb.example.lan", "192.0.2.12", None, "vcb-host: vca_lan_address is 'vcb.example.lan', not an IPv4"),
    ("vcb-host", "0.0.0.0", "192.0.2.12", None, "vcb-host: vca_lan_address is 0.0.0.0, which is no address on the LAN"),
    ("vcb-host", "127.0.0.1", "192.0.2.12", None, "vcb-host: vca_lan_address is 127.0.0.1, which is no address"),
    ("vca-node0", "192.0.2.11", None, None, "'vca-node0' is neither a VCA host (group vca_host: vca-host, vcb-host) "
     "nor an extra worker (group extra_workers: none)"),
])
def test_a_host_without_a_lan_address_is_refused_with_what_to_set(host, lan, ansible_host, route, said):
    with pytest.raises(fleet.FleetError, match=re.escape(said)):
        fleet.lan_address(host, GROUPS, lan, ansible_host, route)


def test_an_extra_worker_has_a_lan_address_by_the_same_rule():
    groups = {**GROUPS, "extra_workers": ["owner-pc"]}
    assert fleet.extra_workers(groups) == ["owner-pc"]
    assert fleet.lan_address("owner-pc", groups, None, "owner-pc.example.lan", "192.0.2.50") == "192.0.2.50"
    with pytest.raises(fleet.FleetError, match="owner-pc has no address on the LAN: set vca_lan_address"):
        fleet.lan_address("owner-pc", groups, None, "owner-pc.example.lan", None)
    with pytest.raises(fleet.FleetError, match=re.escape("nor an extra worker (group extra_workers: owner-pc)")):
        fleet.lan_address("other-pc", groups, None, "192.0.2.51", None)


@pytest.mark.parametrize("group, machine", [("vca_host", "vcb-host"), ("vca_nodes", "vcb-node0")])
def test_an_extra_worker_that_is_also_a_vca_host_or_node_is_refused(group, machine):
    groups = {**GROUPS, "extra_workers": ["owner-pc", machine]}
    with pytest.raises(fleet.FleetError, match=re.escape("%s is in extra_workers and in %s: a machine is a VCA host, "
                                                         "a node or an extra worker" % (machine, group))):
        fleet.extra_workers(groups)


# Each role's knob that names a fleet machine, read from the role's own defaults/ or vars/ on a node
# or host of a two-host inventory whose fleet_hosts gives every role to vcb-host.
KNOBS = {
    "farm": ("defaults", "farm_host", "vcb-host"),
    "smem": ("defaults", "smem_host", "vcb-host"),
    "prometheus": ("defaults", "prometheus_host", "vcb-host"),
    "vcamon": ("defaults", "vcamon_collector_host", "vcb-host"),
    "llm_workers": ("defaults", "llm_workers_front", "vcb-host"),
    "llama_server": ("defaults", "llama_server_build_host", "vcb-host"),
    "node_image": ("defaults", "node_image_drain_host", "vcb-host"),
}


def run_play(tmp_path, tasks, hosts="all"):
    inventory = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "fleet_hosts": {role: "vcb-host" for role in fleet.FLEET_ROLES}},
        "children": {
            "vca_host": {"hosts": {"vca-host": {}, "vcb-host": {}}},
            "vca_nodes": {"hosts": {n: {"vca_host_name": h} for n, h in HOST_NAMES.items()}},
        }}}
    run = ansible_playbook(tmp_path, inventory,
                           json.dumps([{"hosts": hosts, "gather_facts": False, "tasks": tasks}]))
    assert run.returncode == 0, run.stdout + run.stderr
    return dict(re.findall(r"ANSWER (\S+)=(\S*)", run.stdout))


def test_every_role_takes_its_machine_from_the_fleet_roles(tmp_path):
    tasks = []
    for role, (where, var, _) in KNOBS.items():
        tasks.append({"ansible.builtin.include_vars": {"file": str(ROOT / "roles" / role / where / "main.yml"),
                                                        "name": "v_" + role}})
        tasks.append({"ansible.builtin.debug": {"msg": "ANSWER %s={{ v_%s.%s }}" % (var, role, var)}})
    answers = run_play(tmp_path, tasks, hosts="vca-node0")
    assert answers == {var: want for _, var, want in KNOBS.values()}


def test_each_host_boots_and_guards_only_its_own_nodes(tmp_path):
    live = "ANSWER {{ inventory_hostname }}={{ vca_boot_live_nodes | join(',') }}"
    tasks = [{"ansible.builtin.include_vars": {"file": str(ROOT / "roles/vca_boot/vars/main.yml")}},
             {"ansible.builtin.debug": {"msg": live},
              "when": "inventory_hostname in groups['vca_host']"},
             {"ansible.builtin.include_vars": {"file": str(ROOT / "roles/node_image/defaults/main.yml"), "name": "n"}},
             {"ansible.builtin.debug": {"msg": "ANSWER boot-{{ inventory_hostname }}={{ n.node_image_host }}"},
              "when": "inventory_hostname in groups['vca_nodes']"}]
    answers = run_play(tmp_path, tasks)
    assert answers == {"vca-host": "vca-node0", "vcb-host": "vcb-node0,vcb-node1",
                       "boot-vca-node0": "vca-host", "boot-vcb-node0": "vcb-host", "boot-vcb-node1": "vcb-host"}


def test_no_role_or_playbook_picks_the_first_vca_host_itself():
    """The fleet's machines come from its roles (lookup fleet_host); a lab is one host (playbooks/lab.yml)."""
    found = []
    for path in sorted([*ROOT.glob("roles/**/*.yml"), *ROOT.glob("roles/**/*.j2"), *ROOT.glob("playbooks/**/*.yml"),
                        *ROOT.glob("playbooks/**/*.j2"), *ROOT.glob("inventory/**/*.yml")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"groups\[.vca_host.\](\[0\]|\[:1\]| *\| *first)", line):
                found.append("%s:%d" % (path.relative_to(ROOT), n))
    assert found == ["playbooks/lab.yml:17"]
