"""The node rule and inventory checks, on the shipped inventories and on broken ones."""

from __future__ import annotations

import copy
import re
import shutil

import pytest
import yaml
from ansible.inventory.manager import InventoryManager
from ansible.module_utils.vca_topology import check_inventory, expected, fleet_layout
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from conftest import ROOT, load_library, run_module


def load(inventory):
    """An inventory by name under inventory/, or a path."""
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(ROOT / "inventory" / inventory)])
    vm = VariableManager(loader=loader, inventory=inv)
    groups = {g: [h.name for h in inv.groups[g].get_hosts()] for g in inv.groups}
    nodes = {}
    for host in groups["vca_nodes"]:
        hv = vm.get_vars(host=inv.get_host(host))
        nodes[host] = {k: hv.get(k) for k in ("vca_node", "vca_card", "vca_cpu", "vca_node_ip")}
    return nodes, groups, vm, inv


def test_the_lab_is_the_seed_owners_fleet():
    nodes, groups, _, _ = load("lab")
    assert check_inventory(nodes, groups) == []
    assert sorted(groups["farm"]) == ["vca-node0", "vca-node1", "vca-node4", "vca-node5"]
    assert sorted(groups["smem_interactive"]) == ["vca-node0", "vca-node1", "vca-node2"]
    assert sorted(groups["smem_background"]) == ["vca-node4", "vca-node5"]
    assert groups["dead"] == ["vca-node3"]


def test_the_lab_caps_card1_and_leaves_card0_stock():
    _, _, vm, inv = load("lab")
    card1 = vm.get_vars(host=inv.get_host("vca-node4"))
    card0 = vm.get_vars(host=inv.get_host("vca-node0"))
    assert (card1["power_cap_pl1_w"], card1["power_cap_pl2_w"]) == (35, 40)
    assert (card0["power_cap_pl1_w"], card0["power_cap_pl2_w"]) == (None, None)


# inventory/production is a template: one card as shipped, a second card in blocks marked
# "# card 1" whose following comment lines (at the marker's indent) are the second card's YAML.
def with_card1(text):
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        marker = re.match(r"^(\s*)# card 1\b", lines[i])
        i += 1
        if marker:
            indent = marker.group(1)
            while i < len(lines) and lines[i].startswith(indent + "# "):
                out.append(indent + lines[i][len(indent) + 2:])
                i += 1
    return "\n".join(out) + "\n"


def with_card2(text):
    """The two-card fleet plus a third card, as an owner adds it: nodes 6-8, in the farm and ingest lane."""
    data = yaml.safe_load(text)
    groups = data["all"]["children"]
    groups["vca_nodes"]["children"]["card2"] = {"hosts": {
        "vca-node%d" % n: {"vca_node": n, **expected(n)} for n in (6, 7, 8)}}
    for group in ("farm", "smem_background"):
        groups[group]["hosts"].update({"vca-node%d" % n: None for n in (6, 7, 8)})
    return yaml.safe_dump(data)


def template_with(tmp_path, cards):
    inv = tmp_path / "mysite"
    shutil.copytree(ROOT / "inventory" / "production", inv)
    text = (inv / "hosts.yml").read_text()
    if cards >= 2:
        text = with_card1(text)
    if cards == 3:
        text = with_card2(text)
    (inv / "hosts.yml").write_text(text)
    return inv


@pytest.mark.parametrize("cards", [1, 2, 3])
def test_the_template_validates_with_one_two_and_three_cards(tmp_path, cards):
    nodes, groups, vm, inv = load(template_with(tmp_path, cards))
    assert check_inventory(nodes, groups) == []
    assert sorted(nodes) == ["vca-node%d" % n for n in range(3 * cards)]
    assert sorted(groups["card%d" % (cards - 1)]) == ["vca-node%d" % n for n in range(3 * (cards - 1), 3 * cards)]
    assert groups["dead"] == []
    for host in nodes:      # every card capped until its owner says it is shrouded (card2: no file, stock)
        hv = vm.get_vars(host=inv.get_host(host))
        want = (None, None) if hv["vca_card"] == 2 else (35, 40)
        assert (hv.get("power_cap_pl1_w"), hv.get("power_cap_pl2_w")) == want, host


def test_the_template_ships_one_card_and_no_seed_specifics():
    nodes, groups, vm, inv = load("production")
    assert sorted(nodes) == ["vca-node0", "vca-node1", "vca-node2"]
    assert groups["dead"] == [] and "card1" not in groups
    assert vm.get_vars(host=inv.get_host("vca-host"))["farm_never_lend"] == []


def test_rule():
    assert expected(0) == {"vca_card": 0, "vca_cpu": 0, "vca_node_ip": "172.31.1.1"}
    assert expected(5) == {"vca_card": 1, "vca_cpu": 2, "vca_node_ip": "172.31.6.1"}


@pytest.fixture
def good():
    nodes, groups, _, _ = load("lab")
    return nodes, groups


def test_ip_that_disagrees_with_the_number_names_host_and_field(good):
    nodes, groups = copy.deepcopy(good)
    nodes["vca-node4"]["vca_node_ip"] = "172.31.9.1"
    assert check_inventory(nodes, groups) == [
        "vca-node4: vca_node_ip is '172.31.9.1', expected '172.31.5.1' for node 4"
    ]


def test_dead_node_in_a_service_group_is_named(good):
    nodes, groups = copy.deepcopy(good)
    groups["farm"].append("vca-node3")
    assert check_inventory(nodes, groups) == ["vca-node3: is dead but listed in service group farm"]


def test_card_and_cpu_must_follow_the_number(good):
    nodes, groups = copy.deepcopy(good)
    nodes["vca-node2"].update(vca_card=1, vca_cpu="0")
    errors = check_inventory(nodes, groups)
    assert "vca-node2: vca_card is 1, expected 0 for node 2" in errors
    assert "vca-node2: vca_cpu is '0', expected 2 for node 2" in errors
    assert "vca-node2: vca_card is 1 but the host is in group card0" in errors


def test_duplicate_and_missing_numbers(good):
    nodes, groups = copy.deepcopy(good)
    nodes["vca-node5"] = dict(nodes["vca-node4"])
    del nodes["vca-node1"]["vca_node"]
    errors = check_inventory(nodes, groups)
    assert "vca-node5: vca_node 4 is also used by vca-node4" in errors
    assert "vca-node1: vca_node is not set" in errors


def test_empty_required_group_and_strays(good):
    nodes, groups = copy.deepcopy(good)
    groups["smem_background"] = []
    groups["farm"].append("vca-host")
    errors = check_inventory(nodes, groups)
    assert "group smem_background: is empty or missing" in errors
    assert "vca-host: is in farm but not in vca_nodes" in errors


def test_module_fails_with_every_error_and_changes_nothing(good, capsys):
    nodes, groups = copy.deepcopy(good)
    nodes["vca-node4"]["vca_node_ip"] = "172.31.9.1"
    groups["smem_interactive"].append("vca-node3")
    result = run_module("vca_inventory_check", {"nodes": nodes, "groups": groups}, capsys)
    assert result["failed"] is True and result["changed"] is False
    assert "vca-node4: vca_node_ip" in result["msg"]
    assert "vca-node3: is dead but listed in service group smem_interactive" in result["msg"]
    ok = run_module("vca_inventory_check", {"nodes": good[0], "groups": good[1]}, capsys)
    assert ok.get("failed") is not True and ok["nodes_checked"] == 6


# Several VCA hosts: each host has a node subnet of its own (vca_node_subnet, default 172.31.0.0/16)
# and numbers its nodes from 0; each node names its host (vca_host_name; optional with one host).
def with_host2(text):
    """The template with its "# host 2" blocks uncommented (each ends at the next marker or the indent's end)."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        out.append(lines[i])
        marker = re.match(r"^(\s*)# host 2\b", lines[i])
        i += 1
        if marker:
            indent = marker.group(1)
            while (i < len(lines) and lines[i].startswith(indent + "# ")
                   and not re.match(r"^\s*# (card|host) \d+\b", lines[i])):
                out.append(indent + lines[i][len(indent) + 2:])
                i += 1
    return "\n".join(out) + "\n"


def fleet_of(inventory):
    """load()'s nodes with each one's vca_host_name, and each VCA host's vca_node_subnet."""
    nodes, groups, vm, inv = load(inventory)
    for host in nodes:
        nodes[host]["vca_host_name"] = vm.get_vars(host=inv.get_host(host)).get("vca_host_name")
    hosts = {h: {"vca_node_subnet": vm.get_vars(host=inv.get_host(h)).get("vca_node_subnet")}
             for h in groups["vca_host"]}
    return nodes, groups, hosts


@pytest.mark.parametrize("cards", [1, 2])
def test_the_template_validates_with_a_second_host(tmp_path, cards):
    inv = template_with(tmp_path, cards)
    (inv / "hosts.yml").write_text(with_host2((inv / "hosts.yml").read_text()))
    nodes, groups, hosts = fleet_of(inv)
    assert check_inventory(nodes, groups, hosts=hosts) == []
    layout, errors = fleet_layout(nodes, groups, hosts)
    assert errors == []
    assert layout == {
        "vca-host": {"node_subnet": "172.31.0.0/16", "nodes": ["vca-node%d" % n for n in range(3 * cards)]},
        "vcb-host": {"node_subnet": "172.30.0.0/16", "nodes": ["vcb-node0", "vcb-node1", "vcb-node2"]},
    }
    assert sorted(groups["card0"]) == ["vca-node0", "vca-node1", "vca-node2", "vcb-node0", "vcb-node1", "vcb-node2"]


def test_a_one_host_inventory_needs_no_host_name_and_no_subnet(good):
    nodes, groups = good
    layout, errors = fleet_layout(nodes, groups)
    assert errors == [] and layout == {"vca-host": {"node_subnet": "172.31.0.0/16", "nodes": sorted(nodes)}}


@pytest.fixture
def two_hosts(good):
    """The lab's six nodes under vca-host, and vcb-host with one card (nodes 0-2) on 172.30.0.0/16."""
    nodes, groups = copy.deepcopy(good)
    for host in nodes:
        nodes[host]["vca_host_name"] = "vca-host"
    for n in range(3):
        nodes["vcb-node%d" % n] = {"vca_host_name": "vcb-host", "vca_node": n, **expected(n, "172.30.0.0/16")}
        groups["vca_nodes"].append("vcb-node%d" % n)
        groups["card0"].append("vcb-node%d" % n)
    groups["vca_host"].append("vcb-host")
    hosts = {"vca-host": {}, "vcb-host": {"vca_node_subnet": "172.30.0.0/16"}}
    return nodes, groups, hosts


def test_two_hosts_with_node_0_each_validate(two_hosts):
    nodes, groups, hosts = two_hosts
    assert check_inventory(nodes, groups, hosts=hosts) == []
    assert expected(0, "172.30.0.0/16")["vca_node_ip"] == "172.30.1.1"
    assert fleet_layout(nodes, groups, hosts)[0]["vcb-host"]["nodes"] == ["vcb-node0", "vcb-node1", "vcb-node2"]


def test_overlapping_node_subnets_name_both_hosts(two_hosts):
    nodes, groups, hosts = two_hosts
    hosts["vcb-host"]["vca_node_subnet"] = "172.31.128.0/17"
    for n in range(3):
        nodes["vcb-node%d" % n]["vca_node_ip"] = expected(n, "172.31.128.0/17")["vca_node_ip"]
    assert check_inventory(nodes, groups, hosts=hosts) == [
        "vca-host and vcb-host: their node subnets 172.31.0.0/16 and 172.31.128.0/17 overlap; "
        "give each host a vca_node_subnet of its own"
    ]


def test_two_hosts_on_the_default_subnet_overlap(two_hosts):
    nodes, groups, hosts = two_hosts
    hosts["vcb-host"] = {}
    errors = check_inventory(nodes, groups, hosts=hosts)
    assert ("vca-host and vcb-host: their node subnets 172.31.0.0/16 and 172.31.0.0/16 overlap; "
            "give each host a vca_node_subnet of its own") in errors


def _two_host_names(nodes):
    nodes["vcb-node1"]["vca_host_name"] = ["vcb-host", "vca-host"]


def _an_unknown_host(nodes):
    nodes["vcb-node1"]["vca_host_name"] = "vcc-host"


def _no_host_named(nodes):
    del nodes["vca-node2"]["vca_host_name"]


def _node_number_twice(nodes):
    nodes["vcb-node2"].update(vca_node=1, **expected(1, "172.30.0.0/16"))


def _address_outside_subnet(nodes):
    nodes["vcb-node1"]["vca_node_ip"] = "172.31.2.1"


@pytest.mark.parametrize(("break_it", "error"), [
    (_two_host_names,
     "vcb-node1: vca_host_name names more than one host (vca-host, vcb-host); a node sits in one host's card"),
    (_an_unknown_host,
     "vcb-node1: vca_host_name is 'vcc-host', expected one host of group vca_host (vca-host, vcb-host)"),
    (_no_host_named,     # with several hosts, every node names its host
     "vca-node2: vca_host_name is not set; with several VCA hosts (vca-host, vcb-host) every node names the one "
     "it sits in"),
    (_node_number_twice,
     "vcb-node2: vca_node 1 is also used by vcb-node1 under host vcb-host"),
    (_address_outside_subnet,
     "vcb-node1: vca_node_ip is '172.31.2.1', expected '172.30.2.1' for node 1 in vcb-host's vca_node_subnet "
     "172.30.0.0/16"),
], ids=["node under two hosts", "unknown host", "several hosts, none named", "node number twice under one host",
        "address outside its host's subnet"])
def test_a_two_host_fault_is_named_with_its_host(two_hosts, break_it, error):
    nodes, groups, hosts = two_hosts
    break_it(nodes)
    assert check_inventory(nodes, groups, hosts=hosts) == [error]


@pytest.mark.parametrize(("subnet", "error"), [
    ("172.30.1.0/16", "vcb-host: vca_node_subnet is '172.30.1.0/16', expected an IPv4 network such as "
                      "172.31.0.0/16 (172.30.1.0/16 has host bits set)"),
    ("172.30.0.0/24", "vcb-host: vca_node_subnet 172.30.0.0/24 is too small: node n takes its (n+1)th /24, "
                      "so it needs /23 or wider"),
    ("172.30.0.0/23", "vcb-node1: node 1 does not fit in vcb-host's vca_node_subnet 172.30.0.0/23 "
                      "(its last node is 0)"),
])
def test_a_bad_or_small_subnet_is_named(two_hosts, subnet, error):
    nodes, groups, hosts = two_hosts
    hosts["vcb-host"]["vca_node_subnet"] = subnet
    assert error in check_inventory(nodes, groups, hosts=hosts)


def test_a_node_past_the_default_subnet_is_named(good):
    nodes, groups = copy.deepcopy(good)
    nodes["vca-node5"].update(vca_node=255, vca_card=85, vca_cpu=0)
    groups["card1"].remove("vca-node5")
    assert check_inventory(nodes, groups) == [
        "vca-node5: node 255 does not fit in vca-host's vca_node_subnet 172.31.0.0/16 (its last node is 254)"
    ]


def test_module_takes_the_hosts_and_returns_the_fleet(two_hosts, capsys):
    nodes, groups, hosts = two_hosts
    ok = run_module("vca_inventory_check", {"nodes": nodes, "groups": groups, "vca_hosts": hosts}, capsys)
    assert ok.get("failed") is not True and ok["nodes_checked"] == 9
    assert ok["fleet"]["vcb-host"] == {"node_subnet": "172.30.0.0/16", "nodes": ["vcb-node0", "vcb-node1", "vcb-node2"]}
    hosts["vcb-host"]["vca_node_subnet"] = "172.31.0.0/16"
    bad = run_module("vca_inventory_check", {"nodes": nodes, "groups": groups, "vca_hosts": hosts}, capsys)
    assert bad["failed"] is True and bad["changed"] is False
    assert "vca-host and vcb-host: their node subnets 172.31.0.0/16 and 172.31.0.0/16 overlap" in bad["msg"]


def test_the_module_documents_every_option_it_takes():
    module = load_library("vca_inventory_check")
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert all(isinstance(line, str) for line in doc["description"])
    assert sorted(doc["options"]) == ["groups", "nodes", "required_groups", "service_groups", "vca_hosts"]
    assert "fleet" in yaml.safe_load(module.RETURN)
