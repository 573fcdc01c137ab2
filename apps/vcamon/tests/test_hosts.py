"""Several VCA hosts on one page: each host's agent scraped beside its nodes', each host's vcactl lines on
its own nodes (both number theirs from 0), and a host that does not answer said once, by its name, in
`vcamon status`, `vcamon fleet`, /api/fleet and the page in headless Chromium, its nodes unknown rather
than each an open problem."""

from __future__ import annotations

import json
import re

import pytest
from test_fleet import closed_port
from test_web import CHROMIUM, chromium, request, sections

from conftest import serving_text
from vcamon import cli, fleet
from vcamon.collector import Collector, load_targets
from vcamon.store import Store
from vcamon.web import start_web


def vcactl_line(node, state):
    """One node's vcactl state as a host agent exports it (1 for its state, 0 for another)."""
    other = "link_down" if state != "link_down" else "net_device_ready"
    return ('vcamon_vca_node_state{vca_node="%d",card="0",cpu="%d",state="%s",state_class="x"} 1\n'
            'vcamon_vca_node_state{vca_node="%d",card="0",cpu="%d",state="%s",state_class="x"} 0\n'
            % (node, node, state, node, node, other))


# What each machine's agent answers (a host's with its own nodes' vcactl lines, numbered from 0 on each).
ANSWERS = {
    "/vca-host": "# TYPE vcamon_vca_node_state gauge\n" + vcactl_line(0, "net_device_ready")
                 + "# TYPE vcamon_platform_info gauge\nvcamon_platform_info{platform=\"lab\"} 1\n",
    "/vcb-host": "# TYPE vcamon_vca_node_state gauge\n" + vcactl_line(0, "link_down")
                 + vcactl_line(1, "net_device_ready"),
    "/node": "# TYPE vcamon_temperature_celsius gauge\nvcamon_temperature_celsius{sensor=\"Package id 0\"} 50.0\n",
}


@pytest.fixture(scope="module")
def agents():
    with serving_text(ANSWERS) as base:
        yield base


def two_hosts(url):
    """targets.json as the role writes it for two hosts: url(machine) is where each agent answers."""
    return [{"node": "host", "vca_host": "vca-host", "url": url("vca-host")},
            {"node": "vcb-host", "vca_host": "vcb-host", "url": url("vcb-host")},
            {"node": "vca-node0", "vca_host": "vca-host", "vca_node": 0, "url": url("vca-node0")},
            {"node": "vcb-node0", "vca_host": "vcb-host", "vca_node": 0, "url": url("vcb-node0")},
            {"node": "vcb-node1", "vca_host": "vcb-host", "vca_node": 1, "url": url("vcb-node1")}]


def test_each_hosts_vcactl_lines_land_on_its_own_nodes(tmp_path, agents):
    """Both hosts number their nodes from 0: vcb-host's node 0 is vcb-node0, never vca-node0."""
    paths = {"vca-host": "/vca-host", "vcb-host": "/vcb-host"}
    store = Store(str(tmp_path / "vcamon.db"))
    Collector(store, two_hosts(lambda m: agents + paths.get(m, "/node")), interval=5).round()
    states = {r["node"]: r["vca_state"] for r in store.status()}
    assert states == {"host": None, "vcb-host": None, "vca-node0": "net_device_ready", "vcb-node0": "link_down",
                      "vcb-node1": "net_device_ready"}


@pytest.fixture
def vcb_down(tmp_path, agents):
    """A round in which vcb-host and its two nodes do not answer (the host is off): vca's all do."""
    closed = "http://127.0.0.1:%d/metrics" % closed_port()
    urls = {"vca-host": agents + "/vca-host", "vca-node0": agents + "/node"}
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(two_hosts(lambda m: urls.get(m, closed))))
    db = str(tmp_path / "vcamon.db")
    Collector(Store(db), load_targets(str(targets)), interval=5).round()
    return db


def test_a_host_that_does_not_answer_is_one_open_item_by_its_name(vcb_down):
    view = fleet.view(Store(vcb_down))
    assert [(i["what"], i["where"]) for i in view["open"]] == [("host down", "vcb-host")]
    assert view["open"][0]["detail"].endswith("its nodes unknown: vcb-node0, vcb-node1")
    assert [(h["host"], h["state"]) for h in view["hosts"]] == [("vca-host", "up"), ("vcb-host", "down")]
    agents = {r["node"]: r for r in view["runs"] if r["service"] == "vcamon agent"}
    assert [agents[n]["vca_host"] for n in ("host", "vca-node0", "vcb-host", "vcb-node0")] == [
        "vca-host", "vca-host", "vcb-host", "vcb-host"]
    assert agents["vcb-node0"]["unknown"] and not agents["vcb-node0"]["up"]
    assert not agents["vcb-host"]["unknown"] and not agents["vcb-host"]["up"]
    assert agents["vca-node0"]["up"] and not agents["vca-node0"]["unknown"]


def test_vcamon_status_and_fleet_group_by_host_and_name_the_one_down(vcb_down, capsys):
    assert cli.main(["status", "--db", vcb_down]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[1]: line.split() for line in out.splitlines()[1:6]}
    assert out.splitlines()[0].split()[:3] == ["host", "node", "agent"]
    assert [rows[n][0] for n in ("host", "vca-node0", "vcb-host", "vcb-node0", "vcb-node1")] == [
        "vca-host", "vca-host", "vcb-host", "vcb-host", "vcb-host"]
    assert [line.split()[1] for line in out.splitlines()[1:6]] == [
        "host", "vca-node0", "vcb-host", "vcb-node0", "vcb-node1"]          # each host's agent first
    assert (rows["vcb-host"][2], rows["vcb-node0"][2], rows["vca-node0"][2]) == ("DOWN", "unknown", "up")
    assert re.search(r"^vcb-host DOWN: its agent does not answer \(URLError.*\); its nodes' state is unknown: "
                     r"vcb-node0, vcb-node1$", out, re.M)
    assert cli.main(["fleet", "--db", vcb_down]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "hosts: vca-host up, vcb-host DOWN"
    assert re.search(r"^  host down +vcb-host +agent: URLError", out, re.M)
    assert "node down" not in out
    assert re.search(r"^  vcamon agent +vcb-host +vcb-node0 +unknown \(its host does not answer\)$", out, re.M)


def test_the_page_shows_each_host_and_the_one_down(vcb_down):
    server = start_web("127.0.0.1:0", vcb_down)
    base = "http://127.0.0.1:%d" % server.server_address[1]
    try:
        nodes = {n["node"]: n for n in json.loads(request(base, "/api/nodes")[2])["nodes"]}
        assert nodes["vcb-node1"]["unknown"] and nodes["vcb-node1"]["vca_host"] == "vcb-host"
        assert CHROMIUM, "chromium is not installed (scripts/bootstrap-host.sh installs it)"
        dom = chromium("--dump-dom", base + "/?range=1h").stdout
    finally:
        server.shutdown()
        server.server_close()
    assert 'data-ready="1"' in dom, dom[-2000:]
    hosts = re.findall(r'<tr class="vca-host" data-host="([^"]+)" data-state="([^"]+)">', dom)
    assert hosts == [("vca-host", "up"), ("vcb-host", "down")]
    status = re.search(r'<table id="status">.*?</table>', dom, re.S).group(0)
    order = re.findall(r'<tr class="vca-host" data-host="([^"]+)"|<tr><td>([^<]+)</td>', status)
    assert [a or b for a, b in order] == ["vca-host", "host", "vca-node0", "vcb-host", "vcb-host", "vcb-node0",
                                          "vcb-node1"]
    _, rows = sections(dom)
    assert '<td class="unknown"' in rows["vcb-node0"] and ">unknown</td>" in rows["vcb-node0"]
    assert ">down</td>" in rows["vcb-host"] and '<td class="unknown"' not in rows["vca-node0"]
    assert re.search(r'<li data-what="host down"><b>host down</b>: vcb-host \(agent: URLError', dom)
    assert 'data-what="node down"' not in dom
    assert re.search(r'<tr data-service="vcamon agent" data-node="vcb-node0"><td>vcamon agent</td>\s*'
                     r'<td>vcb-host</td><td>vcb-node0</td><td class="unknown"', dom)


def test_a_host_whose_agent_alone_is_down_keeps_its_nodes_up(tmp_path, agents):
    """vcb-host's nodes answer (through vcb-host): the host is up, only its agent is not."""
    closed = "http://127.0.0.1:%d/metrics" % closed_port()
    store = Store(str(tmp_path / "vcamon.db"))
    targets = two_hosts(lambda m: closed if m == "vcb-host" else agents + ("/vca-host" if m == "vca-host" else "/node"))
    Collector(store, targets, interval=5).round()
    view = fleet.view(store)
    assert [(i["what"], i["where"]) for i in view["open"]] == [("host agent down", "vcb-host")]
    assert "unknown" not in view["open"][0]["detail"]
    assert {r["node"]: r["up"] for r in view["runs"] if r["service"] == "vcamon agent"}["vcb-node0"] is True


@pytest.mark.parametrize("change, said", [
    (lambda t: t[2].pop("vca_host"), "targets vca-node0 name no vca_host, the others do"),
    (lambda t: t[1].update(vca_host="vca-host"), "VCA host vca-host has 2 agents (host, vcb-host)"),
    (lambda t: t[4].update(vca_node=0), "vca_node 0 of host vcb-host is given to vcb-node0 and vcb-node1"),
    (lambda t: t[0].update(vca_host=""), "target 0: 'vca_host' must be a host's name"),
])
def test_targets_of_several_hosts_are_checked(tmp_path, change, said):
    targets = two_hosts(lambda m: "http://127.0.0.1:9/metrics")
    change(targets)
    path = tmp_path / "targets.json"
    path.write_text(json.dumps(targets))
    with pytest.raises(ValueError, match=re.escape(said)):
        load_targets(str(path))


def test_one_host_shows_no_host_column(tmp_path, agents):
    """A one-host targets.json (no vca_host) keeps the page and the commands as they were."""
    store = Store(str(tmp_path / "vcamon.db"))
    Collector(store, [{"node": "host", "url": agents + "/vca-host"},
                      {"node": "vca-node0", "vca_node": 0, "url": agents + "/node"}], interval=5).round()
    view = fleet.view(store)
    assert view["hosts"] == [] and all("vca_host" not in r for r in view["runs"])
    assert {r["node"]: r["vca_state"] for r in store.status()}["vca-node0"] == "net_device_ready"
    table = cli.status_table(fleet.label_nodes(store.status(), {}), 0)
    assert table.split()[0] == "node"
