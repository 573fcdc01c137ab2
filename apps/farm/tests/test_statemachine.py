"""The state machine alone, on a real SQLite file: the races between reports and decisions that the
engine tests meet only on a busy machine, played in the order that loses a chunk."""

from __future__ import annotations

import json
import time

from farm.config import Settings
from farm.db import DB
from farm.statemachine import StateMachine


def running_job(tmp_path, chunks=2):
    s = Settings(db_path=str(tmp_path / "farm.db"), parts_dir=str(tmp_path / "parts"))
    db = DB(s.db_path)
    plan = [(i, 10 * i, 10 * i + 9) for i in range(chunks)]
    jid = db.submit({"renderer": "testsrc", "fps": 10, "frames": 10 * chunks}, str(tmp_path / "out.mp4"),
                    ["n0", "n1"], plan, frames=10 * chunks, fps=10.0)
    sm = StateMachine(s, db)
    sm.running(jid)
    real_new_attempt = sm.new_attempt

    def new_attempt(c, *args, **kwargs):
        aid = real_new_attempt(c, *args, **kwargs)
        KEYS[aid] = c.execute("SELECT key FROM attempts WHERE id=?", (aid,)).fetchone()[0]
        return aid
    sm.new_attempt = new_attempt
    remember_keys(db)
    return sm, db, jid


KEYS: dict[str, str] = {}     # attempt id -> its key, as its message carried it to the node


def report(jid, attempt, event, node, **more):
    return {"event": event, "job": jid, "attempt": attempt, "node": node, "ts": time.time(),
            "key": KEYS.get(attempt), **more}


def remember_keys(db):
    KEYS.update({a["id"]: a["key"] for a in db.rows("SELECT id, key FROM attempts")})


def test_a_report_without_the_attempts_key_or_from_another_node_is_refused(tmp_path):
    """The key went out in the attempt's message alone: another node cannot mark it done, or lost
    so that its node is charged; once started, only its node reports on it."""
    sm, db, jid = running_job(tmp_path)
    a0 = db.one("SELECT id FROM attempts WHERE job_id=? AND idx=0", (jid,))["id"]
    sm.apply(report(jid, a0, "started", "n0"))
    parts = {"video": "%s/part-00000.ts" % jid, "audio": "%s/part-00000.wav" % jid}
    sm.apply({**report(jid, a0, "done", "n1", **parts), "key": None})          # no key
    sm.apply({**report(jid, a0, "lost", "n1"), "key": "guessed"})               # a wrong key
    sm.apply(report(jid, a0, "done", "n1", **parts))                            # the key, not its node
    got = db.one("SELECT * FROM attempts WHERE id=?", (a0,))
    assert got["state"] == "started" and db.rows("SELECT * FROM node_failures") == []
    refused = [e["text"] for e in db.rows("SELECT text FROM events WHERE job_id=?", (jid,)) if "refused" in e["text"]]
    assert len(refused) == 3 and "without the attempt's key" in refused[0] and "n0's" in refused[2], refused
    sm.apply(report(jid, a0, "done", "n0", **parts))
    assert db.one("SELECT state FROM chunks WHERE job_id=? AND idx=0", (jid,))["state"] == "done"


def test_a_chunk_a_node_took_as_the_lease_was_lost_is_stopped_and_queued_again(tmp_path):
    sm, db, jid = running_job(tmp_path)
    a0, a1 = (r["id"] for r in db.rows("SELECT id FROM attempts WHERE job_id=? ORDER BY idx", (jid,)))
    sm.apply(report(jid, a0, "started", "n0"))
    sm.lease_lost(db.job(jid), "lse_1", "its nodes are leased to another now")
    # n1 had taken chunk 1 before its consumer was cancelled; its report comes after the loss
    sm.apply(report(jid, a1, "started", "n1"))
    got = db.one("SELECT * FROM attempts WHERE id=?", (a1,))
    assert got["state"] == "interrupted" and got["charged"] == 0 and "lease lost" in got["error"]
    revoked = [i for row in db.rows("SELECT args FROM outbox WHERE action='revoke'")
               for i in json.loads(row["args"])["ids"]]
    assert a1 in revoked and a0 in revoked
    again = db.rows("SELECT * FROM attempts WHERE job_id=? AND idx=1 AND state='queued'", (jid,))
    assert len(again) == 1 and again[0]["id"] != a1 and again[0]["published"] == 0
    # the stopped render says it failed (SIGTERM): not the node's fault, and no third attempt
    sm.apply(report(jid, a1, "failed", "n1", error="Terminated"))
    assert db.rows("SELECT * FROM node_failures WHERE job_id=?", (jid,)) == []
    assert len(db.rows("SELECT * FROM attempts WHERE job_id=? AND idx=1", (jid,))) == 2


def test_a_render_that_ends_after_the_lease_was_lost_still_counts(tmp_path):
    sm, db, jid = running_job(tmp_path)
    a1 = db.one("SELECT id FROM attempts WHERE job_id=? AND idx=1", (jid,))["id"]
    sm.lease_lost(db.job(jid), "lse_1", "its nodes are leased to another now")
    sm.apply(report(jid, a1, "started", "n1"))
    sm.apply(report(jid, a1, "done", "n1", video="%s/part-00001.ts" % jid, audio="%s/part-00001.wav" % jid))
    chunk = db.one("SELECT * FROM chunks WHERE job_id=? AND idx=1", (jid,))
    assert chunk["state"] == "done" and chunk["node"] == "n1"
    # and the re-run queued for it is dropped, not rendered again once the job has nodes
    spare = db.rows("SELECT * FROM attempts WHERE job_id=? AND idx=1 AND id!=?", (jid, a1))
    assert [s["state"] for s in spare] == ["revoked"], spare
    assert db.job(jid)["state"] == "submitted"
    assert db.rows("SELECT * FROM node_failures WHERE job_id=?", (jid,)) == []


def started(sm, db, jid, idx, node, **progress):
    a = db.one("SELECT id FROM attempts WHERE job_id=? AND idx=? AND state='queued'", (jid, idx))["id"]
    sm.apply(report(jid, a, "started", node))
    if progress:
        sm.apply(report(jid, a, "progress", node, phase="render", **progress))
    return a


def test_a_render_whose_frames_advance_is_not_stalled_though_it_writes_no_byte(tmp_path):
    """Remotion writes a chunk's output only at its end: the renderer's frames are the progress."""
    sm, db, jid = running_job(tmp_path)
    a = started(sm, db, jid, 0, "n0", frames=3, written=0, elapsed=5.0)
    long_ago = sm.s.stall_after_s + 100
    db.c.execute("UPDATE attempts SET grew_at=grew_at-? WHERE id=?", (long_ago, a))
    stuck = [x[0]["id"] for x in sm.stuck(db.job(jid), time.time(), up_for=1e6)]
    assert stuck == [a]                                   # no frame and no byte for stall_after_s: hung
    sm.apply(report(jid, a, "progress", "n0", phase="render", frames=7, written=0, elapsed=6.0))
    assert sm.stuck(db.job(jid), time.time(), up_for=1e6) == []
    got = db.one("SELECT frames_done FROM attempts WHERE id=?", (a,))
    assert got["frames_done"] == 7
    db.c.execute("UPDATE attempts SET grew_at=grew_at-? WHERE id=?", (long_ago, a))
    (_, why, timed_out), = sm.stuck(db.job(jid), time.time(), up_for=1e6)
    assert "no progress" in why and "7 of 10 frames" in why and not timed_out


def test_time_limits_follow_the_jobs_measured_speed(tmp_path):
    """testsrc's estimate is 0.005 s a frame (limit 120.2 s for 10 frames); this job renders at 10 s a
    frame, measured on its first chunk, so a render at 30 s a frame is slow, not hung or failed."""
    sm, db, jid = running_job(tmp_path, chunks=3)
    sm.s.speed_sample_frames = 5
    a0 = started(sm, db, jid, 0, "n0")
    sm.apply(report(jid, a0, "done", "n0", video="%s/part-00000.ts" % jid, audio="%s/part-00000.wav" % jid,
                    seconds=100.0))
    started(sm, db, jid, 1, "n1", frames=5, written=0, elapsed=150.0)
    speed, source = sm.job_speed(db.c, db.job(jid))
    assert speed == (100.0 / 10 + 150.0 / 5) / 2 and "measured on 1 chunks, 1 rendering" == source
    assert sm.stuck(db.job(jid), time.time(), up_for=1e6) == []   # 150 s > 120.2 s, the estimate's limit
    assert sm.s.time_limit_s(10, 20.0) == 120 + 4 * 10 * 20.0
    assert sm.s.time_limit_s(10_000, 20.0) == sm.s.chunk_limit_cap_s


def test_a_chunk_too_slow_on_two_nodes_fails_the_job_and_charges_no_node(tmp_path):
    sm, db, jid = running_job(tmp_path, chunks=3)
    a0 = started(sm, db, jid, 0, "n0")
    sm.apply(report(jid, a0, "done", "n0", video="%s/part-00000.ts" % jid, audio="%s/part-00000.wav" % jid,
                    seconds=10.0))      # 1 s a frame: a 10-frame chunk's limit is 160 s
    for node in ("n0", "n1"):
        a = started(sm, db, jid, 1, node, frames=2, written=0, elapsed=500.0)
        (got, why, timed_out), = sm.stuck(db.job(jid), time.time(), up_for=0)
        assert got["id"] == a and timed_out and "too slow" in why, why
        sm.given_up(db.job(jid), got, why, timed_out=timed_out)
        if node == "n0":
            assert db.one("SELECT avoid FROM attempts WHERE job_id=? AND idx=1 AND state='queued'", (jid,))
            assert sm.failed_nodes(jid, 1) == ["n0"]           # the retry avoids it
    job = db.job(jid)
    assert job["state"] == "failed" and "too slow on n0 and n1" in job["reason"], job["reason"]
    assert "renders at" in job["reason"] and "no node is charged" in job["reason"]
    assert db.rows("SELECT * FROM node_failures WHERE job_id=?", (jid,)) == []


def test_a_chunk_too_slow_on_one_node_is_charged_there_once_another_renders_it(tmp_path):
    sm, db, jid = running_job(tmp_path, chunks=3)
    a0 = started(sm, db, jid, 0, "n0")
    sm.apply(report(jid, a0, "done", "n0", video="%s/part-00000.ts" % jid, audio="%s/part-00000.wav" % jid,
                    seconds=10.0))
    slow = started(sm, db, jid, 1, "n0", frames=2, written=0, elapsed=500.0)
    (got, why, timed_out), = sm.stuck(db.job(jid), time.time(), up_for=0)
    sm.given_up(db.job(jid), got, why, timed_out=timed_out)
    assert db.rows("SELECT * FROM node_failures WHERE job_id=?", (jid,)) == []    # not yet
    again = started(sm, db, jid, 1, "n1")
    sm.apply(report(jid, again, "done", "n1", video="%s/part-00001.ts" % jid, audio="%s/part-00001.wav" % jid,
                    seconds=10.0))
    assert [(r["node"], r["attempt_id"]) for r in db.rows("SELECT * FROM node_failures WHERE job_id=?", (jid,))] \
        == [("n0", slow)]


def test_a_full_host_disk_pauses_the_job_and_charges_nobody(tmp_path):
    sm, db, jid = running_job(tmp_path)
    a = started(sm, db, jid, 0, "n0")
    sm.apply(report(jid, a, "interrupted", "n0", host_full=True, error="HostFull: no space left"))
    got = db.one("SELECT * FROM attempts WHERE id=?", (a,))
    assert got["state"] == "interrupted" and got["charged"] == 0 and "no room" in got["error"]
    assert "no room" in db.job(jid)["paused"]
    assert db.one("SELECT count(*) AS n FROM attempts WHERE job_id=? AND idx=0 AND state='queued'", (jid,))["n"] == 1
    assert db.rows("SELECT * FROM node_failures") == []
    sm.resume(jid, "min_free_gib free again")
    assert db.job(jid)["paused"] is None
    assert any("resumed" in e["text"] for e in db.rows("SELECT text FROM events WHERE job_id=?", (jid,)))
