"""GET /metrics on the farm's API (issue 28): what the database holds, in Prometheus text that promtool
accepts, behind the metrics token (or the API token)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from farm.api import build
from farm.config import load
from farm.db import DB

SPEC = {"renderer": "testsrc", "width": 320, "height": 180, "fps": 30, "frames": 120}


@pytest.fixture
def farm(tmp_path):
    s = load(None, db_path=str(tmp_path / "farm.db"), output_dir=str(tmp_path / "out"),
             work_dir=str(tmp_path / "work"), parts_dir=str(tmp_path / "parts"))
    client = TestClient(build(s, "api-secret", "worker-secret", "metrics-secret"))
    client.settings = s
    return client


def bearer(token: str) -> dict:
    return {"Authorization": "Bearer " + token}


def scrape(client) -> dict:
    r = client.get("/metrics", headers=bearer("metrics-secret"))
    assert r.status_code == 200, r.text
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package, scripts/host-packages.txt) is not on PATH"
    check = subprocess.run([promtool, "check", "metrics"], input=r.text, capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples}


def test_metrics_take_the_metrics_or_api_token_and_the_metrics_token_nothing_else(farm):
    assert farm.get("/metrics").status_code == 401
    assert farm.get("/metrics", headers=bearer("worker-secret")).status_code == 403
    assert farm.get("/metrics", headers=bearer("api-secret")).status_code == 200
    assert farm.get("/v1/jobs", headers=bearer("metrics-secret")).status_code == 403
    r = farm.post("/v1/jobs", headers=bearer("metrics-secret"), json={"spec": SPEC, "out": "a.mp4"})
    assert r.status_code == 403
    with pytest.raises(ValueError, match="must all differ"):
        build(farm.settings, "same", "worker", "same")


def test_jobs_chunks_attempts_requeues_failures_and_progress(farm):
    r = farm.post("/v1/jobs", headers=bearer("api-secret"),
                  json={"spec": SPEC, "out": "a.mp4", "nodes": ["vca-node0", "vca-node1"]})
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    got = scrape(farm)
    assert got[("farm_jobs", (("state", "submitted"),))] == 1
    assert got[("farm_jobs", (("state", "running"),))] == 0
    assert got[("farm_chunks", (("state", "queued"),))] == 4
    assert got[("farm_frames_rendered", ())] == 0

    # What the coordinator writes as a job runs: chunk 0 rendered on node0 at the second attempt (the first
    # lost with node1, charged to it), chunk 1 interrupted once and rendering again.
    db, t = DB(farm.settings.db_path), time.time()
    with db.tx() as c:
        c.execute("UPDATE jobs SET state='running', started_at=? WHERE id=?", (t - 100, jid))
        first, last = c.execute("SELECT first, last FROM chunks WHERE job_id=? AND idx=0", (jid,)).fetchone()
        c.execute("UPDATE chunks SET state='done', node='vca-node0', done_at=? WHERE job_id=? AND idx=0", (t - 30, jid))
        for aid, idx, n, state, node, heard in [("a1", 0, 1, "lost", "vca-node1", t - 90),
                                                ("a2", 0, 2, "done", "vca-node0", t - 30),
                                                ("a3", 1, 1, "interrupted", "vca-node0", t - 80),
                                                ("a4", 1, 2, "started", "vca-node1", t - 20)]:
            c.execute("INSERT INTO attempts(id, job_id, idx, n, state, node, created_at, heard_at)"
                      " VALUES (?,?,?,?,?,?,?,?)", (aid, jid, idx, n, state, node, t - 100, heard))
        c.execute("INSERT INTO node_failures(job_id, node, idx, attempt_id, reason, at) VALUES (?,?,?,?,?,?)",
                  (jid, "vca-node1", 0, "a1", "lost", t - 90))
        c.execute("INSERT INTO blocklist(job_id, node, at) VALUES (?,?,?)", (jid, "vca-node1", t - 90))
    got = scrape(farm)
    assert got[("farm_jobs", (("state", "running"),))] == 1
    assert got[("farm_chunks", (("state", "done"),))] == 1 and got[("farm_chunks", (("state", "queued"),))] == 3
    assert got[("farm_frames_rendered", ())] == last - first + 1
    assert got[("farm_attempts", (("state", "started"),))] == 1 and got[("farm_attempts", (("state", "lost"),))] == 1
    assert got[("farm_requeues", (("cause", "lost"),))] == 1
    assert got[("farm_requeues", (("cause", "interrupted"),))] == 1
    assert got[("farm_requeues", (("cause", "failed"),))] == 0
    assert got[("farm_node_failures", (("node", "vca-node1"),))] == 1
    assert got[("farm_blocklisted_jobs", (("node", "vca-node1"),))] == 1
    age = got[("farm_job_last_progress_age_seconds", (("job_id", jid),))]
    assert 19 <= age < 60, age            # the last report, 20 s ago: not the start nor the done chunk

    with db.tx() as c:
        c.execute("UPDATE jobs SET state='done', finished_at=? WHERE id=?", (time.time(), jid))
    got = scrape(farm)
    assert ("farm_blocklisted_jobs", (("node", "vca-node1"),)) not in got      # only live jobs block a node
    assert not [k for k in got if k[0] == "farm_job_last_progress_age_seconds"]
