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
    return sm, db, jid


def report(jid, attempt, event, node, **more):
    return {"event": event, "job": jid, "attempt": attempt, "node": node, "ts": time.time(), **more}


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
