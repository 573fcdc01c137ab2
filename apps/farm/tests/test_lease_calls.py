"""The coordinator never waits on smem (issue 39, point 5): every lease call runs off its loop, so its
AMQP heartbeats go on while smem holds a take (smem answers once the nodes' calls in flight are done);
a lease smem granted but the farm did not record (a take that timed out, a renewal answered too late)
is found and released, and a sweep never releases the lease of a take still under way.

LeaseKeeper against the lease stand-in, driven as the coordinator's tick drives it; then the real
coordinator with a real broker (broker_heartbeat 6 s: the broker drops a peer silent for two of them)."""

from __future__ import annotations

import time

import pytest
from _engine import LeaseStandIn, broker_fixture, make_farm_fixture, wait_for  # noqa: F401 (fixtures)

from farm.config import load
from farm.db import DB
from farm.leases import ORPHANS, SWEEP, LeaseClient, LeaseError, LeaseKeeper

NODES = ["a", "b"]


@pytest.fixture(name="smem_at")
def smem_at_fixture():
    made = []

    def make(**kw) -> LeaseStandIn:
        made.append(LeaseStandIn(**kw))
        return made[-1]
    yield make
    for s in made:
        s.stop()


def keeper_for(tmp_path, smem, *, take_timeout: float = 30.0, **settings) -> tuple[LeaseKeeper, str]:
    s = load(None, db_path=str(tmp_path / "farm.db"), **{"lease_sweep_s": 3600.0, **settings})
    db = DB(s.db_path)
    jid = db.submit({"renderer": "testsrc"}, "x.mp4", NODES, [(0, 0, 9)], frames=10, fps=30)
    keeper = LeaseKeeper(s, db, LeaseClient(smem.url, LeaseStandIn.TOKEN, timeout=5, take_timeout=take_timeout))
    sweep_to_the_end(keeper)               # the one at start: later sweeps are the ones a test asks for
    return keeper, jid


def sweep_to_the_end(keeper: LeaseKeeper) -> None:
    """Ticks the sweep until one has listed smem's leases and released what it found."""
    keeper.sweep()
    wait_for("the sweep", lambda: keeper.sweep() or not ({SWEEP, ORPHANS} & set(keeper.calls)), 30, every=0.05)


def take_until_granted(keeper: LeaseKeeper, jid: str) -> dict:
    return wait_for("the lease", lambda: keeper.take(jid, NODES), 60, every=0.05)


def deleted(smem) -> list[str]:
    return [x for verb, x in smem.calls if verb == "DELETE"]


def test_a_take_under_way_returns_at_once_and_a_sweep_leaves_its_lease_alone(tmp_path, smem_at):
    smem = smem_at(hold=[8])                         # smem records the lease, then drains for 8 s
    keeper, jid = keeper_for(tmp_path, smem)
    assert keeper.take(jid, NODES) is None and keeper.busy(jid, "take")
    wait_for("smem to record the lease", smem.live, 30)
    keeper.sweep_wanted = True
    sweep_to_the_end(keeper)                         # smem lists a farm job's lease that farm.db does not hold
    assert deleted(smem) == [] and keeper.busy(jid, "take")
    lease = take_until_granted(keeper, jid)
    assert lease["id"] == smem.live()[0]["id"] and lease["holder"] == "farm job " + jid
    assert keeper.db.one("SELECT id FROM leases WHERE job_id=? AND released_at IS NULL", (jid,))["id"] == lease["id"]
    assert deleted(smem) == []


def test_a_take_that_timed_out_is_found_released_and_taken_again(tmp_path, smem_at):
    smem = smem_at(hold=[20])                        # longer than the farm waits for a take
    keeper, jid = keeper_for(tmp_path, smem, take_timeout=1.0)
    assert keeper.take(jid, NODES) is None

    def timed_out():
        try:
            keeper.take(jid, NODES)
        except LeaseError as e:
            return str(e)
        return None
    why = wait_for("the take to time out", timed_out, 30, every=0.05)
    assert "smem did not answer the take in time" in why
    [late] = smem.live()                             # smem granted it all the same
    assert keeper.take(jid, NODES) is None and not keeper.busy(jid)     # no new take before the sweep
    sweep_to_the_end(keeper)
    assert deleted(smem) == [late["id"]] and smem.live() == []
    assert any(e["text"] == "lease %s released: smem held it for the farm, farm.db did not" % late["id"]
               for e in keeper.db.view(jid)["events"])
    lease = take_until_granted(keeper, jid)
    assert lease["id"] != late["id"] and [x["id"] for x in smem.live()] == [lease["id"]]


def test_the_periodic_sweep_releases_only_the_farms_leases_farm_db_does_not_hold(tmp_path, smem_at):
    smem = smem_at()
    keeper, jid = keeper_for(tmp_path, smem, lease_sweep_s=0.2)
    ours = take_until_granted(keeper, jid)
    other = LeaseClient(smem.url, LeaseStandIn.TOKEN)
    stray = other.take(["c"], "farm job " + jid, 60)              # the same job's, never recorded
    unknown = other.take(["d"], "farm job 0rphan00", 60)          # a job farm.db does not know
    theirs = other.take(["e"], "someone else", 60)                # not the farm's
    wait_for("the periodic sweep", lambda: keeper.sweep() or len(deleted(smem)) == 2, 30, every=0.05)
    assert sorted(deleted(smem)) == sorted([stray["id"], unknown["id"]])
    assert sorted(x["id"] for x in smem.live()) == sorted([ours["id"], theirs["id"]])


def test_a_renewal_smem_does_not_answer_in_time_loses_the_lease_and_its_late_answer_is_released(tmp_path, smem_at):
    # no renew route (405): a renewal is a release and a take, and smem holds that take
    smem = smem_at(hold=[0, 6])          # the renewal's take answered 6 s late; given up after 2 s
    keeper, jid = keeper_for(tmp_path, smem, lease_ttl_s=12.0, lease_renew_s=10.0)
    first = take_until_granted(keeper, jid)
    assert keeper.renew(jid) is None and keeper.busy(jid, "renew")
    lost = wait_for("the renewal to be given up", lambda: keeper.renew(jid), 30, every=0.05)
    assert lost == (first["id"], "smem did not answer its renewal before it runs out")
    keeper.db.c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), first["id"]))  # as lease_lost
    assert not keeper.busy(jid) and deleted(smem) == [first["id"]]      # the renewal's release, then its take
    late = wait_for("smem to grant the renewal's take", lambda: [x for x in smem.live() if x["id"] != first["id"]], 30)
    wait_for("the late renewal's lease to be released",
             lambda: keeper.sweep() or late[0]["id"] in deleted(smem), 60, every=0.05)
    assert deleted(smem) == [first["id"], late[0]["id"]] and smem.live() == []


def test_the_coordinator_keeps_its_broker_while_smem_holds_a_take(make_farm, smem_at, tmp_path):
    """smem holds the take 25 s; the farm gives up waiting after 18 s, longer than the broker lets a
    silent peer live (two heartbeats of 6 s): a loop that waited would lose its connection."""
    smem = smem_at(hold=[25], patch=True)            # renewals by PATCH: the takes are the job's two
    (tmp_path / "smem-token").write_text(LeaseStandIn.TOKEN + "\n")
    farm = make_farm(smem_url=smem.url, smem_token_file=str(tmp_path / "smem-token"), lease_take_timeout_s=18.0)
    farm.start_workers(FARM_TEST_MIN_CHUNK_S="0.3")
    farm.start_coordinator()
    job_id = farm.submit(frames=60)
    job = farm.wait_state(job_id, ("done", "failed"), timeout=180)
    assert job["state"] == "done", job["reason"]
    log = farm.log("coordinator.log")
    assert "broker connection lost" not in log, log
    posts = [body for verb, body in smem.calls if verb == "POST"]
    late, ours = "lse_1", "lse_2"
    assert len(posts) == 2 and all(b["holder"] == "farm job " + job_id for b in posts)
    assert deleted(smem)[0] == late and ours in deleted(smem) and smem.live() == []
    texts = [e["text"] for e in farm.db.view(job_id)["events"]]
    assert any("smem did not answer the take in time" in t for t in texts), texts
    assert "lease %s released: smem held it for the farm, farm.db did not" % late in texts
    assert [r["id"] for r in farm.db.rows("SELECT id FROM leases WHERE job_id=?", (job_id,))] == [ours]
