"""roles/vcamon and roles/prometheus on several VCA hosts, rendered by the real ansible-playbook
(tests/vcamon_render.py) for a made-up three-host inventory whose monitor is the second host: the
collector scrapes every host's agent at the address that agent binds on its own host (vca_lan_address,
else an IPv4 ansible_host), with a token file of its own; every target names its VCA host; the exposure
rows and Prometheus' scrape say the same. A host with no such address stops the run, named. A one-host
inventory renders no host of the kind (docs: roles/vcamon/README.md, "Several VCA hosts")."""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml
from vcamon_render import render

from conftest import ROOT

sys.path.insert(0, str(ROOT / "apps" / "vcamon" / "src"))

from vcamon.collector import load_targets, vca_hosts, vca_node_names

HOSTS = {
    "vca-host": {"ansible_host": "192.0.2.10"},                                # an IPv4 ansible_host
    "vcb-host": {"ansible_host": "vcb-host.example.lan"},                      # the monitor: loopback
    "vcc-host": {"ansible_host": "vcc-host.example.lan", "vca_lan_address": "192.0.2.12"},
}
NODES = {"vca-node0": ("vca-host", 0, "172.31.1.1"), "vcb-node0": ("vcb-host", 0, "172.30.1.1"),
         "vcc-node0": ("vcc-host", 0, "172.29.1.1"), "vcc-node1": ("vcc-host", 1, "172.29.2.1")}
TOKENS = "/etc/vcamon/agent-tokens/"


def inventory(tmp_path, hosts=HOSTS):
    data = {"all": {
        "vars": {"fleet_hosts": {"monitor": "vcb-host"}, "vca_credentials_dir": str(tmp_path / "credentials")},
        "children": {
            "vca_host": {"hosts": hosts},
            "vca_nodes": {"vars": {"vca_node_address": "{{ vca_node_ip }}"},
                          "hosts": {n: {"vca_host_name": h, "vca_node": i, "vca_card": 0, "vca_cpu": i,
                                        "vca_node_ip": ip} for n, (h, i, ip) in NODES.items()}},
            "dead": {"hosts": {"vcc-node1": {}}}}}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("multihost")
    run = render(ROOT, inventory(tmp), tmp / "out", tmp / "work")
    assert run.returncode == 0, run.stdout + run.stderr
    return tmp / "out"


def test_the_collector_scrapes_every_hosts_agent_where_it_binds(rendered):
    targets = json.loads((rendered / "vcb-host/targets.json").read_text())
    assert [(t["node"], t["vca_host"], t["url"], t["token_file"]) for t in targets] == [
        ("host", "vcb-host", "http://127.0.0.1:9478/metrics", TOKENS + "host"),
        ("vca-host", "vca-host", "http://192.0.2.10:9478/metrics", TOKENS + "vca-host"),
        ("vcc-host", "vcc-host", "http://192.0.2.12:9478/metrics", TOKENS + "vcc-host"),
        ("vca-node0", "vca-host", "http://172.31.1.1:9478/metrics", TOKENS + "vca-node0"),
        ("vcb-node0", "vcb-host", "http://172.30.1.1:9478/metrics", TOKENS + "vcb-node0"),
        ("vcc-node0", "vcc-host", "http://172.29.1.1:9478/metrics", TOKENS + "vcc-node0"),
        ("vcc-node1", "vcc-host", "http://172.29.2.1:9478/metrics", TOKENS + "vcc-node1")]
    assert [t.get("dead") for t in targets if "vca_node" in t] == [False, False, False, True]
    # one token file per target, copied for each machine of the inventory (the collector's own first)
    assert json.loads((rendered / "vcb-host/agents.json").read_text()) == [
        "vcb-host", "vca-host", "vca-node0", "vcb-node0", "vcc-host", "vcc-node0", "vcc-node1"]
    # vcamon's own reader takes it, and maps each host's vcactl lines to that host's nodes only
    loaded = load_targets(str(rendered / "vcb-host/targets.json"))
    assert vca_node_names(loaded) == {"host": {0: "vcb-node0"}, "vca-host": {0: "vca-node0"},
                                      "vcc-host": {0: "vcc-node0", 1: "vcc-node1"}}
    assert vca_hosts(loaded)["vcc-host"] == {"agent": "vcc-host", "nodes": ["vcc-node0", "vcc-node1"]}


def test_each_hosts_agent_binds_its_own_address_never_every_address(rendered):
    def exec_start(machine):
        unit = (rendered / machine / "vcamon-agent.service").read_text()
        return re.search(r"^ExecStart=(.*)$", unit, re.M).group(1)

    for machine, node, listen in [("vcb-host", "host", "127.0.0.1"), ("vca-host", "vca-host", "192.0.2.10"),
                                  ("vcc-host", "vcc-host", "192.0.2.12"), ("vcc-node0", "vcc-node0", "172.29.1.1")]:
        line = exec_start(machine)
        assert " --node %s --listen %s:9478 " % (node, listen) in line, line
        assert ("--vcactl vcactl" in line) == machine.endswith("-host")
    assert not [p for p in rendered.rglob("*") if p.is_file() and "0.0.0.0" in p.read_text()]
    assert not (rendered / "vca-host/targets.json").exists()         # the collector runs on the monitor only


def test_the_exposure_rows_say_who_scrapes_each_hosts_agent(rendered):
    rows = {r["machine"]: r for r in json.loads((rendered / "vcb-host/exposure.json").read_text())
            if r["service"] == "vcamon agent"}
    assert sorted(rows) == ["vca-host", "vca-node0", "vcb-host", "vcb-node0", "vcc-host", "vcc-node0"]   # live ones
    assert [(rows[m]["address"], rows[m]["clients"], rows[m]["metrics"]["credential_file"]) for m in
            ("vcb-host", "vca-host", "vcc-host", "vcc-node0")] == [
        ("127.0.0.1", ["loopback"], TOKENS + "host"), ("192.0.2.10", ["vcb-host"], TOKENS + "vca-host"),
        ("192.0.2.12", ["vcb-host"], TOKENS + "vcc-host"), ("172.29.1.1", ["vcb-host"], TOKENS + "vcc-node0")]


def test_prometheus_scrapes_each_hosts_agent_labelled_with_its_host(rendered):
    config = yaml.safe_load((rendered / "vcb-host/prometheus.yml").read_text())
    vcamon = {job["job_name"]: job for job in config["scrape_configs"] if job["job_name"].startswith("vcamon-")}
    static = {name: job["static_configs"][0] for name, job in vcamon.items()}
    assert static["vcamon-vca-host-9478"] == {"targets": ["192.0.2.10:9478"], "labels": {
        "machine": "vca-host", "role": "host", "vca_host": "vca-host"}}
    assert static["vcamon-vcc-node0-9478"]["labels"] == {"machine": "vcc-node0", "role": "node", "vca_host": "vcc-host"}
    assert static["vcamon-vcb-host-9478"]["targets"] == ["127.0.0.1:9478"]
    assert vcamon["vcamon-vcc-host-9478"]["authorization"] == {
        "credentials_file": "/etc/prometheus/credentials/vcamon-vcc-host-9478"}


def test_a_host_with_no_address_to_bind_stops_the_run_named(tmp_path):
    """(tests/test_fleet_roles.py checks the lookup's other refusals: a wildcard, loopback, a name)"""
    hosts = dict(HOSTS, **{"vcc-host": {"ansible_host": "vcc-host.example.lan"}})
    run = render(ROOT, inventory(tmp_path, hosts), tmp_path / "out", tmp_path / "work")
    assert run.returncode != 0
    said = re.sub(r"\s+", " ", run.stdout + run.stderr)
    assert ("vcc-host has no address on the LAN: set vca_lan_address (an IPv4 address) on it (its ansible_host "
            "'vcc-host.example.lan' is no IPv4 address on the LAN, and no default route address was gathered "
            "for it)") in said


def test_a_one_host_inventory_names_no_host_in_its_targets(tmp_path):
    """(inventory/production as shipped) the targets and the scrape are those of one host, as before."""
    run = render(ROOT, ROOT / "inventory/production", tmp_path / "out", tmp_path / "work")
    assert run.returncode == 0, run.stdout + run.stderr
    targets = json.loads((tmp_path / "out/vca-host/targets.json").read_text())
    assert [t["node"] for t in targets] == ["host", "vca-node0", "vca-node1", "vca-node2"]
    assert not [t for t in targets if "vca_host" in t]
    assert "vca_host:" not in (tmp_path / "out/vca-host/prometheus.yml").read_text()
    assert json.loads((tmp_path / "out/vca-host/agents.json").read_text()) == [
        "vca-host", "vca-node0", "vca-node1", "vca-node2"]
