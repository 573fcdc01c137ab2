"""An extra worker (one of the owner's other Linux machines, group extra_workers): roles/extra_worker's
firewall, rendered by ansible-playbook from the declared sockets and loaded into a real kernel, and
the LLM front reaching the worker at its LAN address (roles/llm_workers' vars).

In network namespaces (marker netns, root): a LAN with a VCA host, the extra worker and another PC.
Each socket the fleet declares for the worker takes its declared clients only; a port the fleet does
not declare is the owner's and stays as it was. molecule/llm_workers runs the same role on a
container and sends requests through HAProxy to the worker.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_vca_boot_crosshost import Net, netns_only, sh, wait_for

from conftest import ansible_playbook, role_play, role_template

LAN = {"vca-host": "10.231.78.1", "vcb-host": "10.231.78.2", "owner-pc": "10.231.78.5", "pc": "10.231.78.9"}
ROWS = [
    # an LLM worker at the PC's LAN address, for the front (vca-host), scraped by the monitor host
    {"machine": "owner-pc", "address": LAN["owner-pc"], "proto": "tcp", "port": 8420, "clients": ["vca-host"],
     "metrics": {"job": "llm-worker"}},
    # a socket on every address, declared for the front only
    {"machine": "owner-pc", "address": "*", "proto": "tcp", "port": 7100, "clients": ["vca-host", "loopback"]},
    # the owner's sshd, open to the LAN: not guarded
    {"machine": "owner-pc", "address": "*", "proto": "tcp", "port": 22, "clients": ["lan", "loopback"]},
    # another machine's row: not this worker's business
    {"machine": "vca-host", "address": LAN["vca-host"], "proto": "tcp", "port": 7300, "clients": ["owner-pc"]},
]
def render_plays(out: Path) -> str:
    """extra_worker's ruleset for each extra worker; llm_workers' view of the workers' addresses on each host."""
    return json.dumps([
        role_play("extra_workers", "extra_worker",
                  role_template("extra_worker", "worker-firewall.nft.j2", "%s/{{ inventory_hostname }}.nft" % out)),
        role_play("vca_host", "llm_workers",
                  {"ansible.builtin.copy": {"content": "{{ llm_workers_addresses | to_json }}", "mode": "0644",
                                            "dest": "%s/{{ inventory_hostname }}.llm.json" % out}})])


def inventory(**owner_pc) -> dict:
    return {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "extra_worker_exposure": {"sockets": ROWS}, "llm_workers_model": "m.gguf"},
        "children": {
            "vca_host": {"hosts": {"vca-host": {"vca_lan_address": LAN["vca-host"]},
                                   "vcb-host": {"vca_lan_address": LAN["vcb-host"],
                                                "vca_node_subnet": "172.30.0.0/16"}}},
            "vca_nodes": {"hosts": {"vca-node0": {"vca_host_name": "vca-host", "vca_node": 0, "vca_card": 0,
                                                  "vca_cpu": 0, "vca_node_ip": "172.31.1.1",
                                                  "vca_node_address": "172.31.1.1"}}},
            "extra_workers": {"hosts": {"owner-pc": owner_pc or {"vca_lan_address": LAN["owner-pc"]}}},
            "llm_workers": {"hosts": {"vca-node0": {}, "owner-pc": {}}}}}}


def render(tmp_path: Path, inv: dict) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "rendered"
    out.mkdir(exist_ok=True)
    return ansible_playbook(tmp_path, inv, render_plays(out)), out


def rendered(tmp_path: Path, inv: dict) -> Path:
    run, out = render(tmp_path, inv)
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def test_the_front_reaches_an_extra_worker_at_its_lan_address(tmp_path):
    out = rendered(tmp_path, inventory())
    assert json_of(out / "vca-host.llm.json") == {"vca-node0": "172.31.1.1", "owner-pc": LAN["owner-pc"]}
    # its IPv4 ansible_host, by fleet_host's one rule, where the inventory sets no vca_lan_address
    (tmp_path / "b").mkdir()
    out = rendered(tmp_path / "b", inventory(ansible_host="192.0.2.50"))
    assert json_of(out / "vca-host.llm.json")["owner-pc"] == "192.0.2.50"


def test_an_extra_worker_without_a_lan_address_stops_the_run_naming_what_to_set(tmp_path):
    run, _ = render(tmp_path, inventory(ansible_host="owner-pc.example.lan"))
    assert run.returncode != 0
    assert "owner-pc has no address on the LAN: set vca_lan_address" in run.stdout + run.stderr


def test_a_client_without_a_lan_address_stops_the_ruleset_naming_it(tmp_path):
    inv = inventory()
    inv["all"]["children"]["vca_host"]["hosts"]["vca-host"] = {"ansible_host": "vca-host.example.lan"}
    run, out = render(tmp_path, inv)
    assert run.returncode != 0 and not (out / "owner-pc.nft").exists()
    assert "vca-host has no address on the LAN: set vca_lan_address" in run.stdout + run.stderr


def test_the_ruleset_guards_the_declared_sockets_only_and_lets_the_monitor_scrape(tmp_path):
    inv = inventory()
    inv["all"]["vars"]["fleet_hosts"] = {"monitor": "vcb-host"}
    rules = (rendered(tmp_path, inv) / "owner-pc.nft").read_text()
    assert "%s . tcp . 8420," % LAN["owner-pc"] in rules                                  # guarded
    assert "tcp . 7100," in rules
    assert "tcp . 22," not in rules and "7300" not in rules                              # the LAN's; another's
    assert "%s . %s . tcp . 8420," % (LAN["vca-host"], LAN["owner-pc"]) in rules          # the front
    assert "%s . %s . tcp . 8420," % (LAN["vcb-host"], LAN["owner-pc"]) in rules          # the monitor: scraped
    assert "%s . tcp . 7100," % LAN["vca-host"] in rules
    assert "%s . tcp . 7100," % LAN["vcb-host"] not in rules                            # not scraped: not the monitor's


def json_of(path: Path):
    return json.loads(path.read_text())


@pytest.fixture
def lan(tmp_path):
    out = rendered(tmp_path, inventory())
    net = Net()
    try:
        machines = ("vca-host", "owner-pc", "pc")
        for machine in machines:
            net.add(machine)
        net.lan({machine: LAN[machine] for machine in machines})
        sh("nft", "-f", out / "owner-pc.nft", ns=net.ns("owner-pc"))
        yield net, tmp_path
    finally:
        net.close()


@netns_only
def test_a_declared_worker_socket_takes_its_clients_only_and_the_owners_own_ports_stay_open(lan):
    net, tmp = lan
    net.serve("owner-pc", LAN["owner-pc"], 8420, tmp / "worker.log")
    net.serve("owner-pc", "0.0.0.0", 7100, tmp / "any.log")
    net.serve("owner-pc", "0.0.0.0", 7200, tmp / "owners.log")
    time.sleep(0.5)
    assert net.connects("vca-host", LAN["owner-pc"], 8420, timeout=5)     # the front
    assert net.connects("vca-host", LAN["owner-pc"], 7100, timeout=5)
    assert net.connects("owner-pc", LAN["owner-pc"], 8420, timeout=5)     # the worker itself (loopback)
    assert not net.connects("pc", LAN["owner-pc"], 8420)                  # anyone else on the LAN
    assert not net.connects("pc", LAN["owner-pc"], 7100)
    assert net.connects("pc", LAN["owner-pc"], 7200, timeout=5)           # not the fleet's port: not its call
    assert sorted(wait_for(tmp / "worker.log", 2)) == sorted([LAN["vca-host"], LAN["owner-pc"]])
    assert wait_for(tmp / "any.log", 1) == [LAN["vca-host"]]
