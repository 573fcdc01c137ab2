"""site.yml's first play on broken inventories: it fails naming host and field, before any change.

These run the real ansible-playbook against copies of the lab inventory. The
validation play runs on the controller only, so no lab container is needed:
if validation let a broken inventory through, the next play would try to reach
the (absent) containers and the assertions on the output would fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.vca_topology import expected

from conftest import ROOT

PLAYBOOK = str(ROOT / "site.yml")


def copy_inventory(tmp_path: Path) -> Path:
    dest = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventory" / "lab", dest, symlinks=False)
    return dest


def edit_hosts(inv: Path, change) -> None:
    hosts = inv / "hosts.yml"
    data = yaml.safe_load(hosts.read_text())
    change(data["all"]["children"])
    hosts.write_text(yaml.safe_dump(data))


def site(inv: Path, *extra: str) -> subprocess.CompletedProcess:
    # Local connection for every host: these runs validate and must never reach a machine
    # (the lab's docker connection would also need a Docker CLI on a machine that has none).
    extra = ("-e", "ansible_connection=local", *extra)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               VCA_LAB_NAME="vcafleet-nonexistent")
    bindir = Path(sys.executable).parent
    return subprocess.run([str(bindir / "ansible-playbook"), "-i", str(inv), PLAYBOOK, *extra],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False)


@pytest.mark.parametrize("check", [False, True])
def test_ip_that_disagrees_with_the_node_number_stops_site(tmp_path, check):
    inv = copy_inventory(tmp_path)

    def wrong_ip(groups):
        groups["lab"]["children"]["vca_nodes"]["children"]["card1"]["hosts"]["vca-node4"]["vca_node_ip"] = "172.31.9.1"

    edit_hosts(inv, wrong_ip)
    run = site(inv, *(["--check"] if check else []))
    assert run.returncode != 0
    assert "vca-node4: vca_node_ip is '172.31.9.1', expected '172.31.5.1' for node 4" in run.stdout
    assert "PLAY [VCA host]" not in run.stdout          # nothing after the first play ran


def test_dead_node_in_a_service_group_stops_site(tmp_path):
    inv = copy_inventory(tmp_path)
    edit_hosts(inv, lambda groups: groups["farm"]["hosts"].update({"vca-node3": None}))
    run = site(inv)
    assert run.returncode != 0
    assert "vca-node3: is dead but listed in service group farm" in run.stdout
    assert "PLAY [VCA host]" not in run.stdout


def test_valid_inventory_passes_validation(tmp_path):
    inv = copy_inventory(tmp_path)
    run = site(inv, "--tags", "always")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Check every node against the topology rule" in run.stdout


def test_the_production_template_passes_validation_as_shipped(tmp_path):
    """inventory/production is the owner's starting point: site.yml's checks pass on it unedited."""
    inv = tmp_path / "mysite"
    shutil.copytree(ROOT / "inventory" / "production", inv)
    run = site(inv, "--tags", "always")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Check every node against the topology rule" in run.stdout


def add_second_host(groups, subnet="172.30.0.0/16"):
    """vcb-host with one card (its nodes 0-2 on its own subnet); every node names its host."""
    lab = groups["lab"]["children"]
    lab["vca_host"]["hosts"]["vcb-host"] = {"vca_node_subnet": subnet}
    for card in lab["vca_nodes"]["children"].values():
        for hv in card["hosts"].values():
            hv["vca_host_name"] = "vca-host"
    lab["vca_nodes"]["children"]["card0"]["hosts"].update({
        "vcb-node%d" % n: {"vca_host_name": "vcb-host", "vca_node": n, **expected(n, subnet)} for n in range(3)})


def test_a_valid_two_host_inventory_passes_the_check_then_stops_before_any_change(tmp_path):
    inv = copy_inventory(tmp_path)
    edit_hosts(inv, add_second_host)
    run = site(inv)
    assert run.returncode != 0
    check_task = run.stdout.split("TASK [Check every node against the topology rule")[1].split("TASK [")[0]
    assert "ok: [localhost]" in check_task
    said = " ".join(run.stdout.split())     # the message, however the callback wraps it
    assert "describes 2 VCA hosts (vca-host, vcb-host), but site.yml deploys one host so far" in said
    assert "PLAY [VCA host]" not in run.stdout


def test_two_hosts_on_overlapping_node_subnets_stop_site(tmp_path):
    inv = copy_inventory(tmp_path)
    edit_hosts(inv, lambda groups: add_second_host(groups, subnet="172.31.128.0/17"))
    run = site(inv)
    assert run.returncode != 0
    assert ("vca-host and vcb-host: their node subnets 172.31.0.0/16 and 172.31.128.0/17 overlap; "
            "give each host a vca_node_subnet of its own") in run.stdout
    assert "PLAY [VCA host]" not in run.stdout


def test_a_fleet_role_given_to_a_node_stops_site(tmp_path):
    run = site(copy_inventory(tmp_path), "-e", '{"fleet_hosts": {"farm": "vca-node0"}}')
    assert run.returncode != 0
    said = " ".join(run.stdout.split())
    assert "fleet_hosts gives role 'farm' to 'vca-node0', which is not a VCA host (group vca_host: vca-host)" in said
    assert "PLAY [VCA host]" not in run.stdout


def test_an_extra_worker_that_is_also_a_node_stops_site(tmp_path):
    inv = copy_inventory(tmp_path)
    edit_hosts(inv, lambda groups: groups.update(extra_workers={"hosts": {"owner-pc": None, "vca-node1": None}}))
    run = site(inv)
    assert run.returncode != 0
    said = " ".join(run.stdout.split())
    assert "vca-node1 is in extra_workers and in vca_nodes: a machine is a VCA host, a node or an extra worker" in said
    assert "PLAY [VCA host]" not in run.stdout


def test_a_two_host_inventory_names_each_hosts_nodes_and_the_fleet_roles(tmp_path):
    inv = copy_inventory(tmp_path)
    edit_hosts(inv, add_second_host)
    run = site(inv, "-e", '{"fleet_hosts": {"smem": "vcb-host"}}')
    said = " ".join(run.stdout.split()).replace("''", "'")   # the YAML callback's quoted quote
    assert "farm: vca-host; llm_front: vca-host; smem: vcb-host; monitor: vca-host; image_builder: vca-host;" in said
    assert ("vca-host's nodes: vca-node0, vca-node1, vca-node2, vca-node3, vca-node4, vca-node5; "
            "vcb-host's nodes: vcb-node0, vcb-node1, vcb-node2; extra workers: none") in said
