"""Workers that share no directory with the host: the bundle fetched by hash from the farm API (a real
uvicorn on loopback), parts uploaded to it, each worker with parts_dir and cache_dir of its own; and
the executables a worker renders with are its own settings, not the job's."""

from __future__ import annotations

import hashlib
import json
import time

import httpx
from _engine import broker_fixture, frame_hashes, make_farm_fixture, wait_for  # noqa: F401 (fixtures)

from farm.remotion import tree_hash


def make_bundle(farm, files: dict) -> tuple[str, str]:
    """A bundle in the host's work_dir/bundles/<hash>, as remotion.job_spec leaves one; (path, hash)."""
    staged = farm.root / "work" / "bundles" / ".new"
    for name, text in files.items():
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_text(text)
    digest = tree_hash(staged)
    final = staged.with_name(digest)
    staged.rename(final)
    return str(final), digest


def recorded(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_worker_renders_with_its_own_executables(make_farm):
    farm = make_farm()
    node, record = farm.nodes[0], farm.root / "specs.jsonl"
    own = {"node": "/opt/node20/bin/node", "browser": "/opt/headless-shell/chrome-headless-shell",
           "node_modules": "/opt/farm/remotion-worker/node_modules", "concurrency": 2}
    farm.start_worker(node, config=farm.worker_config(node, render={**own, "sample_rate": 44100}),
                      FARM_TEST_RECORD=str(record))
    farm.wait_workers([node])
    farm.start_coordinator()
    job_id = farm.submit(frames=20, nodes=[node], composition="Hello")     # a spec names no executables
    assert farm.wait_state(job_id, ("done", "failed"))["state"] == "done", farm.job(job_id)["reason"]
    specs = [r["spec"] for r in recorded(record)]
    assert len(specs) == 2
    for spec in specs:
        assert {k: spec[k] for k in own} == own                     # the worker's, not the job's
        assert spec["composition"] == "Hello" and "sample_rate" not in spec   # the rest is the job's
    assert "browser" not in farm.job(job_id)["spec"]                           # the job itself unchanged


def test_remote_workers_fetch_the_bundle_and_upload_the_parts(make_farm):
    farm = make_farm()
    api = farm.start_api()
    record = farm.root / "specs.jsonl"
    for node in farm.nodes:
        farm.start_worker(node, config=farm.remote_worker_config(node), FARM_TEST_RECORD=str(record),
                          FARM_TEST_MIN_CHUNK_S="0.3")
    farm.wait_workers(farm.nodes)
    farm.start_coordinator()
    bundle, digest = make_bundle(farm, {"index.html": "<html></html>", "static/app.js": "x=1\n" * 1000})
    job_id = farm.submit(frames=120, bundle=bundle, bundleHash=digest)
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert job["state"] == "done", (job["reason"], farm.log("coordinator.log"))
    assert job["result"]["verify"]["ok"]

    # the output's frames are the uploaded parts' frames, in chunk order
    chunks = farm.db.rows("SELECT * FROM chunks WHERE job_id=? ORDER BY idx", (job_id,))
    want = []
    for c in chunks:
        assert c["video"] == "%s/part-%05d.ts" % (job_id, c["idx"])
        want += frame_hashes(farm.root / "parts" / c["video"])
    assert frame_hashes(job["out"]) == want and len(want) == 120

    # each worker rendered from its own copy of the bundle and kept no part; nothing in its parts_dir
    used = {n for n in farm.nodes if (farm.root / n / "cache" / "bundles" / digest).is_dir()}
    assert used == {c["node"] for c in chunks}
    for n in used:
        assert tree_hash(farm.root / n / "cache" / "bundles" / digest) == digest
    for r in recorded(record):
        assert r["spec"]["bundle"].startswith(str(farm.root)) and r["spec"]["bundle"] != bundle
        assert r["spec"]["bundle"].endswith("/cache/bundles/" + digest)
    for n in farm.nodes:
        assert not list((farm.root / n).glob("cache/parts/*/*")) and not (farm.root / n / "parts").exists()

    # where the time went: farm status --json
    v = json.loads(farm.farm("status", job_id, "--json").stdout)
    for c in v["chunks"]:
        assert set(c["timings"]) == {"fetch_s", "render_s", "upload_s"} and c["timings"]["render_s"] > 0
    assert set(v["timings"]) == {"fetch_s", "render_s", "upload_s", "join_s", "verify_s"}
    assert v["job"]["timings"]["join_s"] > 0 and v["job"]["timings"]["verify_s"] > 0

    # a tampered bundle: every attempt fails, with the reason; no worker keeps it
    bad, bad_digest = make_bundle(farm, {"index.html": "<html>v2</html>"})
    (farm.root / "work" / "bundles" / bad_digest / "index.html").write_text("<html>changed</html>")
    bad_job = farm.submit(frames=10, bundle=bad, bundleHash=bad_digest)
    # meanwhile: a part whose body is not what its X-Content-SHA256 says is refused
    # the worker token alone cannot write a part: only the attempt's own key, in its message alone, can
    # (a body that is not what its X-Content-SHA256 says: tests/test_api.py)
    attempt = wait_for("chunk 0's attempt", lambda: farm.db.one(
        "SELECT id, key FROM attempts WHERE job_id=? AND idx=0", (bad_job,)), 60)
    worker = {"Authorization": "Bearer worker-test-token", "X-Farm-Attempt": attempt["id"]}
    body = b"a forged part"
    r = httpx.put("%s/v1/jobs/%s/parts/part-00000.ts" % (api, bad_job), content=body,
                  headers={**worker, "X-Farm-Attempt-Key": "guessed",
                           "X-Content-SHA256": hashlib.sha256(body).hexdigest()})
    assert r.status_code == 403 and "key" in r.json()["error"], r.text
    assert not (farm.root / "parts" / bad_job / "part-00000.ts").exists()
    job = farm.wait_state(bad_job, ("done", "failed"), timeout=120)
    assert job["state"] == "failed" and "failed 3 attempts" in job["reason"]
    tries = farm.attempts(bad_job)
    assert [a["state"] for a in tries] == ["failed"] * 3
    assert all("bundle %s: the files fetched hash to" % bad_digest in a["error"] and "refused" in a["error"]
               for a in tries), tries
    for n in farm.nodes:
        assert not (farm.root / n / "cache" / "bundles" / bad_digest).exists()
        assert not list((farm.root / n / "cache" / "bundles").glob(".fetch-*"))


def test_a_failed_upload_fails_the_attempt(make_farm):
    """The API is down: the attempt fails (and is retried), never done; the node keeps no part."""
    farm = make_farm()
    farm.start_api()
    node = farm.nodes[0]
    farm.start_worker(node, config=farm.remote_worker_config(node))
    farm.wait_workers([node])
    farm.api.terminate()
    farm.api.wait(30)
    farm.start_coordinator()
    job_id = farm.submit(frames=10, nodes=[node])
    wait_for("a failed attempt", lambda: [a for a in farm.attempts(job_id) if a["state"] == "failed"], 60)
    first = farm.attempts(job_id)[0]
    assert first["state"] == "failed" and "upload of %s/part-00000" % job_id in first["error"], first
    time.sleep(0.5)
    assert farm.db.one("SELECT state FROM chunks WHERE job_id=?", (job_id,))["state"] != "done"
    assert not list((farm.root / node).glob("cache/parts/*/*"))
