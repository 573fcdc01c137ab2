"""The engine against a real RabbitMQ and real Celery workers: jobs complete with every chunk once, a
worker killed or hung mid-chunk loses nothing, the blocklist, the attempts cap, cancel.

Chunks are real ffmpeg renders (the testsrc renderer) held to at least FARM_TEST_MIN_CHUNK_S so
a test can act while one is in progress."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _engine import (  # noqa: F401 (fixtures)
    _listeners,
    assert_every_chunk_once,
    broker_fixture,
    make_farm_fixture,
    processes_naming,
    wait_for,
)
from kombu import Connection

CHUNK_S = "1.0"


def started(farm, job_id):
    return [a for a in farm.attempts(job_id) if a["state"] == "started"]


def restarted(farm, job_id, victim):
    """The first later attempt of the victim's chunk that has started, or None."""
    later = [a for a in farm.attempts(job_id) if a["idx"] == victim["idx"] and a["n"] > victim["n"]
             and a["started_at"]]
    return later[0] if later else None


def test_the_broker_listens_on_loopback_only(broker):
    listening = _listeners({broker.amqp, broker.dist, broker.epmd_port})
    assert {port for _, port in listening} == {broker.amqp, broker.dist, broker.epmd_port}, listening
    loopback = {"0100007F", "00000000000000000000000001000000"}   # 127.0.0.1 and ::1 (epmd binds both)
    assert {addr for addr, _ in listening} <= loopback, listening     # never 0.0.0.0 nor ::


def test_a_job_on_three_workers_completes_with_every_chunk_once(make_farm):
    farm = make_farm()
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.5")
    farm.start_coordinator()
    t0 = time.monotonic()
    job_id = farm.submit(frames=120)
    farm.wait_state(job_id, ("done", "failed"), timeout=180)
    took = time.monotonic() - t0
    chunks = assert_every_chunk_once(farm, job_id)
    assert len(chunks) == 12
    nodes = {c["node"] for c in chunks}
    assert nodes <= set(farm.nodes) and len(nodes) >= 2, nodes   # the nodes pull: more than one took chunks
    assert all(a["n"] == 1 and a["state"] == "done" for a in farm.attempts(job_id))
    print("\n12 chunks on 3 workers: %.1f s from submit to verified; chunks per node %s"
          % (took, {n: sum(c["node"] == n for c in chunks) for n in sorted(nodes)}))
    # farm status shows it
    r = farm.farm("status", job_id)
    assert r.returncode == 0 and "done" in r.stdout and "120 / 120 frames" in r.stdout, r.stdout


def test_kill_9_of_a_worker_mid_chunk_requeues_it_elsewhere(make_farm):
    farm = make_farm()
    farm.start_workers(FARM_TEST_MIN_CHUNK_S=CHUNK_S)
    farm.start_coordinator()
    job_id = farm.submit(frames=120, verify=True)
    victim = wait_for("a chunk in progress", lambda: started(farm, job_id), 120)[0]
    worker = farm.workers[victim["node"]]
    killed_at = time.time()
    os.killpg(worker.pid, signal.SIGKILL)          # the whole worker: main process, pool child, ffmpeg
    worker.wait(10)

    retry = wait_for("chunk %d to start again" % victim["idx"], lambda: restarted(farm, job_id, victim), 120)
    requeue_s = retry["started_at"] - killed_at
    farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert_every_chunk_once(farm, job_id)
    lost = next(a for a in farm.attempts(job_id) if a["id"] == victim["id"])
    assert lost["state"] == "lost" and lost["node"] == victim["node"]
    assert retry["node"] != victim["node"]
    assert farm.job(job_id)["result"]["verify"]["psnr"] >= 35
    print("\nkill -9 of %s mid-chunk %d: re-delivered by the broker %.2f s later, started again on %s %.2f s later"
          % (victim["node"], victim["idx"], lost["finished_at"] - killed_at, retry["node"], requeue_s))


def test_a_hung_worker_sigstop_is_requeued_after_the_heartbeat(make_farm):
    farm = make_farm()
    farm.start_workers(FARM_TEST_MIN_CHUNK_S=CHUNK_S)
    farm.start_coordinator()
    job_id = farm.submit(frames=120)
    victim = wait_for("a chunk in progress", lambda: started(farm, job_id), 120)[0]
    worker = farm.workers[victim["node"]]
    stopped_at = time.time()
    os.killpg(worker.pid, signal.SIGSTOP)          # a hung node (docker pause): no heartbeat, socket open

    # broker_heartbeat (6 s by default): RabbitMQ drops the connection after two missed beats, then re-delivers
    retry = wait_for("chunk %d to start again after the heartbeat" % victim["idx"],
                     lambda: restarted(farm, job_id, victim), 90)
    requeue_s = retry["started_at"] - stopped_at
    os.killpg(worker.pid, signal.SIGCONT)          # the node comes back: its late work must not count twice
    farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert_every_chunk_once(farm, job_id)
    assert retry["node"] != victim["node"]
    assert 5 < requeue_s < 60, requeue_s
    lost = next(a for a in farm.attempts(job_id) if a["id"] == victim["id"])
    assert lost["state"] == "lost"
    print("\nSIGSTOP of %s mid-chunk %d: re-delivered by the broker %.1f s later, started again on %s"
          " %.1f s later (broker_heartbeat 6 s)" % (victim["node"], victim["idx"], lost["finished_at"] - stopped_at,
                                                     retry["node"], requeue_s))


def test_a_node_failing_three_chunks_is_blocklisted_for_the_job(make_farm):
    farm = make_farm()
    broken = farm.nodes[2]
    farm.start_workers(farm.nodes[:2], FARM_TEST_MIN_CHUNK_S=CHUNK_S)
    farm.start_worker(broken, FARM_TEST_BROKEN="1")
    farm.wait_workers([broken])
    farm.start_coordinator()
    job_id = farm.submit(frames=120)
    wait_for("%s on the blocklist" % broken,
             lambda: farm.db.rows("SELECT * FROM blocklist WHERE job_id=?", (job_id,)), 120)
    assert [r["node"] for r in farm.db.rows("SELECT node FROM blocklist WHERE job_id=?", (job_id,))] == [broken]
    farm.wait_state(job_id, ("done", "failed"), timeout=180)
    chunks = assert_every_chunk_once(farm, job_id)
    failed = [a for a in farm.attempts(job_id) if a["state"] == "failed"]
    assert {a["node"] for a in failed} == {broken}
    assert len({a["idx"] for a in failed}) >= 3
    assert "injected" in failed[0]["error"]
    # the blocklisted node took at most the one chunk in flight when its consumer was cancelled
    assert len(failed) <= 4, failed
    assert broken not in {c["node"] for c in chunks}
    v = farm.db.view(job_id)
    assert v["blocklist"] == [broken] and v["failures"][broken] == len(failed) and v["retries"] >= 3
    r = farm.farm("status", job_id)
    assert broken in r.stdout and "blocklist" in r.stdout


def test_the_attempts_cap_fails_a_chunk_that_kills_its_worker_every_time(make_farm):
    farm = make_farm()
    farm.start_workers(FARM_TEST_POISON="3", FARM_TEST_MIN_CHUNK_S="0.3")
    farm.start_coordinator()
    job_id = farm.submit(frames=120)
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert job["state"] == "failed", job
    assert "chunk 3" in job["reason"] and "failed 3 attempts (the cap)" in job["reason"], job["reason"]
    tries = [a for a in farm.attempts(job_id) if a["idx"] == 3]
    assert [a["n"] for a in tries] == [1, 2, 3]
    assert all(a["state"] == "lost" and "died or hung" in a["error"] for a in tries), tries
    chunk = farm.db.one("SELECT * FROM chunks WHERE job_id=? AND idx=3", (job_id,))
    assert chunk["state"] == "failed" and chunk["reason"] == job["reason"]
    assert farm.job(job_id)["nodes_released"] == 1
    # every pool process the poison killed was replaced: the workers still answer
    farm.wait_workers(farm.nodes)
    print("\nattempts cap: %s" % job["reason"])


def test_a_coordinator_killed_mid_job_resumes_it_from_the_database(make_farm):
    farm = make_farm()
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.5")
    farm.start_coordinator()
    job_id = farm.submit(frames=120)
    wait_for("two chunks done", lambda: len(farm.db.rows(
        "SELECT 1 FROM chunks WHERE job_id=? AND state='done'", (job_id,))) >= 2, 120)
    os.killpg(farm.coordinator.pid, signal.SIGKILL)
    farm.coordinator.wait(10)
    time.sleep(1.5)        # the workers go on; their reports wait in the durable queue
    farm.start_coordinator()
    farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert_every_chunk_once(farm, job_id)
    assert any("resuming" in e["text"] for e in farm.db.view(job_id)["events"])


def test_cancel_stops_the_job_and_gives_its_nodes_back(make_farm):
    farm = make_farm()
    farm.start_workers(FARM_TEST_MIN_CHUNK_S=CHUNK_S)
    farm.start_coordinator()
    job_id = farm.submit(frames=240)
    wait_for("a chunk in progress", lambda: started(farm, job_id), 120)
    r = farm.farm("cancel", job_id)
    assert r.returncode == 0 and "cancelled" in r.stdout, (r.stdout, r.stderr)
    job = farm.job(job_id)
    assert job["state"] == "cancelled" and job["nodes_released"] == 1
    assert farm.db.rows("SELECT * FROM consumers WHERE job_id=?", (job_id,)) == []
    queue = "farm.job." + job_id

    def consumers_gone():
        active = farm.active_queues()
        return active and len(active) == 3 and all(queue not in {q["name"] for q in qs} for qs in active.values())
    wait_for("the workers to stop consuming %s" % queue, consumers_gone, 30)
    with Connection(farm.broker.url) as conn, pytest.raises(conn.channel_errors):
        conn.default_channel.queue_declare(queue, passive=True)   # the job's queue is gone
    # nothing starts after the cancel; what ran was revoked
    n = len(farm.attempts(job_id))
    time.sleep(2)
    assert len(farm.attempts(job_id)) == n
    assert not [a for a in farm.attempts(job_id) if a["state"] in ("queued", "started")]
    assert farm.farm("cancel", job_id).returncode == 2          # cancelled already


def test_cancel_stops_what_the_render_runs_too(make_farm):
    """The render's ffmpeg is a grandchild of the pool child, as Remotion's are (node starts chromium and
    its compositor): revoke's SIGTERM reaches the pool child only, and the render's process group must go."""
    farm = make_farm()
    slow = farm.root / "bin"
    slow.mkdir()
    (slow / "ffmpeg").write_text('#!/bin/sh\n# ffmpeg at real time, a child of this shell\n/usr/bin/ffmpeg -re "$@"\n')
    (slow / "ffmpeg").chmod(0o755)
    farm.start_workers(PATH="%s:%s" % (slow, os.environ["PATH"]))
    farm.start_coordinator()
    job_id = farm.submit(frames=6000)      # 12 chunks of 500 frames: about 17 s each at real time
    parts = str(farm.root / "parts" / job_id)
    wait_for("three ffmpeg renders of the job", lambda: len(
        [p for p in processes_naming(parts) if p.startswith("/usr/bin/ffmpeg")]) == 3, 60)
    r = farm.farm("cancel", job_id)
    assert r.returncode == 0 and "cancelled" in r.stdout, (r.stdout, r.stderr)
    wait_for("no process of the job left", lambda: not processes_naming(parts), 5)
    assert not [a for a in farm.attempts(job_id) if a["state"] in ("queued", "started", "done")]


def test_joins_run_beside_each_other_and_a_joining_job_can_be_cancelled(make_farm):
    farm = make_farm()
    farm.start_workers()
    farm.start_coordinator(FARM_TEST_SLOW_JOIN="slow", FARM_TEST_SLOW_JOIN_RELEASE=str(farm.root / "release"))
    slow = farm.submit(frames=30, out="slow.mp4")
    farm.wait_state(slow, "joining")
    fast = farm.submit(frames=30, out="fast.mp4")
    assert farm.wait_state(fast, ("done", "failed"))["state"] == "done"       # not behind the slow join
    assert farm.job(slow)["state"] == "joining"
    r = farm.farm("cancel", slow)
    assert r.returncode == 0 and "cancelled" in r.stdout, r.stdout + r.stderr
    job = farm.job(slow)
    assert job["state"] == "cancelled" and job["reason"] == "cancelled while joining"
    assert not (farm.root / "out" / "slow.mp4").exists()
    assert processes_naming(str(farm.root / "work" / "joins")) == []            # its process is gone
