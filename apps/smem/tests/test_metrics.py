"""GET /metrics (issue 28): Prometheus text that promtool accepts, behind the metrics scope, with the
queue, the workers, the lanes, the leases, latency and degraded answers as they are."""

from __future__ import annotations

import shutil
import subprocess

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from test_durability import wait_for
from test_hostile_input import LlamaLike, stub_settings

from smem import auth
from smem.config import Settings
from smem.service import build


def scrape(client, token: str) -> str:
    r = client.get("/metrics", headers={"Authorization": "Bearer " + token})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return r.text


def samples(text: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def promtool_accepts(text: str) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package, scripts/host-packages.txt) is not on PATH"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_metrics_need_the_metrics_scope(svc):
    metrics = auth.create(svc.db, [], scopes=["metrics"])
    assert svc.client.get("/metrics").status_code == 401
    for who in ("alice", "both"):
        r = svc.call("GET", "/metrics", who)
        assert r.status_code == 403 and "metrics scope" in r.json()["error"]
    assert svc.call("GET", "/metrics", "admin").status_code == 200
    assert svc.client.get("/metrics", headers={"Authorization": "Bearer " + metrics}).status_code == 200
    for path in ("/v5/ns/alice/memories", "/v5/admin/leases", "/v5/admin/tokens"):   # and nothing else
        assert svc.client.get(path, headers={"Authorization": "Bearer " + metrics}).status_code == 403, path


def test_documents_jobs_search_latency_and_degraded_answers(svc):
    token = auth.create(svc.db, [], scopes=["metrics"])
    svc.ingest("alice", "The ferry leaves at 9:40.")
    svc.search("alice", "ferry")
    svc.embedder.down = True
    assert "embedder" in svc.search("alice", "ferry")["degraded"]
    text = scrape(svc.client, token)
    promtool_accepts(text)
    got = samples(text)
    assert got[("smem_documents", (("status", "done"),))] == 1
    assert got[("smem_documents", (("status", "failed"),))] == 0
    assert got[("smem_jobs", (("state", "done"),))] == 1
    assert got[("smem_search_duration_seconds_count", (("mode", "hybrid"),))] == 2
    assert got[("smem_degraded_answers_total", (("cause", "embedder"),))] == 1
    assert got[("smem_degraded_answers_total", (("cause", "reranker"),))] == 0
    assert got[("smem_healthy", ())] == 1


def test_workers_ingest_latency_and_a_stuck_queue(tmp_path, minilm):
    app, pipeline = build(str(tmp_path / "smem.db"), Settings(workers=2, poll_interval_s=0.05), embedder=minilm)
    token = auth.create(pipeline.db, [], scopes=["metrics"])
    writer = auth.create(pipeline.db, ["alice"])
    with TestClient(app) as client:
        r = client.post("/v5/ns/alice/documents", headers={"Authorization": "Bearer " + writer},
                        json={"content": "Workers are counted."})
        assert r.status_code == 202
        def ingested():
            got = samples(scrape(client, token))
            return got if got[("smem_ingest_duration_seconds_count", ())] == 1 else None
        got = wait_for(ingested)
        for w in ("worker-0", "worker-1"):
            assert got[("smem_worker_up", (("worker", w),))] == 1
            assert got[("smem_worker_restarts_total", (("worker", w),))] == 0
            assert got[("smem_worker_database_errors", (("worker", w),))] == 0
        assert got[("smem_queue_oldest_due_age_seconds", ())] == 0
        promtool_accepts(scrape(client, token))


def test_lane_nodes_up_down_and_leased(lane_service):
    node = LlamaLike()
    try:
        svc = lane_service(stub_settings(node.url, "http://127.0.0.1:9", down_s=300))
        token = auth.create(svc.db, [], scopes=["metrics"])
        svc.ingest("alice", "Ingest borrows the interactive lane when the background node is down.")
        r = svc.call("POST", "/v5/admin/leases", "admin", json={"nodes": ["i0"], "holder": "test", "ttlSeconds": 60})
        assert r.status_code == 201, r.text
        text = scrape(svc.client, token)
        promtool_accepts(text)
        got = samples(text)
        assert got[("smem_lane_node_up", (("lane", "interactive"), ("model", "embed"), ("node", "i0")))] == 1
        assert got[("smem_lane_node_up", (("lane", "background"), ("model", "embed"), ("node", "b0")))] == 0
        assert got[("smem_lane_node_leased", (("lane", "interactive"), ("node", "i0")))] == 1
        assert got[("smem_lane_node_leased", (("lane", "background"), ("node", "b0")))] == 0
        assert got[("smem_leases", ())] == 1
    finally:
        node.stub.close()


@pytest.mark.parametrize("scope", ["metrics", "lease"])
def test_scope_only_tokens_take_no_namespace(svc, scope):
    with pytest.raises(ValueError, match="has no namespaces"):
        auth.create(svc.db, ["alice"], scopes=[scope])


# llama.cpp names its metrics `llamacpp:...` (and one counter without `_total`): promtool's lint says so
# (exit 3). Those names are llama.cpp's to change; anything else promtool finds fails the test.
LLAMACPP_OWN_LINT = ("metric names should not contain ':'", 'llamacpp:n_tokens_max counter metrics should have')


def test_llama_servers_metrics_parse_and_only_llamacpps_own_names_fail_promtools_lint(llama_chat):
    """(issue 28) What the prometheus role scrapes from every lane node's llama-server (its --metrics)."""
    text = httpx.get(llama_chat.url + "/metrics", timeout=10).text
    assert "llamacpp:n_decode_total" in {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    r = subprocess.run([shutil.which("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60, check=False)
    problems = [line for line in (r.stdout + r.stderr).splitlines()
                if line.strip() and not any(known in line for known in LLAMACPP_OWN_LINT)]
    assert r.returncode in (0, 3) and not problems, r.stdout + r.stderr
