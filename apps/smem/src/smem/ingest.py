"""Ingest as a durable job queue in the database.

One job per document walks the stages chunk -> embed -> extract -> judge -> index. Each stage
commits its results and the move to the next stage in one transaction, so a process killed at
any point resumes from the last committed stage and never writes a stage's rows twice."""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from datetime import UTC, datetime, timedelta

import numpy as np

from smem.config import Settings
from smem.db import DB, TIME_FMT, new_id, now, vec_blob
from smem.embed import Embedder
from smem.extract import ExtractionError, Extractor
from smem.lanes import NoNode
from smem.text import date_label, estimate_tokens, index_texts, normalise, units

log = logging.getLogger("smem.ingest")

STAGES = ("chunk", "embed", "extract", "judge", "index")


class Lost(Exception):
    """The job was taken from this worker (document deleted or replaced): drop it."""


class FinalFailure(Exception):
    """The stage failed for good (the LLM's answers failed validation): no more attempts.
    `result` is recorded as the stage's entry in the job's stages."""

    def __init__(self, reason: str, result: dict):
        super().__init__(reason)
        self.result = result


def _later(seconds: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime(TIME_FMT)


class Pipeline:
    def __init__(self, db: DB, embedder: Embedder, settings: Settings, extractor: Extractor | None = None,
                 judge=None):
        self.db = db
        self.embedder = embedder
        self.settings = settings
        self.extractor = extractor
        self.judge = judge  # smem.llm.LLMJudge; None: the judge is the duplicate check only
        self.wake = threading.Event()

    # -- the queue -------------------------------------------------------------------------
    def enqueue(self, ns: str, content: str, metadata: dict, custom_id: str | None, valid_at: str | None):
        t = now()
        with self.db.tx() as c:
            old = custom_id and self.db.one("SELECT id FROM documents WHERE ns=? AND custom_id=?", (ns, custom_id))
            if old:
                doc_id = old["id"]
                self._drop_index(c, doc_id)
                c.execute("DELETE FROM chunks WHERE document_id=?", (doc_id,))
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

    def requeue_orphans(self) -> int:
        """At start, with the server lock held: jobs left 'running' belong to a dead process."""
        with self.db.tx() as c:
            c.execute("UPDATE jobs SET state='queued', owner=NULL, updated_at=? WHERE state='running'", (now(),))
            return self.db.conn.changes()

    def claim(self, worker: str) -> dict | None:
        owner = "%s/%s" % (worker, secrets.token_hex(4))
        with self.db.tx():
            rows = self.db.rows(
                "UPDATE jobs SET state='running', owner=?, updated_at=? WHERE id = (SELECT id FROM jobs"
                " WHERE state='queued' AND run_after <= ? ORDER BY id LIMIT 1) RETURNING *", (owner, now(), now()))
        return rows[0] if rows else None

    def run_until_idle(self, worker: str = "inline") -> int:
        """Runs due jobs in this thread until none is left; for tests and tools."""
        n = 0
        while (job := self.claim(worker)) is not None:
            self.run_job(job)
            n += 1
        return n

    # -- one job ---------------------------------------------------------------------------
    def run_job(self, job: dict) -> None:
        try:
            while job["stage"] != "done":
                getattr(self, "_stage_" + job["stage"])(job)
        except Lost:
            log.info("job %s: taken away, dropped", job["id"])
        except NoNode as e:
            if not e.leased_only:
                log.warning("job %s stage %s: %s", job["id"], job["stage"], e)
                self._failed_attempt(job, "%s: %s" % (job["stage"], e))
            else:   # the render farm has the lane's nodes: wait for them, no attempt spent
                self._wait(job, "%s: %s" % (job["stage"], e))
        except FinalFailure as e:
            log.warning("job %s stage %s: %s", job["id"], job["stage"], e)
            self._failed_attempt(job, "%s: %s" % (job["stage"], e), final=True, result=e.result)
        except Exception as e:  # any stage error: retry, bounded, then fail with the reason
            log.warning("job %s stage %s: %s", job["id"], job["stage"], e)
            self._failed_attempt(job, "%s: %s" % (job["stage"], e))

    def _mine(self, c, job: dict) -> dict:
        row = self.db.one("SELECT state, owner, stages FROM jobs WHERE id=?", (job["id"],))
        if row is None or row["state"] != "running" or row["owner"] != job["owner"]:
            raise Lost()
        return json.loads(row["stages"])

    def _advance(self, c, job: dict, stages: dict, name: str, result, *, nxt: str, status: str | None = None) -> None:
        stages[name] = result
        c.execute("UPDATE jobs SET stage=?, stages=?, updated_at=? WHERE id=?",
                  (nxt, json.dumps(stages), now(), job["id"]))
        if status:
            c.execute("UPDATE documents SET status=?, updated_at=? WHERE id=?", (status, now(), job["document_id"]))
        job["stage"] = nxt

    def _failed_attempt(self, job: dict, reason: str, final: bool = False, result: dict | None = None) -> None:
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
                          " WHERE id=?", (attempts, json.dumps(stages), _later(wait), now(), job["id"]))

    def _wait(self, job: dict, reason: str) -> None:
        with self.db.tx() as c:
            row = self.db.one("SELECT owner, stages FROM jobs WHERE id=?", (job["id"],))
            if row is None or row["owner"] != job["owner"]:
                return
            stages = json.loads(row["stages"])
            stages["waiting"] = {"stage": job["stage"], "reason": reason, "at": now()}
            c.execute("UPDATE jobs SET state='queued', stages=?, owner=NULL, run_after=?, updated_at=? WHERE id=?",
                      (json.dumps(stages), _later(self.settings.lease_wait_s), now(), job["id"]))

    def _drop_index(self, c, doc_id: str) -> None:
        for (rowid,) in c.execute("SELECT rowid FROM chunks WHERE document_id=? AND indexed=1", (doc_id,)).fetchall():
            c.execute("DELETE FROM chunks_fts WHERE rowid=?", (rowid,))
            c.execute("DELETE FROM vec_chunks WHERE rowid=?", (rowid,))

    # -- the stages ------------------------------------------------------------------------
    def _stage_chunk(self, job: dict) -> None:
        doc = self.db.one("SELECT content FROM documents WHERE id=?", (job["document_id"],))
        pieces = units(doc["content"], self.settings.chunk_tokens) if doc else []
        with self.db.tx() as c:
            stages = self._mine(c, job)
            self._drop_index(c, job["document_id"])
            c.execute("DELETE FROM memories WHERE document_id=? AND indexed=0", (job["document_id"],))
            c.execute("DELETE FROM chunks WHERE document_id=?", (job["document_id"],))
            for seq, text in enumerate(pieces):
                c.execute("INSERT INTO chunks(id, ns, document_id, seq, content, tokens) VALUES (?,?,?,?,?,?)",
                          (new_id("chk"), job["ns"], job["document_id"], seq, text, estimate_tokens(text)))
            self._advance(c, job, stages, "chunk", {"state": "done", "chunks": len(pieces)},
                          nxt="embed", status="extracting")

    def _stage_embed(self, job: dict) -> None:
        while True:
            todo = self.db.rows("SELECT rowid, content FROM chunks WHERE document_id=? AND embedding IS NULL"
                                " ORDER BY seq LIMIT ?", (job["document_id"], self.settings.embed_batch))
            if not todo:
                break
            if self.settings.test_chunk_sleep_s:
                time.sleep(self.settings.test_chunk_sleep_s * len(todo))
            vectors = self.embedder.embed([r["content"] for r in todo])
            with self.db.tx() as c:
                self._mine(c, job)
                for r, v in zip(todo, vectors, strict=True):
                    c.execute("UPDATE chunks SET embedding=? WHERE rowid=?", (vec_blob(v), r["rowid"]))
        with self.db.tx() as c:
            stages = self._mine(c, job)
            self._advance(c, job, stages, "embed", {"state": "done", "model": self.embedder.name}, nxt="extract")

    def _stage_extract(self, job: dict) -> None:
        if self.extractor is None:
            with self.db.tx() as c:
                stages = self._mine(c, job)
                self._advance(c, job, stages, "extract", {"state": "skipped", "reason": "no LLM configured"},
                              nxt="judge")
            return
        doc = self.db.one("SELECT valid_at FROM documents WHERE id=?", (job["document_id"],))
        chunks = self.db.rows("SELECT id, content FROM chunks WHERE document_id=? ORDER BY seq", (job["document_id"],))
        # Chunk by chunk, each chunk's facts committed with the progress: a retry or a restart goes on from there.
        progress = json.loads(self.db.scalar("SELECT stages FROM jobs WHERE id=?", (job["id"],))).get("extract", {})
        if progress.get("state") != "partial":
            progress = {"state": "partial", "chunks": len(chunks), "chunksDone": 0, "facts": 0,
                        "model": self.extractor.model}
        for ch in chunks[progress["chunksDone"]:]:
            try:
                facts = self.extractor.extract(ch["content"], {"ns": job["ns"], "documentId": job["document_id"]})
            except ExtractionError as e:
                raise FinalFailure(str(e), {**progress, "state": "failed", "failedChunk": ch["id"],
                                            "reason": str(e)}) from e
            vectors = self.embedder.embed([f.content for f in facts]) if facts else []
            t = now()
            with self.db.tx() as c:
                stages = self._mine(c, job)
                for f, v in zip(facts, vectors, strict=True):
                    c.execute("INSERT INTO memories(id, ns, content, valid_from, recorded_at, origin, document_id,"
                              " source_chunk_id, model, prompt_hash, embedding)"
                              " VALUES (?,?,?,?,?,'extracted',?,?,?,?,?)",
                              (new_id("mem"), job["ns"], f.content, f.valid_at or (doc and doc["valid_at"]) or t, t,
                               job["document_id"], ch["id"], self.extractor.model, self.extractor.prompt_hash,
                               vec_blob(v)))
                progress = {**progress, "chunksDone": progress["chunksDone"] + 1,
                            "facts": progress["facts"] + len(facts)}
                stages["extract"] = progress
                c.execute("UPDATE jobs SET stages=?, updated_at=? WHERE id=?", (json.dumps(stages), t, job["id"]))
        with self.db.tx() as c:
            stages = self._mine(c, job)
            self._advance(c, job, stages, "extract", {"state": "done", "facts": progress["facts"],
                                                      "model": self.extractor.model}, nxt="judge")

    def _decide(self, ns: str, m: dict) -> dict:
        """How a pending fact relates to the namespace's current facts; the LLM only where some are close."""
        vector = np.frombuffer(m["embedding"], np.float32)
        same = find_duplicate(self.db, ns, m["content"], vector, self.settings.near_duplicate)
        if same:
            return {"decision": "duplicate", "target": same}
        if self.judge is None:
            return {"decision": "new", "target": None}
        close = nearest_current(self.db, ns, vector, self.settings.judge_candidates, self.settings.judge_close)
        if not close:
            return {"decision": "new", "target": None}
        try:
            return self.judge.decide(m["content"], close)
        except ExtractionError as e:
            raise FinalFailure(str(e), {"state": "failed", "memory": m["id"], "reason": str(e)}) from e

    def _stage_judge(self, job: dict) -> None:
        stages = json.loads(self.db.scalar("SELECT stages FROM jobs WHERE id=?", (job["id"],)))
        pending = self.db.rows("SELECT id, content, embedding, valid_from FROM memories WHERE document_id=?"
                               " AND indexed=0 ORDER BY rowid", (job["document_id"],))
        skipped = stages.get("extract", {}).get("state") == "skipped"
        # The LLM is asked outside the write transaction; the transaction checks the targets are still current.
        decisions = [] if skipped else [(m, self._decide(job["ns"], m)) for m in pending]
        with self.db.tx() as c:
            stages = self._mine(c, job)
            if skipped:
                result = {"state": "skipped", "reason": "nothing extracted"}
            else:
                n = dict.fromkeys(("new", "duplicate", *(("supersedes", "extends") if self.judge else ())), 0)
                closing = set()
                for m, d in decisions:
                    kind, target = d["decision"], d["target"]
                    old = target and self.db.one("SELECT valid_from FROM memories WHERE id=? AND indexed=1 AND"
                                                 " valid_to IS NULL AND forgotten_at IS NULL", (target,))
                    if kind != "new" and not old:
                        kind = "new"  # the target was closed or forgotten meanwhile
                    # A fact closes another only if it is later, and only one fact of the document closes it.
                    if kind == "supersedes" and (m["valid_from"] <= old["valid_from"] or target in closing):
                        kind = "new"
                    if kind == "supersedes":
                        closing.add(target)
                    if kind == "duplicate":
                        c.execute("DELETE FROM memories WHERE id=?", (m["id"],))
                        self.db.history(c, job["ns"], target, "duplicate", None, documentId=job["document_id"],
                                        content=m["content"])
                    elif kind in ("supersedes", "extends"):
                        c.execute("UPDATE memories SET %s=? WHERE id=?" % kind, (target, m["id"]))
                    n[kind] += 1
                result = {"state": "done", **n}
                if self.judge:
                    result.update(model=self.judge.model, promptHash=self.judge.prompt_hash)
            self._advance(c, job, stages, "judge", result, nxt="index", status="indexing")

    def _stage_index(self, job: dict) -> None:
        with self.db.tx() as c:
            stages = self._mine(c, job)
            # BM25 reads each chunk with its neighbours and the document's date; the vector is the chunk's own.
            doc = self.db.one("SELECT valid_at FROM documents WHERE id=?", (job["document_id"],))
            rows = self.db.rows("SELECT rowid, content, embedding, indexed FROM chunks WHERE document_id=?"
                                " ORDER BY seq", (job["document_id"],))
            s = self.settings
            texts = index_texts([r["content"] for r in rows], before=s.context_before, after=s.context_after,
                                header=date_label(doc and doc["valid_at"]) if s.context_date else None)
            for r, text in zip(rows, texts, strict=True):
                if r["indexed"]:
                    continue
                c.execute("INSERT INTO chunks_fts(rowid, content, ns) VALUES (?,?,?)", (r["rowid"], text, job["ns"]))
                c.execute("INSERT INTO vec_chunks(rowid, ns, embedding) VALUES (?,?,?)",
                          (r["rowid"], job["ns"], r["embedding"]))
            c.execute("UPDATE chunks SET indexed=1 WHERE document_id=?", (job["document_id"],))
            for m in self.db.rows("SELECT rowid, id, content, embedding, valid_from, supersedes, extends"
                                  " FROM memories WHERE document_id=? AND indexed=0", (job["document_id"],)):
                index_memory(c, job["ns"], m)
                self.db.history(c, job["ns"], m["id"], "created", m["supersedes"] or m["extends"],
                                documentId=job["document_id"])
                if m["supersedes"]:
                    # As a caller's supersedes: the old fact is closed in the world's time, expired in smem's.
                    c.execute("UPDATE memories SET valid_to=?, expired_at=? WHERE id=? AND valid_to IS NULL",
                              (m["valid_from"], now(), m["supersedes"]))
                    if c.changes():
                        self.db.history(c, job["ns"], m["supersedes"], "superseded", m["id"])
                if m["extends"]:
                    self.db.history(c, job["ns"], m["extends"], "extended", m["id"])
            self._advance(c, job, stages, "index", {"state": "done"}, nxt="done", status="done")
            c.execute("UPDATE jobs SET state='done', owner=NULL WHERE id=?", (job["id"],))


def index_memory(c, ns: str, m: dict) -> None:
    c.execute("INSERT INTO memories_fts(rowid, content, ns) VALUES (?,?,?)", (m["rowid"], m["content"], ns))
    c.execute("INSERT INTO vec_memories(rowid, ns, embedding) VALUES (?,?,?)", (m["rowid"], ns, m["embedding"]))
    c.execute("UPDATE memories SET indexed=1 WHERE rowid=?", (m["rowid"],))


def find_duplicate(db: DB, ns: str, content: str, vector: np.ndarray, near: float) -> str | None:
    """The judge, as far as this slice goes: an exact (normalised) or near (cosine) duplicate of a current fact."""
    key = normalise(content)
    for m in db.rows("SELECT id, content FROM memories WHERE ns=? AND indexed=1 AND valid_to IS NULL"
                     " AND forgotten_at IS NULL", (ns,)):
        if normalise(m["content"]) == key:
            return m["id"]
    for hit in db.rows("SELECT rowid, distance FROM vec_memories WHERE embedding MATCH ? AND k = 10 AND ns = ?",
                       (vec_blob(vector), ns)):
        if 1 - hit["distance"] < near:
            break
        m = db.one("SELECT id FROM memories WHERE rowid=? AND valid_to IS NULL AND forgotten_at IS NULL",
                   (hit["rowid"],))
        if m:
            return m["id"]
    return None


def nearest_current(db: DB, ns: str, vector: np.ndarray, k: int, close: float) -> list[dict]:
    """Up to k current facts of the namespace with cosine >= close to vector, nearest first."""
    out = []
    for hit in db.rows("SELECT rowid, distance FROM vec_memories WHERE embedding MATCH ? AND k = ? AND ns = ?",
                       (vec_blob(vector), 4 * k, ns)):
        if 1 - hit["distance"] < close or len(out) >= k:
            break
        m = db.one("SELECT id, content FROM memories WHERE rowid=? AND valid_to IS NULL AND forgotten_at IS NULL",
                   (hit["rowid"],))
        if m:
            out.append(m)
    return out


class Worker(threading.Thread):
    def __init__(self, pipeline: Pipeline, name: str):
        super().__init__(name=name, daemon=True)
        self.pipeline = pipeline
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                job = self.pipeline.claim(self.name)
            except Exception:
                log.exception("claim")
                job = None
            if job is None:
                self.pipeline.wake.wait(self.pipeline.settings.poll_interval_s)
                self.pipeline.wake.clear()
                continue
            self.pipeline.run_job(job)

    def stop(self) -> None:
        self.stopping.set()
        self.pipeline.wake.set()
