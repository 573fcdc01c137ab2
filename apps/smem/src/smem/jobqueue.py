"""The ingest queue, in the database: one job per document, claimed by one worker at a time.

A job's owner is "<worker name>/<random>": a stage checks it before it commits (Lost if the job was
taken away), and a worker that died is known by its name."""

from __future__ import annotations

import json
import secrets
import threading
import time
from datetime import UTC, datetime, timedelta

from smem import facts
from smem.config import Settings
from smem.db import DB, TIME_FMT, new_id, now


class Lost(Exception):
    """The job was taken from this worker (document deleted or replaced): drop it."""


def later(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime(TIME_FMT)


def age_s(stored: str | None) -> float | None:
    if not stored:
        return None
    t = datetime.strptime(stored, TIME_FMT).replace(tzinfo=UTC)
    return max(0.0, round(time.time() - t.timestamp(), 1))


class JobQueue:
    def __init__(self, db: DB, settings: Settings):
        self.db, self.settings = db, settings
        self.wake = threading.Event()

    def enqueue(self, ns: str, content: str, metadata: dict, custom_id: str | None, valid_at: str | None):
        """(document id, "queued"). The same customId again replaces the document: its chunks leave the
        indexes and its facts are superseded now; the new version is ingested from the start."""
        t = now()
        with self.db.tx() as c:
            old = custom_id and self.db.one("SELECT id FROM documents WHERE ns=? AND custom_id=?", (ns, custom_id))
            if old:
                doc_id = old["id"]
                facts.drop_chunk_index(c, doc_id)
                c.execute("DELETE FROM chunks WHERE document_id=?", (doc_id,))
                c.execute("DELETE FROM memories WHERE document_id=? AND indexed=0", (doc_id,))
                facts.supersede_document_facts(self.db, c, ns, doc_id, valid_at or t)
                c.execute("UPDATE documents SET content=?, metadata=?, valid_at=?, status='queued', error=NULL,"
                          " updated_at=? WHERE id=?", (content, json.dumps(metadata), valid_at, t, doc_id))
                c.execute("DELETE FROM jobs WHERE document_id=?", (doc_id,))
            else:
                doc_id = new_id("doc")
                c.execute("INSERT INTO documents(id, ns, custom_id, content, metadata, valid_at, status, created_at,"
                          " updated_at) VALUES (?,?,?,?,?,?,'queued',?,?)",
                          (doc_id, ns, custom_id, content, json.dumps(metadata), valid_at, t, t))
            c.execute("INSERT INTO jobs(ns, document_id, stage, state, run_after, created_at, updated_at)"
                      " VALUES (?,?,'chunk','queued',?,?,?)", (ns, doc_id, t, t, t))
        self.wake.set()
        return doc_id, "queued"

    def requeue_orphans(self, worker: str | None = None) -> int:
        """Jobs left 'running' by a dead process (at start, with the server lock held), or by one dead
        worker thread of this process (`worker`: its name)."""
        with self.db.tx() as c:
            if worker is None:
                c.execute("UPDATE jobs SET state='queued', owner=NULL, updated_at=? WHERE state='running'", (now(),))
            else:
                c.execute("UPDATE jobs SET state='queued', owner=NULL, updated_at=? WHERE state='running'"
                          " AND substr(owner, 1, ?) = ?", (now(), len(worker) + 1, worker + "/"))
            return self.db.conn.changes()

    def claim(self, worker: str) -> dict | None:
        owner = "%s/%s" % (worker, secrets.token_hex(4))
        with self.db.tx():
            rows = self.db.rows(
                "UPDATE jobs SET state='running', owner=?, updated_at=? WHERE id = (SELECT id FROM jobs"
                " WHERE state='queued' AND run_after <= ? ORDER BY id LIMIT 1) RETURNING *", (owner, now(), now()))
        return rows[0] if rows else None

    def release(self, job: dict) -> None:
        """Back to the queue as it is, no attempt spent: the worker, not the document, had the trouble."""
        with self.db.tx() as c:
            c.execute("UPDATE jobs SET state='queued', owner=NULL, updated_at=? WHERE id=? AND owner=?",
                      (now(), job["id"], job["owner"]))
        self.wake.set()

    def mine(self, job: dict) -> dict:
        """The job's stages, if this worker still holds it (call it inside the write transaction)."""
        row = self.db.one("SELECT state, owner, stages FROM jobs WHERE id=?", (job["id"],))
        if row is None or row["state"] != "running" or row["owner"] != job["owner"]:
            raise Lost()
        return json.loads(row["stages"])

    def advance(self, c, job: dict, stages: dict, name: str, result, *, nxt: str, status: str | None = None) -> None:
        stages[name] = result
        stages.pop("transient", None)   # the lane answered: a later fault starts its own window
        c.execute("UPDATE jobs SET stage=?, stages=?, updated_at=? WHERE id=?",
                  (nxt, json.dumps(stages), now(), job["id"]))
        if status:
            c.execute("UPDATE documents SET status=?, updated_at=? WHERE id=?", (status, now(), job["document_id"]))
        job["stage"] = nxt

    def failed_attempt(self, job: dict, reason: str, final: bool = False, result: dict | None = None) -> None:
        with self.db.tx() as c:
            row = self.db.one("SELECT attempts, owner, stages FROM jobs WHERE id=?", (job["id"],))
            if row is None or row["owner"] != job["owner"]:
                return
            attempts = row["attempts"] + 1
            stages = json.loads(row["stages"])
            if result is not None:
                stages[job["stage"]] = result
            stages.setdefault("errors", []).append({"stage": job["stage"], "error": reason, "at": now()})
            if final or attempts >= self.settings.job_max_attempts:
                c.execute("UPDATE jobs SET state='failed', attempts=?, error=?, stages=?, owner=NULL, updated_at=?"
                          " WHERE id=?", (attempts, reason, json.dumps(stages), now(), job["id"]))
                c.execute("UPDATE documents SET status='failed', error=?, updated_at=? WHERE id=?",
                          (reason, now(), job["document_id"]))
                # Facts of a failed document never reach the indexes, not even those of chunks that went well.
                c.execute("DELETE FROM memories WHERE document_id=? AND indexed=0", (job["document_id"],))
            else:
                wait = min(self.settings.retry_backoff_s * 2 ** attempts, 60)
                c.execute("UPDATE jobs SET state='queued', attempts=?, stages=?, owner=NULL, run_after=?, updated_at=?"
                          " WHERE id=?", (attempts, json.dumps(stages), later(wait), now(), job["id"]))

    def transient(self, job: dict, reason: str) -> None:
        """A model call failed outside the document (its nodes down, out of time, 5xx): no attempt spent;
        back to the queue with a growing wait, by which time a restarted node is back and a node marked
        down is tried again; failed (saying so) only when this has gone on for transient_retry_s."""
        s = self.settings
        with self.db.tx() as c:
            row = self.db.one("SELECT owner, stages FROM jobs WHERE id=?", (job["id"],))
            if row is None or row["owner"] != job["owner"]:
                return
            stages = json.loads(row["stages"])
            t = now()
            fault = stages.get("transient") or {"since": t, "tries": 0}
            fault = {**fault, "tries": fault["tries"] + 1, "stage": job["stage"], "error": reason, "at": t}
            stages["transient"] = fault
            if age_s(fault["since"]) >= s.transient_retry_s:
                why = "%s (the lane's nodes failed for %.0f s, %d tries)" % (reason, age_s(fault["since"]),
                                                                             fault["tries"])
                c.execute("UPDATE jobs SET state='failed', error=?, stages=?, owner=NULL, updated_at=? WHERE id=?",
                          (why, json.dumps(stages), t, job["id"]))
                c.execute("UPDATE documents SET status='failed', error=?, updated_at=? WHERE id=?",
                          (why, t, job["document_id"]))
                c.execute("DELETE FROM memories WHERE document_id=? AND indexed=0", (job["document_id"],))
                return
            wait = min(s.transient_backoff_s * 2 ** (fault["tries"] - 1), s.transient_backoff_max_s)
            c.execute("UPDATE jobs SET state='queued', stages=?, owner=NULL, run_after=?, updated_at=? WHERE id=?",
                      (json.dumps(stages), later(wait), t, job["id"]))

    def wait(self, job: dict, reason: str) -> None:
        """Back to the queue after lease_wait_s, no attempt spent (the lane's nodes are leased away)."""
        with self.db.tx() as c:
            row = self.db.one("SELECT owner, stages FROM jobs WHERE id=?", (job["id"],))
            if row is None or row["owner"] != job["owner"]:
                return
            stages = json.loads(row["stages"])
            stages["waiting"] = {"stage": job["stage"], "reason": reason, "at": now()}
            c.execute("UPDATE jobs SET state='queued', stages=?, owner=NULL, run_after=?, updated_at=? WHERE id=?",
                      (json.dumps(stages), later(self.settings.lease_wait_s), now(), job["id"]))

    def stats(self) -> dict:
        """Queued and running counts, how long the oldest due job has waited and how long ago a job last
        moved (seconds, or None)."""
        t = now()
        counts = dict(self.db.conn.execute("SELECT state, count(*) FROM jobs WHERE state IN ('queued','running')"
                                           " GROUP BY state").fetchall())
        oldest = self.db.scalar("SELECT min(run_after) FROM jobs WHERE state='queued' AND run_after <= ?", (t,))
        moved = self.db.scalar("SELECT max(updated_at) FROM jobs")
        return {"queued": counts.get("queued", 0), "running": counts.get("running", 0),
                "oldestDueAgeS": age_s(oldest), "lastProgressAgeS": age_s(moved)}
