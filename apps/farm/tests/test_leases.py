"""Leases against an HTTP stand-in of smem's lease routes: taken, renewed, released in the end
whatever the end (done, failed, cancelled), and at the coordinator's start for jobs no longer live;
a job waits for nodes leased elsewhere; without smem the farm runs without leases and says so."""

from __future__ import annotations

import os
import signal
import time

import pytest
from _engine import LeaseStandIn, broker_fixture, make_farm_fixture, smem_fixture, wait_for  # noqa: F401 (fixtures)

from farm.leases import LeaseClient, LeaseConflict, LeaseError


def leased_farm(make_farm, smem, **settings):
    return make_farm(smem_url=smem.url, smem_token_file=str(smem.token_file), **settings)


def running_with_lease(farm, smem, job_id):
    wait_for("job %s running under a lease" % job_id,
             lambda: farm.job(job_id)["state"] == "running" and smem.live(), 120)
    [lease] = smem.live()
    assert lease["holder"] == "farm job " + job_id and lease["nodes"] == sorted(farm.nodes)
    return lease


def test_a_job_takes_renews_and_releases_its_lease(make_farm, smem):
    farm = leased_farm(make_farm, smem)        # renew every 2 s, TTL 30 s
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="1.0")
    farm.start_coordinator()
    job_id = farm.submit(frames=120)
    first = running_with_lease(farm, smem, job_id)
    # an smem without the renew route (405): a renewal releases and takes again, one live lease at a time
    wait_for("a renewal", lambda: smem.live() and smem.live()[0]["id"] != first["id"], 60)
    assert len(smem.live()) == 1
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert job["state"] == "done", job["reason"]
    assert smem.live() == []
    posts = [body for verb, body in smem.calls if verb == "POST"]
    assert len(posts) >= 2 and all(b["ttlSeconds"] == 30.0 and b["holder"] == "farm job " + job_id for b in posts)
    assert smem.calls[-1][0] == "DELETE"
    rows = farm.db.rows("SELECT * FROM leases WHERE job_id=?", (job_id,))
    assert len(rows) == len(posts) and all(r["released_at"] for r in rows)
    # the nodes went back when the last chunk was rendered (recorded first, then done), before the join's end
    events = [e["text"] for e in farm.db.view(job_id)["events"]]
    joining = next(i for i, e in enumerate(events) if "all chunks rendered" in e)
    done = next(i for i, e in enumerate(events) if e.startswith("done: "))
    assert joining < max(i for i, e in enumerate(events) if " released" in e) < done, events


def test_a_failing_job_releases_its_lease(make_farm, smem):
    farm = leased_farm(make_farm, smem)
    farm.start_workers(FARM_TEST_POISON="2", FARM_TEST_MIN_CHUNK_S="0.3")
    farm.start_coordinator()
    job_id = farm.submit(frames=120)
    running_with_lease(farm, smem, job_id)
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert job["state"] == "failed" and "the cap" in job["reason"]
    assert smem.live() == []
    assert all(r["released_at"] for r in farm.db.rows("SELECT * FROM leases WHERE job_id=?", (job_id,)))


def test_a_cancelled_job_releases_its_lease(make_farm, smem):
    farm = leased_farm(make_farm, smem)
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="1.0")
    farm.start_coordinator()
    job_id = farm.submit(frames=240)
    running_with_lease(farm, smem, job_id)
    assert farm.farm("cancel", job_id).returncode == 0
    assert farm.job(job_id)["state"] == "cancelled" and smem.live() == []


def test_at_start_the_coordinator_gives_back_what_jobs_no_longer_live_hold(make_farm, smem):
    farm = leased_farm(make_farm, smem)
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="1.0")
    farm.start_coordinator()
    job_id = farm.submit(frames=240)
    lease = running_with_lease(farm, smem, job_id)
    os.killpg(farm.coordinator.pid, signal.SIGKILL)      # the coordinator dies holding the lease
    farm.coordinator.wait(10)
    r = farm.farm("cancel", job_id, "--wait", "1")       # the job is no longer live
    assert r.returncode == 0 and "when it runs" in r.stdout, r.stdout
    # and a lease smem holds for a farm job the database does not know (taken just before a crash)
    orphan = LeaseClient(smem.url, LeaseStandIn.TOKEN).take(["other-node"], "farm job 0rphan00", 60)
    farm.start_coordinator()
    farm.wait_state(job_id, "cancelled", timeout=60)
    # recover() marks the job cancelled first and lists smem's leases after: wait for that pass too
    wait_for("the coordinator's start-up to give every lease back", lambda: smem.live() == [], 30,
             why=lambda: (smem.calls, farm.db.view(job_id)["events"], farm.log("coordinator.log")[-3000:]))
    deleted = [x for verb, x in smem.calls if verb == "DELETE"]
    assert lease["id"] in deleted and orphan["id"] in deleted

    def not_consuming():
        active = farm.active_queues()
        return active and len(active) == 3 and all(
            "farm.job." + job_id not in {q["name"] for q in qs} for qs in active.values())
    wait_for("the workers to stop consuming the job's queue", not_consuming, 30)


def test_a_job_waits_for_nodes_leased_elsewhere(make_farm, smem):
    farm = leased_farm(make_farm, smem)
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.3")
    other = LeaseClient(smem.url, LeaseStandIn.TOKEN)
    theirs = other.take([farm.nodes[0]], "someone else", 60)
    farm.start_coordinator()
    job_id = farm.submit(frames=60)
    wait_for("the job to wait for its nodes", lambda: any(
        "waiting for nodes" in e["text"] for e in farm.db.view(job_id)["events"]), 60)
    assert farm.job(job_id)["state"] == "submitted"
    other.release(theirs["id"])
    assert farm.wait_state(job_id, ("done", "failed"), timeout=120)["state"] == "done"
    assert smem.live() == []


def test_a_lost_lease_stops_the_nodes_at_once_and_the_job_waits_for_them(make_farm, smem):
    """smem lent the nodes to another (the lease had run out): no new chunk starts on them, the ones
    they render are stopped and re-queued without a charge, and the job goes on once it has them back."""
    farm = leased_farm(make_farm, smem)
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="1")
    farm.start_coordinator()
    job_id = farm.submit(frames=120)
    ours = running_with_lease(farm, smem, job_id)
    wait_for("a chunk rendering", lambda: farm.db.rows(
        "SELECT 1 FROM attempts WHERE job_id=? AND state='started'", (job_id,)), 60)
    smem.leases[ours["id"]]["released"] = True               # expired, as smem sees it
    other = LeaseClient(smem.url, LeaseStandIn.TOKEN)
    theirs = other.take(farm.nodes, "someone else", 60)
    wait_for("the job to give its nodes up", lambda: farm.job(job_id)["state"] == "submitted", 30)
    lost_at = time.time()
    stopped = farm.db.rows("SELECT * FROM attempts WHERE job_id=? AND state='interrupted'", (job_id,))
    assert stopped and all(a["charged"] == 0 and "lease lost" in a["error"] for a in stopped)
    time.sleep(3)
    assert farm.db.rows("SELECT * FROM attempts WHERE job_id=? AND started_at > ?", (job_id, lost_at + 1)) == []
    other.release(theirs["id"])
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert job["state"] == "done", job["reason"]
    assert farm.db.rows("SELECT * FROM node_failures WHERE job_id=?", (job_id,)) == []
    assert smem.live() == []


def test_the_lease_goes_back_only_once_the_consumers_are_cancelled(make_farm, smem):
    farm = leased_farm(make_farm, smem, lease_retry_s=1.0)
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.3")
    farm.start_coordinator(FARM_TEST_CANCEL_FAILS="3")
    job_id = farm.submit(frames=30)
    assert farm.wait_state(job_id, ("done", "failed"), timeout=120)["state"] == "done"
    events = farm.db.view(job_id)["events"]
    kept = [e["at"] for e in events if "the lease is kept" in e["text"]]
    released = [e["at"] for e in events if e["text"].endswith(" released")]
    assert len(kept) == 3 and len(released) == 1 and released[0] > max(kept), events
    assert smem.live() == []


def test_without_smem_the_job_runs_without_leases_and_says_so(make_farm):
    farm = make_farm()                                   # no smem_url
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.2")
    farm.start_coordinator()
    job_id = farm.submit(frames=60)
    assert farm.wait_state(job_id, ("done", "failed"), timeout=120)["state"] == "done"
    assert any("without leases" in e["text"] for e in farm.db.view(job_id)["events"])
    assert "no smem configured" in farm.log("coordinator.log")
    assert farm.db.rows("SELECT * FROM leases") == []


@pytest.mark.parametrize("patch", [False, True])
def test_the_lease_client(patch):
    smem = LeaseStandIn(patch=patch)
    try:
        c = LeaseClient(smem.url, LeaseStandIn.TOKEN)
        lease = c.take(["a", "b"], "farm job x", 30)
        assert lease["nodes"] == ["a", "b"] and lease["drained"] is True
        with pytest.raises(LeaseConflict):
            c.take(["b"], "farm job y", 30)
        renewed = c.renew(lease, "farm job x", 60)
        assert (renewed["id"] == lease["id"]) is patch     # without the route: released and taken again
        assert [x["id"] for x in c.live()] == [renewed["id"]]
        assert c.release(renewed["id"]) is True and c.release(renewed["id"]) is False
        with pytest.raises(LeaseError, match="403"):
            LeaseClient(smem.url, "wrong").take(["c"], "farm job z", 30)
    finally:
        smem.stop()
