"""Erase tells the truth: while a reader of an older snapshot keeps the WAL, the answer is "pending" with
why, and the erased text is found in the WAL; smem vacuum finishes it. Backups older than an erase are
pruned by `smem backup prune --erased`."""

from __future__ import annotations

import os
from pathlib import Path

import apsw

from smem import archive, cli

SECRET = "Ann's locker code is Vorquendil-4471"


def file_bytes(path: Path) -> bytes:
    return b"".join(Path(str(path) + s).read_bytes() for s in ("", "-wal") if os.path.exists(str(path) + s))


def test_erase_under_an_old_reader_says_pending_and_vacuum_finishes_it(make_service):
    svc = make_service(erase_checkpoint_tries=2, erase_checkpoint_wait_s=0)
    fact = svc.remember("alice", SECRET)
    reader = apsw.Connection(str(svc.path))
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM memories").fetchone()[0] == 1   # holds this snapshot
    try:
        r = svc.call("POST", "/v5/ns/alice/forget", json={"id": fact["id"], "erase": True})
        body = r.json()
        assert r.status_code == 200 and body["erased"] == "pending", body
        assert "reader of an older snapshot" in body["erasePending"]
        assert b"Vorquendil" in file_bytes(svc.path)   # what "pending" means: a copy is still there
    finally:
        reader.execute("COMMIT")
        reader.close()
    out = archive.vacuum(svc.db, wait_s=5)
    assert out["walCheckpointed"] is True
    assert b"Vorquendil" not in file_bytes(svc.path)


def test_erase_with_no_reader_is_done_at_once(make_service):
    svc = make_service(erase_checkpoint_tries=1, erase_checkpoint_wait_s=0)
    fact = svc.remember("alice", SECRET)
    body = svc.call("POST", "/v5/ns/alice/forget", json={"id": fact["id"], "erase": True}).json()
    assert body["erased"] is True and "erasePending" not in body


def test_backup_prune_erased_removes_the_backups_taken_before_the_last_erase(svc, tmp_path, capsys):
    fact = svc.remember("alice", SECRET)
    backups = tmp_path / "backups"
    backups.mkdir()
    old = backups / "smem-20200101T000000Z.db"            # a backup from before the erase
    archive.backup(str(svc.path), to=str(old))
    assert cli.main(["backup", "prune", "--erased", "--dir", str(backups), "--db", str(svc.path)]) == 0
    assert old.exists()                                    # no erase yet: nothing to prune
    svc.call("POST", "/v5/ns/alice/forget", json={"id": fact["id"], "erase": True})
    newer = backups / "smem-29990101T000000Z.db"          # one named after the erase is kept
    archive.backup(str(svc.path), to=str(newer))
    capsys.readouterr()
    assert cli.main(["backup", "prune", "--erased", "--dir", str(backups), "--db", str(svc.path), "--dry-run"]) == 0
    assert old.exists() and str(old) in capsys.readouterr().out
    assert cli.main(["backup", "prune", "--erased", "--dir", str(backups), "--db", str(svc.path)]) == 0
    assert not old.exists() and newer.exists()


def test_vacuum_shrinks_the_file_after_deletes(svc, tmp_path, capsys):
    # Documents that are never ingested (no embedding): their text alone fills pages the deletes free.
    for i in range(40):
        svc.call("POST", "/v5/ns/alice/documents", json={"content": ("Paragraph %d. " % i) + "text " * 4000})
    for d in svc.call("GET", "/v5/ns/alice/documents?limit=100").json()["documents"]:
        svc.call("DELETE", "/v5/ns/alice/documents/" + d["id"])
    svc.db.close()
    before = os.path.getsize(svc.path)
    assert cli.main(["vacuum", "--db", str(svc.path)]) == 0
    assert os.path.getsize(svc.path) < before / 2, (before, os.path.getsize(svc.path))
