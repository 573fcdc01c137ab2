"""Attempts that go quiet or fail, against a real RabbitMQ and real workers: the watchdog gives up a
silent attempt (and never a queued one), a publish that fails is tried again, a retry goes around
the node that failed it while another node of the job answers."""

from __future__ import annotations

import json

from _engine import assert_every_chunk_once, broker_fixture, make_farm_fixture, wait_for  # noqa: F401 (fixtures)


def test_a_silent_attempt_is_given_up_and_rendered_elsewhere(make_farm):
    """A worker whose reports of one chunk stop after `started` (its render goes on, `done` cannot be
    published): the chunk is silent. Chunks waiting in the queue longer than silent_after_s are not."""
    # silent_after_s is 16 progress reports (0.5 s apart): a worker slowed by a busy machine (the CI
    # runs this beside molecule) still reports in time; only the silenced chunk goes quiet for it
    farm = make_farm(silent_after_s=8.0)
    nodes = farm.nodes[:2]
    marker = farm.root / "went-silent"
    farm.start_workers(nodes, FARM_TEST_SILENT=str(marker), FARM_TEST_MIN_CHUNK_S="3.5")
    farm.start_coordinator()
    job_id = farm.submit(frames=120, nodes=nodes)          # 8 chunks on 2 workers: the last waits > 3 x 3.5 s
    farm.wait_state(job_id, ("done", "failed"), timeout=150)
    assert_every_chunk_once(farm, job_id)
    tries = farm.attempts(job_id)
    [silent] = [a for a in tries if a["state"] == "lost"]
    assert silent["n"] == 1 and "silent for" in silent["error"] and "revoked" in silent["error"], silent
    again = [a for a in tries if a["idx"] == silent["idx"] and a["n"] == 2]
    assert again and again[0]["state"] == "done" and again[0]["node"] != silent["node"]
    assert all(a["n"] == 1 and a["state"] == "done" for a in tries if a["idx"] != silent["idx"]), tries
    queued_s = max(a["started_at"] - a["created_at"] for a in tries if a["n"] == 1)
    assert queued_s > 8.0, queued_s                         # some waited longer than silent_after_s
    events = [e["text"] for e in farm.db.view(job_id)["events"]]
    assert any("chunk %d attempt 1 on %s: silent for" % (silent["idx"], silent["node"]) in e for e in events)


def test_a_publish_that_fails_is_tried_again(make_farm):
    farm = make_farm()
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.2")
    farm.start_coordinator(FARM_TEST_PUBLISH_FAILS="3")
    job_id = farm.submit(frames=60)
    farm.wait_state(job_id, ("done", "failed"), timeout=60)
    assert_every_chunk_once(farm, job_id)
    assert all(a["n"] == 1 for a in farm.attempts(job_id))
    assert farm.log("coordinator.log").count("not published (ConnectionError: injected") == 3


def retry_while_the_good_node_is_busy(farm, other: str, busy_s: float, **other_env) -> list[dict]:
    """The good node (the farm's first) busy with a job of its own for busy_s, then a one-chunk job on
    it and `other`: that job's attempts, once it is done."""
    good = farm.nodes[0]
    farm.start_worker(good, FARM_TEST_MIN_CHUNK_S=str(busy_s))
    farm.start_worker(other, **other_env)
    farm.wait_workers([good, other])
    farm.start_coordinator()
    busy = farm.submit(frames=10, nodes=[good])
    wait_for("the good node busy", lambda: any(a["state"] == "started" for a in farm.attempts(busy)), 60)
    job_id = farm.submit(frames=10, nodes=[good, other])
    job = farm.wait_state(job_id, ("done", "failed"), timeout=120)
    assert job["state"] == "done", (job["reason"], farm.attempts(job_id))
    assert farm.wait_state(busy, "done")["state"] == "done"
    return farm.attempts(job_id)


def test_a_retry_avoids_the_node_that_failed_it(make_farm):
    """A small job on a broken node and a busy good one: without avoid the broken node takes its own
    retries (it is the only free one) and uses up the chunk's attempts."""
    farm = make_farm(failure_backoff_s=0.0)
    good, broken, absent = farm.nodes
    copies = farm.root / "put-back.jsonl"
    tries = retry_while_the_good_node_is_busy(farm, broken, 8, FARM_TEST_BROKEN="1",
                                              FARM_TEST_PUT_BACK_RECORD=str(copies))
    assert [(a["n"], a["node"], a["state"]) for a in tries] == [(1, broken, "failed"), (2, good, "done")]
    assert tries[0]["avoid"] is None and json.loads(tries[1]["avoid"]) == [broken]
    # the broken node put the retry back (it was free first), with the chunk's time limits
    put_back = [json.loads(line) for line in copies.read_text().splitlines()]
    assert put_back and all(c["task_id"] == tries[1]["id"] for c in put_back), put_back
    assert all(0 < (c.get("soft_time_limit") or 0) < (c.get("time_limit") or 0) for c in put_back), put_back

    # no other node answers (its worker is not running): the retries may go to the broken node
    lonely = farm.submit(frames=10, nodes=[broken, absent])
    job = farm.wait_state(lonely, ("done", "failed"), timeout=120)
    assert job["state"] == "failed" and "failed 3 attempts" in job["reason"]
    assert [(a["node"], a["avoid"]) for a in farm.attempts(lonely)] == [(broken, None)] * 3


def test_a_retry_that_cannot_be_put_back_is_rendered_where_it_landed(make_farm):
    """The node a retry avoids takes it (the other node is busy) and the broker refuses its copy back
    to the queue: it renders the chunk itself. Acked unrendered, the attempt would wait queued for
    ever with no message behind it (the watchdog gives up started attempts only)."""
    farm = make_farm(failure_backoff_s=0.0)
    flaky = farm.nodes[1]
    tries = retry_while_the_good_node_is_busy(farm, flaky, 12, FARM_TEST_PUT_BACK_FAILS="1",
                                              FARM_TEST_BROKEN_ONCE=str(farm.root / "flaky-failed"))
    assert [(a["n"], a["node"], a["state"]) for a in tries] == [(1, flaky, "failed"), (2, flaky, "done")]
    assert json.loads(tries[1]["avoid"]) == [flaky]
    assert "not put back (OperationalError: injected" in farm.log("worker-%s.log" % flaky)
