"""What an owner trusts smem with (issue 27): workers that never stop silently, backups and restores
that search the same, export and import, and an erase that leaves no copy in the file or its WAL."""

from __future__ import annotations

import io
import os
import stat
import threading
import time

import pytest
from starlette.testclient import TestClient
from test_ingest import FakeExtractor

from conftest import Service
from smem import archive, auth
from smem.config import Settings
from smem.db import DB, vec_blob
from smem.embed import MiniLMEmbedder
from smem.facts import content_hash
from smem.ingest import Pipeline
from smem.service import build
from smem.vectors import bits as sign_bits
from smem.workers import Supervisor

PARAGRAPHS = ["Paragraph %d of the quarterly notes: the %s team shipped release %d and fixed %d bugs in the %s."
              % (i, team, 40 + i, 3 * i, part)
              for i, (team, part) in enumerate([("render", "scheduler"), ("memory", "indexer"), ("power", "governor"),
                                                ("image", "builder"), ("probe", "kernel")] * 8)]


def healthz(client, status: int):
    r = client.get("/healthz")
    return r if r.status_code == status else None


def wait_for(what, seconds: float = 60, every: float = 0.05):
    deadline = time.monotonic() + seconds
    while not (out := what()):
        assert time.monotonic() < deadline, "still not so after %d s" % seconds
        time.sleep(every)
    return out


# -- 1. workers that never die silently ----------------------------------------------------------
class DiskFull:
    """A full disk for the workers' connections only: SQLite's max_page_count held at the file's size
    (every write that needs a new page fails with SQLITE_FULL, as on a full disk); None lifts it."""

    def __init__(self, monkeypatch):
        self.pages: int | None = None
        real = DB.conn.fget

        def conn(db):
            c = real(db)
            if threading.current_thread().name.startswith("worker-"):
                c.execute("PRAGMA max_page_count=%d" % (self.pages or 1073741823))
            return c
        monkeypatch.setattr(DB, "conn", property(conn))


def test_a_full_disk_fails_healthz_and_the_job_finishes_once_it_clears(tmp_path, minilm, monkeypatch):
    full = DiskFull(monkeypatch)
    settings = Settings(workers=1, poll_interval_s=0.05, retry_backoff_s=0.05, db_retry_max_s=0.2)
    app, pipeline = build(str(tmp_path / "smem.db"), settings, embedder=minilm)
    token = auth.create(pipeline.db, ["alice"])
    h = {"Authorization": "Bearer " + token}
    full.pages = pipeline.db.scalar("PRAGMA page_count")
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        r = client.post("/v5/ns/alice/documents", headers=h, json={"content": "\n\n".join(PARAGRAPHS)})
        assert r.status_code == 202, r.text
        doc = r.json()["id"]
        sick = wait_for(lambda: healthz(client, 503))
        problems = " ".join(sick.json()["problems"])
        assert "worker-0: the database fails" in problems and "FullError" in problems, sick.json()
        assert client.get("/v5/ns/alice/documents/" + doc, headers=h).json()["status"] != "done"
        full.pages = None
        wait_for(lambda: client.get("/v5/ns/alice/documents/" + doc, headers=h).json()["status"] == "done")
        well = wait_for(lambda: healthz(client, 200))
        [worker] = well.json()["workers"]
        assert worker["alive"] and worker["databaseErrors"] == 0 and worker["restarts"] == 0
        found = client.post("/v5/ns/alice/search", headers=h, json={"q": "which team fixed the governor"}).json()
        assert any("governor" in x["content"] for x in found["results"])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # the death is the point
def test_a_worker_that_dies_anyway_is_restarted_and_its_job_runs(tmp_path, minilm, monkeypatch):
    settings = Settings(workers=1, poll_interval_s=0.05)
    app, pipeline = build(str(tmp_path / "smem.db"), settings, embedder=minilm)
    token = auth.create(pipeline.db, ["alice"])
    h = {"Authorization": "Bearer " + token}
    real, calls = pipeline.run_job, []

    def dies_once(job):
        calls.append(job["id"])
        if len(calls) == 1:
            raise SystemExit("a worker's thread ends, whatever the reason")
        real(job)
    monkeypatch.setattr(pipeline, "run_job", dies_once)
    with TestClient(app) as client:
        doc = client.post("/v5/ns/alice/documents", headers=h, json={"content": "Restarted workers finish."}).json()
        wait_for(lambda: client.get("/v5/ns/alice/documents/" + doc["id"], headers=h).json()["status"] == "done")
        [worker] = client.get("/healthz").json()["workers"]
        assert worker["restarts"] == 1 and worker["alive"]
    assert len(calls) == 2


def test_a_queue_stuck_past_the_bound_fails_healthz(make_service):
    svc = make_service()
    sup = Supervisor(svc.pipeline, 1)        # never started: nothing takes the job
    svc.call("POST", "/v5/ns/alice/documents", json={"content": "Nobody runs me."})
    time.sleep(0.7)
    health = sup.health(0.5)
    assert not health["ok"] and any(p.startswith("stuck:") for p in health["problems"]), health
    assert health["queue"]["oldestDueAgeS"] >= 0.5
    assert sup.health(60)["problems"] == ["worker-0 is dead"]     # within the bound: only the dead worker


# -- 2. backup, restore, export, import -----------------------------------------------------------
QUERIES = ["which team shipped release 45", "bugs in the indexer", "power governor", "image builder release"]


def results(svc: Service, ns: str = "alice") -> list[list[tuple[str, str]]]:
    return [[(r["kind"], r["content"]) for r in svc.search(ns, q, limit=5)["results"]] for q in QUERIES]


def test_a_backup_taken_while_ingesting_restores_and_searches_the_same(tmp_path, minilm):
    src = Service(tmp_path / "src.db", Settings(), minilm)
    for p in PARAGRAPHS[:6]:
        src.ingest("alice", p)
    src.remember("alice", "The render team's lead is Ines.")
    stop, taken = threading.Event(), {}

    def ingest_more():
        for i, p in enumerate(PARAGRAPHS[6:]):
            src.pipeline.enqueue("alice", p + " (late)", {}, None, None)
            src.pipeline.run_until_idle()
            if i == 4:
                taken["mid"] = True
        stop.set()
    t = threading.Thread(target=ingest_more)
    t.start()
    wait_for(lambda: taken.get("mid"))
    out = archive.backup(str(src.path), to=str(tmp_path / "copy.db"))   # the source is being written
    t.join()
    assert stat.S_IMODE(os.stat(out["path"]).st_mode) == 0o600
    assert archive.check_backup(out["path"]) == src.db.version
    restored = tmp_path / "restored.db"
    archive.restore(out["path"], str(restored))
    dst = Service(restored, Settings(), minilm)
    dst.pipeline.requeue_orphans()           # a job the copy caught mid-stage runs again from its stage
    dst.pipeline.run_until_idle()
    missing = src.db.scalar("SELECT count(*) FROM documents") - dst.db.scalar("SELECT count(*) FROM documents")
    assert 0 < missing < len(PARAGRAPHS) - 6, "the copy is a snapshot taken mid-ingest"
    for d in src.db.rows("SELECT id, content FROM documents ORDER BY created_at"):
        if not dst.db.one("SELECT 1 FROM documents WHERE id=?", (d["id"],)):
            dst.pipeline.enqueue("alice", d["content"], {}, None, None)   # what came after the copy, again
    dst.pipeline.run_until_idle()
    assert dst.db.scalar("SELECT count(*) FROM documents WHERE status='done'") == \
        src.db.scalar("SELECT count(*) FROM documents WHERE status='done'")
    assert results(dst) == results(src)


def test_restore_refuses_to_overwrite_and_refuses_a_bad_file(tmp_path, svc):
    svc.ingest("alice", PARAGRAPHS[0])
    copy = archive.backup(str(svc.path), to=str(tmp_path / "b.db"))["path"]
    with pytest.raises(archive.ArchiveError, match="exists"):
        archive.restore(copy, str(svc.path))
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"SQLite format 3\x00" + b"\x00" * 500)
    with pytest.raises(archive.ArchiveError):
        archive.restore(str(junk), str(tmp_path / "new.db"))
    assert not (tmp_path / "new.db").exists()


def test_backup_dir_keeps_the_newest(tmp_path, svc):
    made = []
    for _ in range(3):
        made.append(archive.backup(str(svc.path), directory=str(tmp_path / "b"), keep=2))
        time.sleep(1.05)    # the names are to the second
    left = sorted(p.name for p in (tmp_path / "b").iterdir())
    assert left == sorted(os.path.basename(m["path"]) for m in made[1:])
    assert made[2]["removed"] == [made[0]["path"]]


def test_export_and_import_round_trip_with_history_and_tombstones(tmp_path, svc, minilm):
    for p in PARAGRAPHS[:4]:
        svc.ingest("alice", p)
    first = svc.remember("alice", "Ines leads the render team.")
    svc.remember("alice", "Ines now leads the memory team.", supersedes=first["id"])
    gone = svc.remember("alice", "The staging password is hunter2-ALPACA.")
    r = svc.call("POST", "/v5/ns/alice/forget", json={"id": gone["id"], "erase": True})
    assert r.status_code == 200, r.text
    buf = io.StringIO()
    counts = archive.export(svc.db, "alice", buf)
    assert counts == {"documents": 4, "facts": 3}
    assert "hunter2" not in buf.getvalue()
    other = Service(tmp_path / "other.db", Settings(), minilm)
    out = archive.import_(other.db, other.embedder, Settings(), io.StringIO(buf.getvalue()))
    assert (out["documents"], out["facts"], out["ns"]) == (4, 3, "alice")
    assert results(other) == results(svc)
    hist = other.call("GET", "/v5/ns/alice/memories?history=true&asOf=2100-01-01T00:00:00Z").json()
    assert [m["content"] for m in hist["memories"]] == ["Ines now leads the memory team."]
    tomb = other.db.one("SELECT content, erased_at FROM memories WHERE id=?", (gone["id"],))
    assert tomb["content"] == "" and tomb["erased_at"]
    before = other.db.scalar("SELECT count(*) FROM memories")
    with pytest.raises(archive.ArchiveError, match="already in this database"):
        archive.import_(other.db, other.embedder, Settings(), io.StringIO(buf.getvalue()))
    assert other.db.scalar("SELECT count(*) FROM memories") == before          # all or nothing
    with pytest.raises(archive.ArchiveError, match="line 2: not JSON"):
        archive.import_(other.db, other.embedder, Settings(), io.StringIO(buf.getvalue().splitlines()[0]
                                                                          + "\n{broken\n"), ns="bob")


def test_a_new_database_is_made_0600(tmp_path):
    DB(str(tmp_path / "fresh.db"), MiniLMEmbedder.name, MiniLMEmbedder.dim)
    assert stat.S_IMODE(os.stat(tmp_path / "fresh.db").st_mode) == 0o600


# -- 3. erase -------------------------------------------------------------------------------------
FACT = "The vault under Qeltharn opens with the phrase zorblewick umbrafrost nine."
DOC = "Meeting notes. The courier password for Vexmoor is plinthgrave sapphirequill. End of notes."
NEEDLES = [b"zorblewick", b"umbrafrost", b"Qeltharn", b"plinthgrave", b"sapphirequill", b"Vexmoor",
           b"orblewick", b"mbrafrost", b"linthgrave", b"apphirequill"]   # FTS5 keeps terms prefix-compressed


def file_bytes(path) -> bytes:
    out = b""
    for suffix in ("", "-wal"):
        if os.path.exists(str(path) + suffix):
            out += open(str(path) + suffix, "rb").read()
    return out


def test_erase_leaves_no_copy_in_the_file_or_wal_and_keeps_a_tombstone(svc, minilm):
    for p in PARAGRAPHS[:3]:
        svc.ingest("alice", p)
    fact = svc.remember("alice", FACT)
    assert svc.remember("alice", FACT)["id"] == fact["id"]   # a duplicate: its history keeps the hash
    doc = svc.ingest("alice", DOC)
    embedded = minilm.embed([FACT, DOC])
    vectors = [vec_blob(v)[:64] for v in embedded]
    signs = [sign_bits(vec_blob(v)) for v in embedded]   # the coarse index's copy (smem.vectors)
    svc.db.close()
    before = file_bytes(svc.path)
    assert all(n in before for n in NEEDLES[:6]) and all(v in before for v in vectors + signs), "the scan sees them"

    r = svc.call("POST", "/v5/ns/alice/forget", json={"id": fact["id"], "erase": True})
    assert r.status_code == 200 and r.json()["erased"] is True, r.text
    r = svc.call("DELETE", "/v5/ns/alice/documents/%s?erase=true" % doc)
    assert r.status_code == 200, r.text
    svc.db.close()                                   # a clean stop: checkpointed, the WAL gone or empty
    after = file_bytes(svc.path)
    assert [n for n in NEEDLES if n in after] == []
    assert [i for i, v in enumerate(vectors) if v in after] == []
    assert [i for i, v in enumerate(signs) if v in after] == []
    events = svc.db.rows("SELECT event, detail FROM history WHERE memory_id=? ORDER BY id", (fact["id"],))
    assert [e["event"] for e in events][-1] == "erased"
    assert content_hash(FACT) in events[-1]["detail"]
    assert all("Qeltharn" not in x["content"] for x in svc.search("alice", "vault phrase Qeltharn")["results"])
    assert svc.call("GET", "/v5/ns/alice/documents/" + doc).status_code == 404


def test_forget_without_erase_keeps_the_content_for_the_history(svc):
    fact = svc.remember("alice", FACT)
    svc.call("POST", "/v5/ns/alice/forget", json={"id": fact["id"]})
    svc.db.close()
    assert b"zorblewick" in file_bytes(svc.path)
    assert all("zorblewick" not in x["content"] for x in svc.search("alice", "zorblewick umbrafrost")["results"])


def test_deleting_a_document_retires_its_facts_and_a_replace_supersedes_them(svc):
    extracting = Pipeline(svc.db, svc.embedder, svc.pipeline.settings, extractor=FakeExtractor())

    def post(content: str) -> str:
        r = svc.call("POST", "/v5/ns/alice/documents", json={"content": content, "customId": "plan"})
        assert r.status_code == 202, r.text
        extracting.run_until_idle()
        return r.json()["id"]

    def current() -> list[str]:
        return [m["content"] for m in svc.call("GET", "/v5/ns/alice/memories").json()["memories"]]
    doc = post("Ann plans to visit Bergen. Rain.")
    assert current() == ["Ann plans to visit Bergen."]
    assert post("Ann plans to visit Tromso. Snow.") == doc          # the same document, replaced
    assert current() == ["Ann plans to visit Tromso."]              # the old version's fact superseded
    old = svc.db.one("SELECT id FROM memories WHERE content='Ann plans to visit Bergen.'")["id"]
    assert "superseded" in [e["event"] for e in svc.db.rows("SELECT event FROM history WHERE memory_id=?", (old,))]
    assert all("Bergen" not in r["content"] for r in svc.search("alice", "Bergen", mode="memories")["results"])
    r = svc.call("DELETE", "/v5/ns/alice/documents/" + doc)
    assert r.status_code == 200 and r.json()["factsRetired"] >= 1, r.text
    assert current() == []
    assert all("Tromso" not in r["content"] for r in svc.search("alice", "Tromso", mode="memories")["results"])
