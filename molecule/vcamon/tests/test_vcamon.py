"""vcamon on its own small lab (molecule/vcamon): rows from every live node, down rows for node 3, status, page,
where each agent and the page listen, and the platform of every node.

The lab's machines are addressed as docker://<lab>-host, docker://<lab>-node<n> (the lab name from VCA_LAB_NAME).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
import testinfra

LAB = os.environ.get("VCA_LAB_NAME", "vcamolmon")
STATE = Path("/var/lib/vcafleet-lab") / LAB        # the lab's state: its credentials, the host's LAN address


@pytest.fixture(scope="module")
def host():
    return testinfra.get_host(f"docker://{LAB}-host")


DB = "/var/lib/vcamon/vcamon.db"
LIVE = {"host", "vca-node0", "vca-node4"}


def unit_listen(machine, unit):
    """The --listen of a vcamon unit as installed: addr:port."""
    text = machine.file("/etc/systemd/system/%s" % unit).content_string
    return re.search(r"--listen (\S+)", text).group(1)


def fetch(host, url, token=None):
    """url fetched from inside the lab host, as text (with Authorization: Bearer token, if given)."""
    headers = {"Authorization": "Bearer " + token} if token else {}
    return host.check_output("python3 -c %s" % json.dumps(
        "import urllib.request as u; print(u.urlopen(u.Request(%r, headers=%r), timeout=10).read().decode())"
        % (url, headers)))


STATUS = """
import sys, urllib.request as u, urllib.error as e
try:
    print(u.urlopen(sys.argv[1], timeout=10).status)
except e.HTTPError as x:
    print(x.code)
"""


def status_of(host, url):
    """The HTTP status of a request without credentials, from inside the lab host."""
    return int(host.check_output("python3 -c %s %s" % (shlex.quote(STATUS), shlex.quote(url))))


def sql(host, query):
    script = "import json, sqlite3; print(json.dumps(sqlite3.connect(%r).execute(%r).fetchall()))" % (DB, query)
    return json.loads(host.check_output("python3 -c %s" % json.dumps(script)))


@pytest.fixture(scope="module")
def collected(host):
    """Wait for at least four scrape rounds (3 s apart) after the converge; the deadline is
    generous so that a busy machine makes the test slower, never red."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        rounds = sql(host, "SELECT count(DISTINCT ts) FROM scrapes") if host.file(DB).exists else [[0]]
        if rounds[0][0] >= 4:
            return
        time.sleep(1)
    pytest.fail("the collector stored fewer than 4 rounds in 180 s")


def test_services_enabled_and_running(host):
    for unit in ("vcamon-agent.service", "vcamon-collector.service"):
        assert host.service(unit).is_enabled and host.service(unit).is_running


def test_rows_from_every_live_node(host, collected):
    up = dict(sql(host, "SELECT node, sum(up) FROM scrapes GROUP BY node"))
    assert {n for n, count in up.items() if count >= 3} == LIVE
    nodes_with_temps = {n for (n,) in sql(host, "SELECT DISTINCT s.node FROM samples v JOIN series s "
                                                 "ON s.id = v.series_id WHERE s.metric = 'temp'")}
    assert nodes_with_temps == {"vca-node0", "vca-node4"}     # the lab host has no simulated sensors
    caps = dict(sql(host, "SELECT node, watts FROM caps WHERE constraint_name = 'long_term'"))
    assert caps["vca-node0"] == 45.0


def test_down_rows_and_event_for_dead_node3(host, collected):
    rows = sql(host, "SELECT up, error FROM scrapes WHERE node = 'vca-node3'")
    assert len(rows) >= 3 and all(up == 0 and err for up, err in rows)
    assert sql(host, "SELECT count(*) FROM events WHERE node = 'vca-node3' AND kind = 'down'") == [[1]]


def test_status_command(host, collected):
    out = host.check_output("vcamon status")
    table, _, notes = out.partition("\n\n")                   # the table, then what its platforms mean
    lines = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert set(lines) == LIVE | {"vca-node3"}
    assert "DOWN" in lines["vca-node3"] and "link_down" in lines["vca-node3"]
    assert "up" in lines["vca-node0"] and "net_device_ready" in lines["vca-node0"]
    assert lines["vca-node0"][2] == lines["vca-node4"][2] == "lab" and "lab: " in notes


def test_no_lab_figure_is_recorded_as_hardware(host, collected):
    platforms = dict(sql(host, "SELECT node, platform FROM nodes"))
    assert platforms["vca-node0"] == platforms["vca-node4"] == "lab"
    assert "hardware" not in platforms.values()
    assert {p for (p,) in sql(host, "SELECT DISTINCT platform FROM platforms")} <= {"lab", "unknown"}


def test_agents_listen_where_the_collector_scrapes_them_and_nowhere_else(host, collected):
    listed = json.loads(host.file("/etc/vcamon/targets.json").content_string)
    targets = {t["node"]: urlparse(t["url"]).netloc for t in listed}
    assert targets["host"] == "127.0.0.1:9478"
    assert unit_listen(host, "vcamon-agent.service") == targets["host"]
    assert not host.socket("tcp://0.0.0.0:9478").is_listening
    for node in LIVE - {"host"}:
        n = int(node[-1])
        machine = testinfra.get_host(f"docker://{LAB}-node{n}")
        address = f"172.31.{n + 1}.1"                          # its link address, as on a card
        assert unit_listen(machine, "vcamon-agent.service") == targets[node] == f"{address}:9478"
        assert machine.socket(f"tcp://{address}:9478").is_listening
        assert status_of(host, f"http://{address}:9478/metrics") == 401      # the collector's token, or nothing
        assert not machine.socket("tcp://0.0.0.0:9478").is_listening
        assert not machine.socket("tcp://127.0.0.1:9478").is_listening


def test_page_and_chart_api(host, collected):
    listen = unit_listen(host, "vcamon-collector.service")
    lan = (STATE / "lan-address").read_text().strip()
    assert listen == f"{lan}:9480"                           # inventory/lab/group_vars/vca_host/vcamon.yml
    assert not host.socket("tcp://0.0.0.0:9480").is_listening
    token = (STATE / "credentials" / "vcamon-web-token").read_text().split()[0]
    assert status_of(host, f"http://{listen}/") == 401      # on the LAN: a token, or nothing
    page = fetch(host, f"http://{listen}/", token)
    assert "/static/vendor/uPlot.iife.min.js" in page
    chart = json.loads(fetch(host, f"http://{listen}/api/chart?node=vca-node4&range=1h", token))
    assert len(chart["t"]) >= 3 and chart["temps"] and chart["platforms"] == ["lab"]
