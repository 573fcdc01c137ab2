"""Export and backup never hold the write lock, and a duplicate POST stores no second copy of its text.

A writer here has no busy timeout: if anything held the write lock it would fail at once (BusyError),
so the tests do not depend on how long anything takes."""

from __future__ import annotations

import io
import json
import threading

from smem import archive, memories


def write_now(svc, ns: str, content: str) -> dict:
    """A fact added from another thread (its own connection) that may not wait for the write lock."""
    out: dict = {}

    def run():
        try:
            svc.db.conn.set_busy_timeout(0)
            out["fact"] = memories.add(svc.db, svc.embedder, 0.97, ns, content, valid_at=None, supersedes=None)
        except Exception as e:
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out


class WritesDuring(io.StringIO):
    """An export's output that, at its third line, has another connection write a fact."""

    def __init__(self, svc):
        super().__init__()
        self.svc, self.lines, self.writer = svc, 0, None

    def write(self, s: str) -> int:
        self.lines += 1
        if self.lines == 3:
            self.writer = write_now(self.svc, "alice", "Written while the export ran")
        return super().write(s)


def test_a_writer_goes_on_while_an_export_runs_and_the_export_is_one_snapshot(svc):
    for text in ("Ann keeps bees", "Bob sails on Sundays", "The office moved to Porto", "Carol plays the cello"):
        svc.remember("alice", text)
    out = WritesDuring(svc)
    counts = archive.export(svc.db, "alice", out)
    assert "fact" in out.writer, out.writer.get("error")
    facts = [json.loads(line) for line in out.getvalue().splitlines()[1:]]
    assert counts["facts"] == 4
    assert "Written while the export ran" not in {f["content"] for f in facts}


def test_export_and_backup_run_while_another_connection_holds_the_write_lock(svc, tmp_path):
    svc.remember("alice", "Ann keeps bees")
    held = threading.Event()
    release = threading.Event()

    def hold():
        with svc.db.tx():
            held.set()
            release.wait()
    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    try:
        svc.db.conn.set_busy_timeout(0)   # this thread's reads may not wait for the writer either
        out = io.StringIO()
        assert archive.export(svc.db, "alice", out)["facts"] == 1
        copy = archive.backup(str(svc.path), to=str(tmp_path / "copy.db"))
        assert copy["bytes"] > 0
    finally:
        release.set()
        t.join()
    assert archive.check_backup(str(tmp_path / "copy.db")) >= 1


def test_a_repeated_duplicate_stores_a_reference_not_its_text(svc):
    big = "Ann's notes: " + "lorem ipsum dolor " * 2000
    first = svc.remember("alice", big)
    for _ in range(3):
        again = svc.remember("alice", big.upper())
        assert again["duplicate"] is True and again["id"] == first["id"]
    details = svc.db.rows("SELECT detail FROM history WHERE memory_id=? AND event='duplicate'", (first["id"],))
    assert len(details) == 3
    assert all(len(d["detail"]) < 200 and "contentHash" in json.loads(d["detail"]) for d in details)
