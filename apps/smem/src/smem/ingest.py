"""Ingest: the stages a document's job walks, chunk -> embed -> extract -> judge -> index.

Each stage commits its results and the move to the next stage in one transaction, so a process killed
at any point resumes from the last committed stage and never writes a stage's rows twice. The queue
is smem.jobqueue, the judge smem.judge, the workers smem.workers."""

from __future__ import annotations

import json
import logging
import time

import apsw

from smem import facts, vectors
from smem.config import Settings
from smem.db import DB, content_key, new_id, now, vec_blob
from smem.embed import Embedder, EmbedderError
from smem.extract import ExtractionError, Extractor, nearest, window_text, windows
from smem.jobqueue import JobQueue, Lost
from smem.judge import Judge, JudgeFailed
from smem.lanes import InputTooLarge, NoNode
from smem.text import estimate_tokens, normalise, units

log = logging.getLogger("smem.ingest")

STAGES = ("chunk", "embed", "extract", "judge", "index")


class FinalFailure(Exception):
    """The stage failed for good (the LLM's answers failed validation, the input is too large for the
    model): no more attempts. `result` is recorded as the stage's entry in the job's stages."""

    def __init__(self, reason: str, result: dict):
        super().__init__(reason)
        self.result = result


class Pipeline:
    def __init__(self, db: DB, embedder: Embedder, settings: Settings, extractor: Extractor | None = None,
                 judge=None):
        """judge: smem.llm.LLMJudge, or None (then the judge is the duplicate check only)."""
        self.db = db
        self.embedder = embedder
        self.settings = settings
        self.extractor = extractor
        self.queue = JobQueue(db, settings)
        self.judge = Judge(db, settings, judge)
        self.wake = self.queue.wake
        self.enqueue = self.queue.enqueue
        self.claim = self.queue.claim
        self.requeue_orphans = self.queue.requeue_orphans

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
        except apsw.Error:
            raise   # the database's trouble (disk full, I/O), not the document's: the worker retries it
        except NoNode as e:
            if not e.leased_only:   # the nodes' fault, not the document's: retried for minutes
                log.warning("job %s stage %s: %s", job["id"], job["stage"], e)
                self.queue.transient(job, "%s: %s" % (job["stage"], e))
            else:   # the render farm has the lane's nodes: wait for them, no attempt spent
                self.queue.wait(job, "%s: %s" % (job["stage"], e))
        except EmbedderError as e:
            log.warning("job %s stage %s: %s", job["id"], job["stage"], e)
            if getattr(e, "transient", False):
                self.queue.transient(job, "%s: %s" % (job["stage"], e))
            else:
                self.queue.failed_attempt(job, "%s: %s" % (job["stage"], e))
        except FinalFailure as e:
            log.warning("job %s stage %s: %s", job["id"], job["stage"], e)
            self.queue.failed_attempt(job, "%s: %s" % (job["stage"], e), final=True, result=e.result)
        except Exception as e:  # any stage error: retry, bounded, then fail with the reason
            log.warning("job %s stage %s: %s", job["id"], job["stage"], e)
            self.queue.failed_attempt(job, "%s: %s" % (job["stage"], e))

    def _mine(self, c, job: dict) -> dict:
        return self.queue.mine(job)

    def _advance(self, c, job: dict, stages: dict, name: str, result, *, nxt: str, status: str | None = None) -> None:
        self.queue.advance(c, job, stages, name, result, nxt=nxt, status=status)

    # -- the stages ------------------------------------------------------------------------
    def _stage_chunk(self, job: dict) -> None:
        doc = self.db.one("SELECT content FROM documents WHERE id=?", (job["document_id"],))
        pieces = units(doc["content"], self.settings.chunk_tokens, self.settings.turn_tokens) if doc else []
        with self.db.tx() as c:
            stages = self._mine(c, job)
            facts.drop_chunk_index(c, job["document_id"])
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
            try:
                vectors = self.embedder.embed([r["content"] for r in todo])
            except InputTooLarge as e:   # the document's fault: a retry would fail the same way
                raise FinalFailure(str(e), {"state": "failed", "reason": str(e)}) from e
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
        chunks = self.db.rows("SELECT id, content, tokens, embedding FROM chunks WHERE document_id=? ORDER BY seq",
                              (job["document_id"],))
        # Window by window (extract.windows: consecutive chunks up to extract_window_tokens, overlapping by
        # extract_overlap_chunks), each window's facts committed with the progress: a retry or a restart goes
        # on from the next window. The windows are planned once and kept in the progress.
        progress = json.loads(self.db.scalar("SELECT stages FROM jobs WHERE id=?", (job["id"],))).get("extract", {})
        if progress.get("state") != "partial":
            progress = {"state": "partial", "chunks": len(chunks), "chunksDone": 0, "facts": 0,
                        "model": self.extractor.model}
        if "windows" not in progress:   # planned now (or after chunksDone, by a job of an older smem)
            done = progress["chunksDone"]
            plan = windows([ch["tokens"] for ch in chunks[done:]], self.settings.extract_window_tokens,
                           self.settings.extract_overlap_chunks)
            progress = {**progress, "windows": [[done + a, done + b] for a, b in plan], "windowsDone": 0}
        for start, end in progress["windows"][progress["windowsDone"]:]:
            part = chunks[start:end]
            try:
                text, owner = window_text([ch["content"] for ch in part])
                found = self.extractor.extract(text,
                                               {"ns": job["ns"], "documentId": job["document_id"],
                                                "window": [start, end]})
            except (ExtractionError, InputTooLarge) as e:
                raise FinalFailure(str(e), {**progress, "state": "failed", "failedChunk": part[0]["id"],
                                            "failedWindow": [start, end], "reason": str(e)}) from e
            # Overlapping windows see the turns at their edge twice: a fact this document already gave is not
            # added again (only this job writes the document's pending facts).
            known = {normalise(r["content"]) for r in self.db.rows(
                "SELECT content FROM memories WHERE document_id=? AND indexed=0", (job["document_id"],))}
            new = []
            for f in found:
                if normalise(f.content) not in known:
                    known.add(normalise(f.content))
                    new.append(f)
            vectors = self.embedder.embed([f.content for f in new]) if new else []
            t = now()
            with self.db.tx() as c:
                stages = self._mine(c, job)
                for f, v in zip(new, vectors, strict=True):
                    # The line the extractor says, else the window's chunk nearest to the fact.
                    at = owner[f.line] if f.line is not None and 0 <= f.line < len(owner) else \
                        nearest([ch["embedding"] for ch in part], v)
                    source = part[at]["id"]
                    c.execute("INSERT INTO memories(id, ns, content, content_key, valid_from, recorded_at, origin,"
                              " document_id, source_chunk_id, model, prompt_hash, embedding)"
                              " VALUES (?,?,?,?,?,?,'extracted',?,?,?,?,?)",
                              (new_id("mem"), job["ns"], f.content, content_key(f.content),
                               f.valid_at or (doc and doc["valid_at"]) or t, t,
                               job["document_id"], source, self.extractor.model, self.extractor.prompt_hash,
                               vec_blob(v)))
                progress = {**progress, "windowsDone": progress["windowsDone"] + 1, "chunksDone": end,
                            "facts": progress["facts"] + len(new)}
                stages["extract"] = progress
                c.execute("UPDATE jobs SET stages=?, updated_at=? WHERE id=?", (json.dumps(stages), t, job["id"]))
        with self.db.tx() as c:
            stages = self._mine(c, job)
            self._advance(c, job, stages, "extract", {"state": "done", "facts": progress["facts"],
                                                      "windows": len(progress["windows"]),
                                                      "model": self.extractor.model}, nxt="judge")

    def _decide(self, ns: str, m: dict) -> dict:
        try:
            return self.judge.decide(ns, m)
        except JudgeFailed as e:
            raise FinalFailure(str(e), e.result) from e

    def _stage_judge(self, job: dict) -> None:
        stages = json.loads(self.db.scalar("SELECT stages FROM jobs WHERE id=?", (job["id"],)))
        pending = self.db.rows("SELECT id, content, embedding, valid_from FROM memories WHERE document_id=?"
                               " AND indexed=0 ORDER BY rowid", (job["document_id"],))
        skipped = stages.get("extract", {}).get("state") == "skipped"
        # The LLM is asked outside the write transaction; the transaction checks the targets are still current.
        seen = facts.last_rowid(self.db)
        decisions = [] if skipped else [(m, self._decide(job["ns"], m)) for m in pending]
        with self.db.tx() as c:
            stages = self._mine(c, job)
            if skipped:
                result = {"state": "skipped", "reason": "nothing extracted"}
            else:
                n = dict.fromkeys(self.judge.decisions, 0)

                def current(target: str) -> str | None:
                    return self.db.scalar("SELECT m.valid_from FROM memories m WHERE m.id=? AND " + facts.CURRENT,
                                          (target,))
                # Decided outside the lock: a fact written since then may duplicate one called new.
                decisions = [(m, self.judge.recheck(job["ns"], m, d, seen)) for m, d in decisions]
                for m, kind, target in self.judge.settle(decisions, current):
                    if kind == "duplicate":
                        c.execute("DELETE FROM memories WHERE id=?", (m["id"],))
                        self.db.history(c, job["ns"], target, "duplicate", None, documentId=job["document_id"],
                                        contentHash=facts.content_hash(m["content"]))
                    elif kind in ("supersedes", "extends"):
                        c.execute("UPDATE memories SET %s=? WHERE id=?" % kind, (target, m["id"]))
                    n[kind] += 1
                result = {"state": "done", **n, **self.judge.record()}
            self._advance(c, job, stages, "judge", result, nxt="index", status="indexing")

    def _stage_index(self, job: dict) -> None:
        with self.db.tx() as c:
            stages = self._mine(c, job)
            # BM25 reads each chunk with its neighbours and the document's date; the vector is the chunk's own.
            doc = self.db.one("SELECT valid_at FROM documents WHERE id=?", (job["document_id"],))
            rows = self.db.rows("SELECT rowid, content, embedding, indexed FROM chunks WHERE document_id=?"
                                " ORDER BY seq", (job["document_id"],))
            texts = facts.chunk_index_texts(self.settings, [r["content"] for r in rows], doc and doc["valid_at"])
            for r, text in zip(rows, texts, strict=True):
                if r["indexed"]:
                    continue
                c.execute("INSERT INTO chunks_fts(rowid, content, ns) VALUES (?,?,?)", (r["rowid"], text, job["ns"]))
                vectors.insert(c, "chunk", r["rowid"], job["ns"], r["embedding"])
            c.execute("UPDATE chunks SET indexed=1 WHERE document_id=?", (job["document_id"],))
            for m in self.db.rows("SELECT rowid, id, content, embedding, valid_from, supersedes, extends"
                                  " FROM memories WHERE document_id=? AND indexed=0", (job["document_id"],)):
                facts.index_memory(c, job["ns"], m)
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
