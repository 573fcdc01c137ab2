"""The fleet page: services scraped with their own credentials, the newest bench records with their platform,
what is open; through the collector into the store, out as JSON, as text and in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image
from test_web import CHROMIUM, chromium, request

from conftest import serving_text
from vcamon import cli, fleet
from vcamon.agent import parse_units, start_agent
from vcamon.collector import Collector, load_targets
from vcamon.store import Scrape, Store
from vcamon.web import start_web

SMEM = """# TYPE smem_documents gauge
smem_documents{status="done"} 12.0
smem_documents{status="failed"} 2.0
# TYPE smem_worker_up gauge
smem_worker_up{worker="ingest-0"} 1.0
smem_worker_up{worker="ingest-1"} 0.0
# TYPE smem_queue_oldest_due_age_seconds gauge
smem_queue_oldest_due_age_seconds 900.0
# TYPE smem_queue_last_progress_age_seconds gauge
smem_queue_last_progress_age_seconds 700.0
# TYPE smem_lane_node_leased gauge
smem_lane_node_leased{lane="background",node="vca-node4"} 1.0
smem_lane_node_leased{lane="interactive",node="vca-node0"} 0.0
"""
FARM = """# TYPE farm_jobs gauge
farm_jobs{state="done"} 4.0
farm_jobs{state="failed"} 1.0
# TYPE farm_job_last_progress_age_seconds gauge
farm_job_last_progress_age_seconds{job_id="j-slow"} 1200.0
farm_job_last_progress_age_seconds{job_id="j-fine"} 30.0
"""
HAPROXY = """# TYPE haproxy_server_status gauge
haproxy_server_status{proxy="llm_workers",server="vca-node1",state="DRAIN"} 1
haproxy_server_status{proxy="llm_workers",server="vca-node1",state="UP"} 0
haproxy_server_status{proxy="llm_workers",server="vca-node0",state="DRAIN"} 0
haproxy_server_status{proxy="llm_workers",server="vca-node0",state="UP"} 1
"""
TOKENS = {"/smem": "smem-metrics-token-0123456789", "/farm": "farm-metrics-token-0123456789",
          "/llm-worker": "worker-key-of-vca-node1-0123"}


@pytest.fixture(scope="module")
def exporters():
    """One real HTTP server answering as the three services do, each path behind its own token."""
    bodies = {"/smem": SMEM, "/farm": FARM, "/haproxy": HAPROXY,
              "/llm-worker": "# TYPE llamacpp:requests_processing gauge\n"}

    with serving_text(bodies, TOKENS) as base:
        yield base


def closed_port():
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return port


@pytest.fixture
def config(tmp_path, exporters):
    (tmp_path / "smem.token").write_text(TOKENS["/smem"] + "\n")
    # a key map, as smem's lanes keep theirs
    (tmp_path / "keys.json").write_text(json.dumps({"vca-host": TOKENS["/farm"]}))
    # HAProxy's map of the workers' keys: one `name key` a line
    (tmp_path / "workers.map").write_text("vca-node0 worker-key-of-vca-node0-0123\n"
                                          "vca-node1 %s\n" % TOKENS["/llm-worker"])
    records = tmp_path / "records"
    records.mkdir()
    services = [
        {"job": "smem", "node": "vca-host", "url": exporters + "/smem",
         "credential_file": str(tmp_path / "smem.token")},
        {"job": "farm", "node": "vca-host", "url": exporters + "/farm", "credential_file": str(tmp_path / "keys.json"),
         "credential_json_key": "vca-host"},
        {"job": "haproxy", "node": "vca-host", "url": exporters + "/haproxy"},
        {"job": "llm-worker", "node": "vca-node1", "url": exporters + "/llm-worker",
         "credential_file": str(tmp_path / "workers.map"), "credential_map_key": "vca-node1"},
        {"job": "llama-server", "node": "vca-node0", "url": "http://127.0.0.1:%d/metrics" % closed_port()},
    ]
    path = tmp_path / "fleet.json"
    path.write_text(json.dumps({"services": services, "records_dir": str(records)}))
    return path


def write_run(records, name, files):
    run = records / name
    run.mkdir()
    for fname, content in files.items():
        (run / fname).write_text(content if isinstance(content, str) else json.dumps(content))


def gemm_result(gflops, platform):
    return {"record": {"platform": platform, "results": [{"gflops": gflops / 2}, {"gflops": gflops}]}}


@pytest.fixture
def records(config):
    records = config.parent / "records"
    write_run(records, "gemm-20261201T100000Z", {"vca-node0.json": {"host": "vca-node0",
              "opencl": gemm_result(10.0, "lab"), "cpu": gemm_result(5.0, "lab")}})
    write_run(records, "gemm-20261205T120000Z", {   # the newest GEMM run: the one the page shows
        "vca-node0.json": {"host": "vca-node0", "opencl": gemm_result(412.34, "lab"), "cpu": gemm_result(88.8, "lab")},
        "vca-node4.json": {"host": "vca-node4", "opencl": {"aborted": "thermal"}, "cpu": gemm_result(91.0, "lab")}})
    write_run(records, "dma-20261204T080000Z", {
        "vca-node0.json": {"host": "vca-node0", "result": {"record": {"platform": "hardware", "engines": [
            {"path": "host->node0", "legs": [{"mibps": 5100.4}, {"mibps": 6300.6}, {"mibps": None}]}]}}},
        "vca-node4.json": {"host": "vca-node4", "result": {"msg": "no PLX DMA engine"}},
        "ring.json": {"legs": []}})
    write_run(records, "capacity-20261203T000000Z", {"record.json": "{not json"})
    (records / "notes").mkdir()                   # anything else in the directory is not a run
    return records


def test_the_newest_run_of_each_kind_with_every_figures_platform(records):
    runs = {r["kind"]: r for r in fleet.latest_records(str(records))}
    assert runs["gemm"]["run"] == "gemm-20261205T120000Z"
    assert runs["gemm"]["at"] == 1796472000      # 2026-12-05 12:00 UTC
    assert [(f["what"], f["value"], f["platform"]) for f in runs["gemm"]["figures"]] == [
        ("vca-node0 OpenCL", 412.3, "lab"), ("vca-node0 CPU", 88.8, "lab"), ("vca-node4 CPU", 91.0, "lab")]
    assert runs["gemm"]["platform"] == "lab"
    assert [(f["what"], f["value"], f["unit"], f["platform"]) for f in runs["dma"]["figures"]] == [
        ("vca-node0 host->node0 best leg", 6301, "MiB/s", "hardware")]
    assert "error" not in runs["dma"]
    assert runs["capacity"]["figures"] == [] and runs["capacity"]["error"].startswith("JSONDecodeError")
    assert fleet.latest_records(str(records / "absent")) == [] and fleet.latest_records(None) == []


def test_two_platforms_in_one_run_are_called_mixed(records):
    write_run(records, "gemm-20261206T000000Z", {
        "a.json": {"host": "a", "opencl": gemm_result(1.0, "lab")},
        "b.json": {"host": "b", "opencl": gemm_result(2.0, "hardware")}})
    [gemm] = [r for r in fleet.latest_records(str(records)) if r["kind"] == "gemm"]
    assert gemm["platform"] == "mixed: hardware, lab"


def test_each_service_is_scraped_with_its_own_credential(config):
    scraped = fleet.scrape_services(fleet.load_config(config), timeout=5)
    by_job = {s["job"]: s for s in scraped["services"]}
    assert by_job["smem"]["up"] and by_job["farm"]["up"] and by_job["haproxy"]["up"]
    assert by_job["llm-worker"]["up"], by_job["llm-worker"]["error"]   # its own line of the map, not the file
    assert not by_job["llama-server"]["up"] and "Connection refused" in by_job["llama-server"]["error"]
    assert ["smem_worker_up", {"worker": "ingest-1"}, 0.0] in by_job["smem"]["samples"]
    wrong = dict(fleet.load_config(config)["services"][0], credential_file=str(config.parent / "keys.json"),
                 credential_json_key="vca-host")             # farm's token sent to smem
    assert fleet.scrape_service(wrong)["error"] == "HTTP 401"


def test_what_is_open_names_each_fault_where_it_is(config):
    services = fleet.scrape_services(fleet.load_config(config), timeout=5)["services"]
    nodes = [{"node": "vca-node3", "up": False, "vca_state": "link_down", "error": "URLError", "throttle_24h": 0},
             {"node": "vca-node4", "up": True, "vca_state": "net_device_ready", "error": None, "throttle_24h": 7},
             {"node": "vca-node0", "up": True, "vca_state": "net_device_ready", "error": None, "throttle_24h": 0}]
    items = [(i["what"], i["where"]) for i in fleet.open_items(nodes, services)]
    assert items == [
        ("node down", "vca-node3"), ("service down", "llama-server on vca-node0"),
        ("failed documents", "smem"), ("worker dead", "smem ingest-1"), ("queue stuck", "smem"),
        ("node leased", "vca-node4"), ("failed jobs", "farm"), ("job stuck", "farm job j-slow"),
        ("worker drained", "vca-node1"), ("throttle events", "vca-node4")]


def test_a_quiet_fleet_has_nothing_open():
    services = [{"job": "smem", "node": "h", "up": True, "error": None, "samples": [
        ["smem_documents", {"status": "failed"}, 0.0], ["smem_worker_up", {"worker": "w"}, 1.0],
        ["smem_queue_oldest_due_age_seconds", {}, 900.0], ["smem_queue_last_progress_age_seconds", {}, 5.0]]}]
    nodes = [{"node": "n", "up": True, "vca_state": "net_device_ready", "error": None, "throttle_24h": 0}]
    assert fleet.open_items(nodes, services) == []


def test_a_bad_fleet_file_is_refused_with_its_reason(tmp_path):
    bad = tmp_path / "fleet.json"
    bad.write_text(json.dumps({"services": [{"job": "smem", "url": "http://x"}]}))
    with pytest.raises(ValueError, match="service 0 needs 'job', 'node' and 'url'"):
        fleet.load_config(bad)


@pytest.fixture
def collected(tmp_path, config, records):
    """A collector round with the fleet configured, into a real store (the nodes on hardware)."""
    db = str(tmp_path / "vcamon.db")
    store = Store(db)
    store.record_round(int(time.time()) - 60, [
        Scrape(node="vca-node0", ok=True, temps={"Package id 0": 50.0}, power_w=20.0, platform="hardware"),
        Scrape(node="vca-node3", ok=False, error="URLError: timed out")])
    Collector(store, [], interval=5, fleet_config=fleet.load_config(config)).round()
    store.close()
    return db


def test_the_collector_keeps_the_services_and_the_cli_prints_three_sections(collected, capsys):
    view = fleet.view(Store(collected))
    runs = {(r["service"].rsplit(" :", 1)[0], r["node"], r["up"]) for r in view["runs"]}   # "<job> metrics :<port>"
    assert runs >= {("vcamon agent", "vca-node0", True), ("vcamon agent", "vca-node3", False),
                    ("smem metrics", "vca-host", True), ("llama-server metrics", "vca-node0", False)}
    assert [r["kind"] for r in view["numbers"]] == ["gemm", "dma", "capacity"]
    assert cli.main(["fleet", "--db", collected]) == 0
    out = capsys.readouterr().out
    assert out.index("what runs") < out.index("numbers that matter") < out.index("what is open")
    assert "gemm, 2026-12-05 12:00 UTC, platform: lab" in out and "vca-node0 OpenCL" in out
    assert "worker drained    vca-node1" in out and "node down         vca-node3" in out
    assert cli.main(["fleet", "--db", collected, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["open"]


LAB_BADGE = (255, 243, 205)         # .badge.lab's background (vcamon.css)


def test_the_page_shows_the_three_sections_with_data(collected, tmp_path):
    server = start_web("127.0.0.1:0", collected)
    base = "http://127.0.0.1:%d" % server.server_address[1]
    try:
        status, _, body = request(base, "/api/fleet")
        assert status == 200 and json.loads(body)["numbers"][0]["figures"][0]["value"] == 412.3
        assert CHROMIUM, "chromium is not installed (scripts/bootstrap-host.sh installs it)"
        dom = chromium("--dump-dom", base + "/?range=1h").stdout
        assert 'data-ready="1"' in dom, dom[-2000:]
        assert re.search(r'<tr data-service="smem metrics :\d+" data-node="vca-host">', dom)
        assert '<table data-kind="gemm">' in dom and "412.3 GFLOP/s" in dom and 'data-platform="lab"' in dom
        assert '<li data-what="worker drained"><b>worker drained</b>: vca-node1' in dom
        shot = tmp_path / "fleet.png"
        chromium("--screenshot=%s" % shot, base + "/?range=1h")
        if os.environ.get("VCAMON_KEEP_SCREENSHOT"):
            shot.replace(os.environ["VCAMON_KEEP_SCREENSHOT"])
            shot = os.environ["VCAMON_KEEP_SCREENSHOT"]
        img = Image.open(shot).convert("RGB")
        # Every node of this store is on hardware: beside the legend's one lab badge (about 900 px at this
        # size), the lab badges are the GEMM run's and its three figures' (about 4,400 px in all).
        lab = dict((color, n) for n, color in img.getcolors(maxcolors=1 << 24)).get(LAB_BADGE, 0)
        assert lab > 2500, "the lab-labelled figures are missing from the screenshot (%d px of badge)" % lab
    finally:
        server.shutdown()
        server.server_close()


SYSTEMCTL = """smem.service                 loaded active running smem: agent memory
farm-worker.service          loaded failed failed  farm: a node's Celery worker
llama-server-smem-embed.service loaded activating start llama-server
ghost.service                not-found inactive dead ghost.service
"""


def test_systemctls_list_is_read_as_each_loaded_services_state():
    assert parse_units(SYSTEMCTL) == {"smem.service": "active", "farm-worker.service": "failed",
                                      "llama-server-smem-embed.service": "activating"}


def test_an_agents_services_reach_what_runs_and_what_is_open(tmp_path, monkeypatch, node_tree):
    """The agent asks systemctl (here a script that answers as it does) for its patterns' services; the
    collector keeps them; the fleet page shows each and a service that is not active is open."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "systemctl").write_text("#!/bin/sh\necho \"$*\" > %s/args\ncat <<'EOF'\n%sEOF\n" % (tmp_path, SYSTEMCTL))
    (bindir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    server, stop = start_agent("127.0.0.1:0", "vca-node0", str(node_tree.root), sample_interval=0.2,
                               units=("smem.service", "farm-*.service"))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = "http://127.0.0.1:%d/metrics" % server.server_address[1]
        store = Store(str(tmp_path / "vcamon.db"))
        Collector(store, [{"node": "vca-node0", "url": url}], interval=5).round()
        view = fleet.view(store)
    finally:
        stop.set()
        server.shutdown()
        server.server_close()
    assert (tmp_path / "args").read_text().split()[-2:] == ["smem.service", "farm-*.service"]
    runs = {(r["service"], r["node"]): (r["up"], r["error"]) for r in view["runs"]}
    assert runs[("smem", "vca-node0")] == (True, None)
    assert runs[("farm-worker", "vca-node0")] == (False, "failed")
    assert {"what": "service not active", "where": "farm-worker.service on vca-node0",
            "detail": "failed"} in view["open"]


def test_a_node_the_inventory_calls_dead_is_shown_dead_and_is_not_open(tmp_path):
    """(issue 46) targets.json marks the inventory's dead nodes: still scraped and recorded down, shown dead
    under what runs, never an open problem (its throttle history neither); a live node down still is."""
    store = Store(str(tmp_path / "vcamon.db"))
    targets = [{"node": "vca-node3", "url": "http://127.0.0.1:9/metrics", "dead": True},
               {"node": "vca-node4", "url": "http://127.0.0.1:9/metrics"}]
    Collector(store, targets, interval=5).round()
    view = fleet.view(store)
    runs = {r["node"]: r for r in view["runs"] if r["service"] == "vcamon agent"}
    assert runs["vca-node3"]["dead"] and not runs["vca-node3"]["up"]
    assert not runs["vca-node4"]["dead"] and not runs["vca-node4"]["up"]
    assert [(i["what"], i["where"]) for i in view["open"]] == [("node down", "vca-node4")]
    assert view["agents_at"] and view["now"] - view["agents_at"] < 60
    assert "vca-node3   dead" in fleet.text(view)


def test_a_bad_dead_flag_is_refused(tmp_path):
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"node": "n", "url": "http://x/metrics", "dead": "yes"}]))
    with pytest.raises(ValueError, match="'dead' must be true or false"):
        load_targets(str(targets))


def test_an_llm_worker_down_is_open():
    services = [{"job": "haproxy", "node": "h", "up": True, "error": None, "samples": [
        ["haproxy_server_status", {"proxy": "llm_workers", "server": "vca-node0", "state": "DOWN"}, 1.0],
        ["haproxy_server_status", {"proxy": "llm_worker_vca-node0", "server": "vca-node0", "state": "DOWN"}, 1.0],
        ["haproxy_server_status", {"proxy": "llm_workers", "server": "vca-node1", "state": "DOWN"}, 0.0]]}]
    assert [(i["what"], i["where"]) for i in fleet.open_items([], services)] == [("LLM worker down", "vca-node0")]
