"""The node rule and inventory checks, on the shipped inventories and on broken ones."""

from __future__ import annotations

import copy
import re
import shutil

import pytest
import yaml
from ansible.inventory.manager import InventoryManager
from ansible.module_utils.vca_topology import check_inventory, expected
from ansible.parsing.dataloader import DataLoader
from ansible.vars.manager import VariableManager

from conftest import ROOT, run_module


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
