"""The faults a fleet meets every week (README "Whose fault", "Crash safety"): broker restarts that
are nobody's fault, and a coordinator killed at each named step of a job's life."""

from __future__ import annotations

import os
import signal

import pytest
from _engine import Broker, Farm, assert_every_chunk_once, broker_fixture, make_farm_fixture, smem_fixture, wait_for  # noqa: F401


@pytest.fixture(scope="module")
def own_broker(tmp_path_factory):
    """A broker of this module's own, which the tests restart (the session's serves the others)."""
    b = Broker(tmp_path_factory.mktemp("rabbitmq-restarted"))
    try:
        b.start()
        yield b
    finally:
        b.stop()


def rendering(farm, job_id, after: float = 0.0):
    return farm.db.rows("SELECT * FROM attempts WHERE job_id=? AND state='started' AND started_at>?",
                        (job_id, after))


def test_broker_restarts_mid_job_charge_no_node_and_spend_no_attempt(own_broker, tmp_path):
    farm = Farm(own_broker, tmp_path / "farm", "restart")
    try:
        farm.start_workers(FARM_TEST_MIN_CHUNK_S="2")
        farm.start_coordinator()
        job_id = farm.submit(frames=120)                 # 12 chunks of 10 frames, 2 s or more each
        caught = []
        for _ in range(2):
            since = max([a["started_at"] for a in caught], default=0.0)
            caught += wait_for("a chunk rendering", lambda since=since: rendering(farm, job_id, since), 120)
            own_broker.stop()                            # as systemctl restart rabbitmq-server does
            own_broker.start()
        farm.wait_state(job_id, ("done", "failed"), timeout=300)
        assert_every_chunk_once(farm, job_id)
        tries = farm.attempts(job_id)
        assert farm.db.rows("SELECT * FROM node_failures WHERE job_id=?", (job_id,)) == []
        assert farm.db.rows("SELECT * FROM blocklist WHERE job_id=?", (job_id,)) == []
        assert [a for a in tries if a["charged"] == 1] == []
        cut = [a for a in tries if a["id"] in {c["id"] for c in caught}]
        assert cut and all(a["state"] in ("lost", "interrupted") and a["charged"] == 0 for a in cut), cut
        print("\ntwo broker restarts: %d attempts cut short, none charged: %s" % (
            len(cut), "; ".join("%s %s" % (a["id"], a["error"]) for a in cut)))
    finally:
        farm.close()


def test_a_paused_node_is_charged_once(make_farm):
    """docker pause for longer than the heartbeat: the broker drops its connection and re-delivers;
    the node, continued, knows it was frozen and says nothing, so the loss is its own."""
    farm = make_farm(excuse_wait_s=20.0)     # time enough for a word from the node, had it one to say
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="40")   # still rendering when it is continued: its worker then
    farm.start_coordinator()                         # sees the connection gone and cancels the render
    job_id = farm.submit(frames=20)                  # 2 chunks on 3 workers: one is free for the re-delivery
    victim = wait_for("a chunk rendering", lambda: rendering(farm, job_id), 120)[0]
    worker = farm.workers[victim["node"]]
    os.killpg(worker.pid, signal.SIGSTOP)
    wait_for("chunk %d re-delivered" % victim["idx"], lambda: farm.db.rows(
        "SELECT * FROM attempts WHERE id=? AND state='lost'", (victim["id"],)), 120)
    os.killpg(worker.pid, signal.SIGCONT)    # back before excuse_wait_s: its freeze, not its link, is why
    farm.wait_state(job_id, ("done", "failed"), timeout=240)
    assert_every_chunk_once(farm, job_id)
    failures = wait_for("the loss charged (excuse_wait_s after it)", lambda: farm.db.rows(
        "SELECT node, attempt_id FROM node_failures WHERE job_id=?", (job_id,)), 60)
    assert failures == [{"node": victim["node"], "attempt_id": victim["id"]}]
    assert farm.db.one("SELECT charged FROM attempts WHERE id=?", (victim["id"],))["charged"] == 1


def test_a_hung_render_is_seen_by_its_output_and_rendered_elsewhere(make_farm):
    """The render writes nothing while its worker goes on reporting (a hung browser): progress is the
    parts' growth, not the timer, so it is given up after stall_after_s and charged to its node."""
    farm = make_farm(stall_after_s=10.0)
    mark = farm.root / "hung"
    farm.start_workers(FARM_TEST_HANG="1", FARM_TEST_HANG_MARK=str(mark))
    farm.start_coordinator()
    job_id = farm.submit(frames=60)
    farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert_every_chunk_once(farm, job_id)
    hung = [a for a in farm.attempts(job_id) if a["idx"] == 1 and a["state"] == "lost"]
    assert len(hung) == 1 and "no progress" in hung[0]["error"] and hung[0]["charged"] == 1, hung
    done = next(a for a in farm.attempts(job_id) if a["idx"] == 1 and a["state"] == "done")
    assert done["node"] != hung[0]["node"]
    print("\nhung render: %s" % hung[0]["error"])


def test_a_render_that_writes_nothing_until_its_end_is_not_given_up_while_its_frames_advance(make_farm):
    """Remotion writes a chunk's parts only at its end. testsrc in realtime does the same (100 frames at
    10 fps: 10 s with no byte of a part), longer than stall_after_s: its frames are its progress, and
    the job is done with no attempt given up and no node charged."""
    farm = make_farm(stall_after_s=6.0, min_chunk=100)
    farm.start_workers()
    farm.start_coordinator()
    job_id = farm.submit(frames=200, fps=10, realtime=True)
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert job["state"] == "done", job["reason"]
    assert_every_chunk_once(farm, job_id)
    assert [a["state"] for a in farm.attempts(job_id)] == ["done", "done"]
    assert farm.db.rows("SELECT * FROM node_failures WHERE job_id=?", (job_id,)) == []
    assert max(a["frames_done"] or 0 for a in farm.attempts(job_id)) >= 50     # frames came in the reports


def test_a_chunk_whose_start_could_not_be_reported_goes_back_and_the_job_ends(make_farm):
    """Unreported, the attempt would stay queued with no message behind it and the job run for ever: the
    worker returns the message to the queue, the broker re-delivers it, and the chunk is rendered."""
    farm = make_farm()
    farm.start_workers(FARM_TEST_STARTED_FAILS=str(farm.root / "started-failed"))
    farm.start_coordinator()
    job_id = farm.submit(frames=60)
    job = farm.wait_state(job_id, ("done", "failed"), timeout=240)
    assert job["state"] == "done", job["reason"]
    assert (farm.root / "started-failed").exists()
    assert_every_chunk_once(farm, job_id)


def test_a_report_that_could_not_be_applied_is_requeued_not_dropped(make_farm):
    """Applying the first two `done` reports fails (a full disk): each goes back to the queue and is
    applied later, so the job ends without waiting out silent_after_s and without a retry."""
    farm = make_farm(silent_after_s=600.0, report_retry_s=0.5)
    farm.start_workers()
    farm.start_coordinator(FARM_TEST_APPLY_FAILS="2")
    job_id = farm.submit(frames=30)
    farm.wait_state(job_id, ("done", "failed"), timeout=120)
    assert_every_chunk_once(farm, job_id)
    assert [a["n"] for a in farm.attempts(job_id)] == [1, 1, 1]
    assert farm.log("coordinator.log").count("not applied; requeued") == 2


POINTS = ["begin:running", "report:applied", "joining:recorded", "release:consumers"]


@pytest.mark.parametrize("point", ["end:recorded", *POINTS])
def test_a_coordinator_killed_at_a_step_ends_the_job_and_releases_its_lease(make_farm, smem, point):
    farm = make_farm(smem_url=smem.url, smem_token_file=str(smem.token_file), attempts=1)
    broken = point == "end:recorded"          # a job that fails: its end is what the kill cuts short
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.3", **({"FARM_TEST_BROKEN": "1"} if broken else {}))
    mark = farm.root / "crashed"
    farm.start_coordinator(FARM_TEST_CRASH_AT=point, FARM_TEST_CRASH_MARK=str(mark))
    job_id = farm.submit(frames=30)
    wait_for("the coordinator killed at %s" % point, lambda: farm.coordinator.poll() is not None, 120)
    assert farm.coordinator.returncode == -signal.SIGKILL and mark.read_text() == point
    farm.start_coordinator(FARM_TEST_CRASH_AT=point, FARM_TEST_CRASH_MARK=str(mark))   # goes past this time
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    if broken:
        assert job["state"] == "failed" and "failed 1 attempts (the cap)" in job["reason"], job
    else:
        assert_every_chunk_once(farm, job_id)
    assert job["nodes_released"] == 1
    wait_for("its lease released", lambda: smem.live() == [], 30)
    assert farm.db.rows("SELECT * FROM outbox WHERE job_id=? AND done_at IS NULL", (job_id,)) == []
