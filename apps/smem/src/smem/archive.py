"""Copies of the memory: backup and restore (the whole file, SQLite's online backup), export and import
(one namespace as JSON Lines: documents with their chunks, facts with their history)."""

from __future__ import annotations

import json
import os
import pwd
import re
from datetime import UTC, datetime
from pathlib import Path

import apsw

from smem import db as dbm
from smem import facts, vectors
from smem.db import DB, now, vec_blob
from smem.text import estimate_tokens

BACKUP_NAME = re.compile(r"^smem-\d{8}T\d{6}Z\.db$")
EXPORT_VERSION = 1


class ArchiveError(RuntimeError):
    """A backup, restore, export or import that cannot be done: nothing was changed."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(src: apsw.Connection, dest_path: Path) -> None:
    """src's database into a new file at dest_path (0600), checked, fsynced; rollback journal mode there,
    so that the copy is one self-contained file."""
    tmp = dest_path.with_name(dest_path.name + ".part")
    tmp.unlink(missing_ok=True)
    os.close(os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    try:
        dest = apsw.Connection(str(tmp))
        try:
            # One step copies every page under one read transaction: a consistent snapshot, and in WAL
            # mode the server's writers go on meanwhile.
            with dest.backup("main", src, "main") as b:
                b.step(-1)
            dest.execute("PRAGMA journal_mode=DELETE")
            problems = [r[0] for r in dest.execute("PRAGMA quick_check")]
            if problems != ["ok"]:
                raise ArchiveError("the copy failed its check: %s" % "; ".join(problems[:5]))
        finally:
            dest.close()
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dest_path)
        _fsync_dir(dest_path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def backup(db_path: str, to: str | None = None, directory: str | None = None, keep: int | None = None) -> dict:
    """A consistent copy of a live database, to a file or (directory) to smem-<UTC time>.db there,
    keeping the newest `keep` of those. {path, bytes, removed}."""
    if not os.path.exists(db_path):
        raise ArchiveError("no database at %s" % db_path)
    if (to is None) == (directory is None):
        raise ArchiveError("give exactly one of --to FILE and --dir DIR")
    if directory is not None:
        d = Path(directory)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        dest = d / datetime.now(UTC).strftime("smem-%Y%m%dT%H%M%SZ.db")
    else:
        dest = Path(to)
        if dest.exists() and dest.is_dir():
            raise ArchiveError("%s is a directory: give a file, or --dir" % dest)
    src = apsw.Connection(db_path, flags=apsw.SQLITE_OPEN_READONLY)
    src.set_busy_timeout(30_000)
    try:
        _copy(src, dest)
    finally:
        src.close()
    removed = []
    if directory is not None and keep:
        old = sorted(p for p in Path(directory).iterdir() if BACKUP_NAME.match(p.name))
        for p in old[:-keep]:
            p.unlink()
            removed.append(str(p))
    return {"path": str(dest), "bytes": dest.stat().st_size, "removed": removed}


def backup_time(path: Path) -> str | None:
    """When a backup of --dir was taken (its name), as db.now() writes times; None for another file."""
    if not BACKUP_NAME.match(path.name):
        return None
    return datetime.strptime(path.name, "smem-%Y%m%dT%H%M%SZ.db").replace(tzinfo=UTC).strftime(dbm.TIME_FMT)


def prune_erased(db_path: str, directory: str, dry_run: bool = False) -> dict:
    """The backups in directory taken before the database's last erase (or document delete): they still
    hold what was erased. Removed (dry_run: only listed). {lastErase, removed, kept}."""
    if not os.path.exists(db_path):
        raise ArchiveError("no database at %s" % db_path)
    c = apsw.Connection(db_path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        c.set_busy_timeout(30_000)
        row = c.execute("SELECT value FROM meta WHERE key='last_erase_at'").fetchone()
    except apsw.SQLError:
        row = None
    finally:
        c.close()
    last = row[0] if row else None
    removed, kept = [], []
    for p in sorted(Path(directory).iterdir()):
        taken = backup_time(p)
        if taken is None:
            continue
        # A backup of the same second as the erase may be either side of it: it goes too.
        if last is not None and taken[:19] <= last[:19]:
            if not dry_run:
                p.unlink()
            removed.append(str(p))
        else:
            kept.append(str(p))
    return {"lastErase": last, "removed": removed, "kept": kept, "dryRun": dry_run}


def vacuum(db: DB, wait_s: float = 30.0) -> dict:
    """The file rewritten without its free pages (it shrinks after deletes and erases), the planner's
    statistics refreshed, the WAL checkpointed and truncated. Writers wait while VACUUM runs."""
    before = os.path.getsize(db.path)
    first = db.checkpoint(wait_s=wait_s)
    db.conn.execute("VACUUM")
    db.conn.execute("PRAGMA analysis_limit=1000")
    db.conn.execute("PRAGMA optimize=0x10002")
    busy, _, _ = db.checkpoint(wait_s=wait_s)
    return {"path": db.path, "bytesBefore": before, "bytesAfter": os.path.getsize(db.path),
            "walCheckpointed": not busy, "walBusyBefore": bool(first[0])}


def check_backup(path: str) -> int:
    """The backup's schema version, after SQLite's check; ArchiveError if it is not a good smem file."""
    try:
        c = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    except apsw.Error as e:
        raise ArchiveError("%s: cannot open it: %s" % (path, e)) from None
    try:
        problems = [r[0] for r in c.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise ArchiveError("%s: failed SQLite's check: %s" % (path, "; ".join(problems[:5])))
        version = dbm.schema_version(c)
    except apsw.Error as e:
        raise ArchiveError("%s: not an SQLite database (%s)" % (path, e)) from None
    finally:
        c.close()
    if version < 1:
        raise ArchiveError("%s: not an smem database (no schema)" % path)
    if version > dbm.VERSION:
        raise ArchiveError("%s: schema version %d; this smem knows up to %d" % (path, version, dbm.VERSION))
    return version


def check_owner(db_path: str) -> tuple[int, int]:
    """(uid, gid) the restored file must have: the existing database's, else its directory's (the service
    user's). Root restores and hands the file over; another user who is not that owner is refused."""
    dest = Path(db_path)
    st = (dest if dest.exists() else dest.parent).stat()
    me = os.geteuid()
    if me not in (0, st.st_uid):
        raise ArchiveError("%s belongs to %s: restore as that user (sudo -u %s smem restore ...), not as %s"
                           % (dest if dest.exists() else dest.parent, _user(st.st_uid), _user(st.st_uid), _user(me)))
    return st.st_uid, st.st_gid


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "uid %d" % uid


def restore(backup_path: str, db_path: str, force: bool = False) -> dict:
    """The backup as the database at db_path (the server must be stopped: the caller holds its lock).
    An existing database is replaced only with force; its -wal and -shm go with it."""
    if not os.path.isfile(backup_path):
        raise ArchiveError("no backup at %s" % backup_path)
    version = check_backup(backup_path)
    dest = Path(db_path)
    if dest.exists() and not force:
        raise ArchiveError("%s exists: --force replaces it (take a backup of it first)" % db_path)
    uid, gid = check_owner(db_path)
    src = apsw.Connection(backup_path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        staged = dest.with_name(dest.name + ".restore")
        _copy(src, staged)
    finally:
        src.close()
    _new_vectors_epoch(staged)
    if os.geteuid() == 0:   # the service opens it as its user: the file and its lock files are that user's
        for p in (staged, Path(db_path + ".lock"), Path(db_path + ".users")):
            if p.exists():
                os.chown(p, uid, gid)
    for suffix in ("-wal", "-shm"):
        Path(db_path + suffix).unlink(missing_ok=True)
    os.replace(staged, dest)
    _fsync_dir(dest.parent)
    return {"path": db_path, "schema": version, "bytes": dest.stat().st_size}


def _new_vectors_epoch(path: Path) -> None:
    """A process that held the replaced file's bit vectors in memory (smem.bit_cache) reads them again."""
    c = apsw.Connection(str(path))
    try:
        if c.execute("SELECT 1 FROM sqlite_master WHERE name = 'vector_log'").fetchall():
            vectors.new_epoch(c)
    finally:
        c.close()


# -- export and import ----------------------------------------------------------------------------
# A statement that reads a whole namespace says so with this mark: the query-plan test lets only these
# walk a namespace's rows, and export runs them inside a read transaction, never under the write lock.
NAMESPACE_WALK = "/* namespace walk */ "


def export(db: DB, ns: str, out) -> dict:
    """One namespace as JSON Lines on `out` (text): a header, then each document (with its chunks'
    text), then each fact with its history. Erased facts go as the tombstones they are. Read from one
    snapshot (a read transaction): writers go on meanwhile, and a row at a time is in memory."""
    counts = {"documents": 0, "facts": 0}
    with db.snapshot():
        meta = dict(db.conn.execute("SELECT key, value FROM meta").fetchall())
        out.write(json.dumps({"kind": "smem-export", "version": EXPORT_VERSION, "ns": ns, "schema": db.version,
                              "embedder": meta.get("embedder"), "exportedAt": now()}) + "\n")
        for d in db.iter(NAMESPACE_WALK + "SELECT * FROM documents WHERE ns=? ORDER BY created_at, id", (ns,)):
            chunks = db.rows("SELECT id, seq, content FROM chunks WHERE document_id=? ORDER BY seq", (d["id"],))
            out.write(json.dumps({"kind": "document", "id": d["id"], "customId": d["custom_id"],
                                  "content": d["content"], "metadata": json.loads(d["metadata"]),
                                  "validAt": d["valid_at"], "status": d["status"], "error": d["error"],
                                  "createdAt": d["created_at"], "updatedAt": d["updated_at"],
                                  "chunks": chunks if d["status"] == "done" else []}) + "\n")
            counts["documents"] += 1
        for m in db.iter(NAMESPACE_WALK + "SELECT * FROM memories WHERE ns=? AND indexed=1"
                         " ORDER BY valid_from, rowid", (ns,)):
            history = db.rows("SELECT event, other_id, at, detail FROM history WHERE ns=? AND memory_id=?"
                              " ORDER BY id", (ns, m["id"]))
            out.write(json.dumps({"kind": "fact", **{k: m[k] for k in FACT_FIELDS},
                                  "metadata": json.loads(m["metadata"]),
                                  "history": [{**h, "detail": json.loads(h["detail"])} for h in history]}) + "\n")
            counts["facts"] += 1
    return counts


FACT_FIELDS = ("id", "content", "valid_from", "valid_to", "recorded_at", "expired_at", "supersedes", "extends",
               "forgotten_at", "erased_at", "origin", "document_id", "source_chunk_id", "model", "prompt_hash")
_DOC_REQUIRED = ("id", "content", "status", "createdAt", "updatedAt", "chunks")


def _read(lines) -> tuple[dict, list[dict], list[dict]]:
    header, docs, fact_rows = None, [], []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as e:
            raise ArchiveError("line %d: not JSON (%s)" % (n, e)) from None
        kind = item.get("kind") if isinstance(item, dict) else None
        if header is None:
            if kind != "smem-export" or item.get("version") != EXPORT_VERSION:
                raise ArchiveError("line %d: not an smem export (version %d) header" % (n, EXPORT_VERSION))
            header = item
            continue
        if kind == "document":
            missing = [k for k in _DOC_REQUIRED if k not in item]
        elif kind == "fact":
            missing = [k for k in (*FACT_FIELDS, "history") if k not in item]
        else:
            raise ArchiveError("line %d: unknown kind %r" % (n, kind))
        if missing:
            raise ArchiveError("line %d: %s without %s" % (n, kind, ", ".join(missing)))
        (docs if kind == "document" else fact_rows).append(item)
    if header is None:
        raise ArchiveError("empty input: no smem export header")
    return header, docs, fact_rows


def import_(db: DB, embedder, settings, lines, *, ns: str | None = None, batch: int = 32) -> dict:
    """An export into db, as namespace `ns` (default: the export's). Every id must be new here; the
    vectors are made again by this database's embedder. Done documents come back indexed; any other
    is queued to be ingested again. All or nothing."""
    header, docs, fact_rows = _read(lines)
    ns = ns or header["ns"]
    ids = [d["id"] for d in docs] + [c["id"] for d in docs for c in d["chunks"]] + [m["id"] for m in fact_rows]
    taken = [i for i in ids if db.scalar("SELECT 1 FROM documents WHERE id=? UNION ALL SELECT 1 FROM chunks"
                                         " WHERE id=? UNION ALL SELECT 1 FROM memories WHERE id=?", (i, i, i))]
    if taken:
        raise ArchiveError("%d id(s) already in this database (e.g. %s): import into another file or namespace"
                           " after deleting them" % (len(taken), taken[0]))
    customs = [d["customId"] for d in docs if d.get("customId")]
    clash = [c for c in customs if db.scalar("SELECT 1 FROM documents WHERE ns=? AND custom_id=?", (ns, c))]
    if clash:
        raise ArchiveError("customId %s is already in namespace %s" % (clash[0], ns))

    def embeddings(texts: list[str]) -> list[bytes]:
        out = []
        for i in range(0, len(texts), batch):
            out += [vec_blob(v) for v in embedder.embed(texts[i:i + batch])]
        return out
    done = [d for d in docs if d["status"] == "done"]
    chunk_vecs = iter(embeddings([c["content"] for d in done for c in d["chunks"]]))
    live = [m for m in fact_rows if m["erased_at"] is None]
    fact_vecs = dict(zip((m["id"] for m in live), embeddings([m["content"] for m in live]), strict=True))
    with db.tx() as c:
        for d in docs:
            status = "done" if d["status"] == "done" else "queued"
            c.execute("INSERT INTO documents(id, ns, custom_id, content, metadata, valid_at, status, error,"
                      " created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?)",
                      (d["id"], ns, d.get("customId"), d["content"], json.dumps(d.get("metadata") or {}),
                       d.get("validAt"), status, None, d["createdAt"], d["updatedAt"]))
            if status != "done":
                c.execute("INSERT INTO jobs(ns, document_id, stage, state, run_after, created_at, updated_at)"
                          " VALUES (?,?,'chunk','queued',?,?,?)", (ns, d["id"], now(), now(), now()))
                continue
            chunks = sorted(d["chunks"], key=lambda ch: ch["seq"])
            texts = facts.chunk_index_texts(settings, [ch["content"] for ch in chunks], d.get("validAt"))
            for ch, text in zip(chunks, texts, strict=True):
                v = next(chunk_vecs)
                c.execute("INSERT INTO chunks(id, ns, document_id, seq, content, tokens, embedding, indexed)"
                          " VALUES (?,?,?,?,?,?,?,1)", (ch["id"], ns, d["id"], ch["seq"], ch["content"],
                                                        estimate_tokens(ch["content"]), v))
                rowid = db.conn.last_insert_rowid()
                c.execute("INSERT INTO chunks_fts(rowid, content, ns) VALUES (?,?,?)", (rowid, text, ns))
                vectors.insert(c, "chunk", rowid, ns, v)
            c.execute("INSERT INTO jobs(ns, document_id, stage, state, run_after, stages, created_at, updated_at)"
                      " VALUES (?,?,'done','done',?,?,?,?)",
                      (ns, d["id"], now(), json.dumps({"import": {"state": "done", "from": header["ns"]}}),
                       now(), now()))
        for m in fact_rows:
            vec = fact_vecs.get(m["id"])
            c.execute("INSERT INTO memories(%s, ns, metadata, embedding, indexed, content_key) VALUES (%s)"
                      % (", ".join(FACT_FIELDS), ", ".join("?" * (len(FACT_FIELDS) + 5))),
                      (*(m[k] for k in FACT_FIELDS), ns, json.dumps(m.get("metadata") or {}), vec, 1,
                       None if m["erased_at"] else dbm.content_key(m["content"])))
            if vec is not None and m["forgotten_at"] is None:
                facts.index_memory(c, ns, {"rowid": db.conn.last_insert_rowid(), "content": m["content"],
                                           "embedding": vec})
            for h in m["history"]:
                c.execute("INSERT INTO history(ns, memory_id, event, other_id, at, detail) VALUES (?,?,?,?,?,?)",
                          (ns, m["id"], h["event"], h.get("other_id"), h["at"], json.dumps(h.get("detail") or {})))
    return {"ns": ns, "documents": len(docs), "facts": len(fact_rows),
            "requeued": len(docs) - len(done)}
