"""The ingest queue: stages, statuses, skipped extraction, resuming, bounded retries, the judge."""

from __future__ import annotations

import json

from smem.extract import Fact
from smem.ingest import Pipeline

LONG = "\n\n".join("Paragraph %d tells of the lighthouse keeper's day number %d and the gulls. " % (i, i) * 8
                   for i in range(6))


def counts(db, doc_id):
    return {
        "chunks": db.scalar("SELECT count(*) FROM chunks WHERE document_id=?", (doc_id,)),
        "distinct_seq": db.scalar("SELECT count(DISTINCT seq) FROM chunks WHERE document_id=?", (doc_id,)),
        "fts": db.scalar("SELECT count(*) FROM chunks_fts WHERE rowid IN (SELECT rowid FROM chunks"
                         " WHERE document_id=?)", (doc_id,)),
        "vec": db.scalar("SELECT count(*) FROM vec_chunks WHERE rowid IN (SELECT rowid FROM chunks"
                         " WHERE document_id=?)", (doc_id,)),
    }


def test_document_walks_the_stages_to_done_with_extract_skipped(svc):
    r = svc.call("POST", "/v5/ns/alice/documents", json={"content": LONG})
    assert r.status_code == 202 and r.json()["status"] == "queued"
    doc = r.json()["id"]
    assert svc.call("GET", "/v5/ns/alice/documents/" + doc).json()["status"] == "queued"
    svc.pipeline.run_until_idle()
    d = svc.call("GET", "/v5/ns/alice/documents/" + doc).json()
    assert d["status"] == "done" and d["error"] is None
    stages = d["job"]["stages"]
    assert stages["extract"] == {"state": "skipped", "reason": "no LLM configured"}
    assert [k for k in stages if k != "errors"] == ["chunk", "embed", "extract", "judge", "index"]
    c = counts(svc.db, doc)
    assert c["chunks"] > 1 and c["chunks"] == c["distinct_seq"] == c["fts"] == c["vec"] == d["chunks"]


def test_statuses_move_queued_extracting_indexing_done(svc):
    seen = []
    real = svc.pipeline._advance

    def spy(c, job, stages, name, result, *, nxt, status=None):
        real(c, job, stages, name, result, nxt=nxt, status=status)
        seen.append(svc.db.scalar("SELECT status FROM documents WHERE id=?", (job["document_id"],)))
    svc.pipeline._advance = spy
    svc.ingest("alice", "A short note about tea.")
    assert [s for i, s in enumerate(seen) if i == 0 or s != seen[i - 1]] == ["extracting", "indexing", "done"]


def test_a_job_cut_off_mid_embed_resumes_without_duplicates(svc):
    doc = svc.call("POST", "/v5/ns/alice/documents", json={"content": LONG}).json()["id"]
    svc.pipeline.settings.embed_batch = 1
    job = svc.pipeline.claim("w")
    svc.pipeline._stage_chunk(job)
    calls = {"n": 0}
    real = svc.embedder.inner.embed

    def dies_on_third(texts):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # as abrupt as a kill: nothing after this runs in the process
        return real(texts)
    svc.embedder.inner.embed = dies_on_third
    try:
        svc.pipeline._stage_embed(job)
    except KeyboardInterrupt:
        pass
    finally:
        svc.embedder.inner.embed = real
    assert svc.db.scalar("SELECT count(*) FROM chunks WHERE document_id=? AND embedding IS NOT NULL", (doc,)) == 2
    # A new process: the job is still 'running' under the dead owner.
    assert svc.pipeline.requeue_orphans() == 1
    assert svc.pipeline.run_until_idle() == 1
    c = counts(svc.db, doc)
    assert c["chunks"] == c["distinct_seq"] == c["fts"] == c["vec"] > 2
    assert svc.db.scalar("SELECT status FROM documents WHERE id=?", (doc,)) == "done"


def test_failing_embedder_fails_the_document_with_its_reason_after_bounded_retries(make_service):
    svc = make_service(retry_backoff_s=0, job_max_attempts=3)
    svc.embedder.down = True
    doc = svc.call("POST", "/v5/ns/alice/documents", json={"content": "Some text."}).json()["id"]
    assert svc.pipeline.run_until_idle() == 3
    d = svc.call("GET", "/v5/ns/alice/documents/" + doc).json()
    assert d["status"] == "failed"
    assert d["error"] == "embed: switched off by the test"
    assert len(d["job"]["stages"]["errors"]) == 3


class FakeExtractor:
    """Stands in for the json_schema chat client: one fact per sentence that names a person."""

    model = "fake-extractor"
    prompt_hash = "sha256:test"

    def extract(self, chunk, context):
        return [Fact(s.strip() + ".") for s in chunk.split(".") if "Ann" in s]


def test_extraction_path_records_model_prompt_and_source_and_judges_duplicates(svc):
    p = Pipeline(svc.db, svc.embedder, svc.pipeline.settings, extractor=FakeExtractor())
    svc.remember("alice", "Ann lives in Oslo.")
    svc.call("POST", "/v5/ns/alice/documents", json={"content": "Ann lives in Oslo. Ann plays the cello. Rain."})
    p.run_until_idle()
    mems = svc.db.rows("SELECT * FROM memories WHERE ns='alice' AND origin='extracted'")
    assert [m["content"] for m in mems] == ["Ann plays the cello."]   # the Oslo fact was a duplicate
    m = mems[0]
    assert (m["model"], m["prompt_hash"], m["indexed"]) == ("fake-extractor", "sha256:test", 1)
    assert svc.db.scalar("SELECT document_id FROM chunks WHERE id=?", (m["source_chunk_id"],)) == m["document_id"]
    stages = json.loads(svc.db.scalar("SELECT stages FROM jobs WHERE document_id=?", (m["document_id"],)))
    assert stages["judge"] == {"state": "done", "new": 1, "duplicate": 1}
    hits = svc.search("alice", "what instrument does Ann play", mode="memories")["results"]
    assert hits[0]["content"] == "Ann plays the cello."


def test_custom_id_replaces_the_document(svc):
    first = svc.ingest("alice", "The old version mentions zeppelins.", customId="page-1")
    second = svc.ingest("alice", "The new version mentions submarines.", customId="page-1")
    assert first == second
    assert svc.db.scalar("SELECT count(*) FROM documents") == 1
    assert all("zeppelins" not in r["content"] for r in svc.search("alice", "zeppelins", mode="chunks")["results"])
    assert "submarines" in svc.search("alice", "submarines", mode="chunks")["results"][0]["content"]
