"""Facts a caller brings, superseding, forgetting, the profile."""

from __future__ import annotations

import json

from smem import facts
from smem.db import DB, content_key, new_id, now, vec_blob
from smem.embed import Embedder
from smem.errors import Conflict, NotFound
from smem.facts import IN_FORCE_AT, index_memory


def public(m: dict) -> dict:
    out = {"id": m["id"], "content": m["content"], "validFrom": m["valid_from"], "validTo": m["valid_to"],
           "recordedAt": m["recorded_at"], "expiredAt": m["expired_at"], "supersedes": m["supersedes"],
           "extends": m["extends"], "origin": m["origin"], "documentId": m["document_id"],
           "sourceChunkId": m["source_chunk_id"], "model": m["model"], "promptHash": m["prompt_hash"],
           "forgottenAt": m["forgotten_at"], "erasedAt": m.get("erased_at")}
    return {k: v for k, v in out.items() if v is not None}


def add(db: DB, embedder: Embedder, near: float, ns: str, content: str, *, valid_at: str | None,
        supersedes: str | None, metadata: dict | None = None) -> dict:
    vector = embedder.embed([content])[0]  # before the transaction: a failing embedder changes nothing
    t = now()
    valid_from = valid_at or t
    # The duplicate check reads outside the write lock (an index lookup and a KNN query); under it, only
    # the candidate and the facts written since are looked at again.
    seen = facts.last_rowid(db)
    same = None if supersedes else facts.find_duplicate(db, ns, content, vector, near)
    with db.tx() as c:
        if supersedes:
            old = db.one("SELECT * FROM memories WHERE id=? AND ns=? AND forgotten_at IS NULL AND indexed=1",
                         (supersedes, ns))
            if old is None:
                raise NotFound("no memory %s in this namespace" % supersedes)
            if old["valid_to"] is not None:
                raise Conflict("memory %s was already superseded or closed at %s" % (supersedes, old["valid_to"]))
            if valid_from <= old["valid_from"]:
                raise Conflict("validAt %s is not after the superseded fact's validFrom %s"
                               % (valid_from, old["valid_from"]))
        else:
            if same and not db.scalar("SELECT 1 FROM memories m WHERE m.id = ? AND " + facts.CURRENT, (same,)):
                same = facts.find_duplicate(db, ns, content, vector, near)   # closed meantime: look again
            same = same or facts.newer_duplicate(db, ns, content, vector, near=near, after=seen)
            if same:
                # A reference to what was posted, not the text again: a repeated POST does not grow the file.
                db.history(c, ns, same, "duplicate", None, contentHash=facts.content_hash(content))
                return {**public(db.one("SELECT * FROM memories WHERE id=?", (same,))), "duplicate": True}
        mem_id = new_id("mem")
        c.execute("INSERT INTO memories(id, ns, content, content_key, valid_from, recorded_at, supersedes, origin,"
                  " embedding, metadata) VALUES (?,?,?,?,?,?,?,'user',?,?)",
                  (mem_id, ns, content, content_key(content), valid_from, t, supersedes, vec_blob(vector),
                   json.dumps(metadata or {})))
        row = db.one("SELECT rowid, id, content, embedding FROM memories WHERE id=?", (mem_id,))
        index_memory(c, ns, row)
        db.history(c, ns, mem_id, "created", supersedes)
        if supersedes:
            # The old fact stays, closed in the world's time and expired in smem's: asOf still finds it.
            c.execute("UPDATE memories SET valid_to=?, expired_at=? WHERE id=?", (valid_from, t, supersedes))
            db.history(c, ns, supersedes, "superseded", mem_id)
    return public(db.one("SELECT * FROM memories WHERE id=?", (mem_id,)))


def list_at(db: DB, ns: str, t: str | None, limit: int = 100) -> list[dict]:
    return page_at(db, ns, t, limit)[0]


def page_at(db: DB, ns: str, t: str | None, limit: int, after: list | None = None) -> tuple[list[dict], list | None]:
    """The facts in force at t, newest first, `limit` at a time: (this page, the key to pass as `after`
    for the next, or None at the end). The key is (validFrom, rowid) of the page's last fact."""
    params = {"ns": ns, "t": t or now(), "n": limit + 1}
    where = ""
    if after:
        where = " AND (m.valid_from < :vf OR (m.valid_from = :vf AND m.rowid < :r))"
        params.update(vf=after[0], r=after[1])
    rows = db.rows("SELECT m.* FROM memories m WHERE m.ns = :ns AND " + IN_FORCE_AT + where +
                   " ORDER BY m.valid_from DESC, m.rowid DESC LIMIT :n", params)
    more = len(rows) > limit
    rows = rows[:limit]
    return [public(m) for m in rows], ([rows[-1]["valid_from"], rows[-1]["rowid"]] if more else None)


def history(db: DB, ns: str, memory_id: str) -> list[dict]:
    return [{"event": h["event"], "otherId": h["other_id"], "at": h["at"], "detail": json.loads(h["detail"])}
            for h in db.rows("SELECT * FROM history WHERE ns=? AND memory_id=? ORDER BY id", (ns, memory_id))]


def forget(db: DB, ns: str, memory_id: str | None, content: str | None, dry_run: bool, *,
           erase: bool = False) -> dict:
    """Out of every index; erase: the content, embedding and history details gone for good too (a
    tombstone with the content's hash stays). An already forgotten fact can still be erased.
    By id one row is read; by content, the facts with its key (an index lookup)."""
    cond = "m.indexed = 1 AND m.erased_at IS NULL" + ("" if erase else " AND m.forgotten_at IS NULL")
    with db.tx() as c:
        if memory_id:
            targets = db.rows("SELECT m.* FROM memories m WHERE m.id = ? AND m.ns = ? AND " + cond, (memory_id, ns))
            if not targets:
                raise NotFound("no memory %s in this namespace" % memory_id)
        else:
            targets = db.rows("SELECT m.* FROM memories m WHERE m.ns = ? AND m.content_key = ? AND " + cond +
                              " ORDER BY m.rowid", (ns, content_key(content)))
        if not dry_run:
            for m in targets:
                facts.forget(db, c, ns, m, erase=erase)
            if erase and targets:
                db.mark_erase(c)
    return {"dryRun": dry_run, "erased": erase, "forgotten": [public(m) for m in targets]}


def profile(db: DB, ns: str) -> dict:
    docs = dict(db.conn.execute("SELECT status, count(*) FROM documents WHERE ns=? GROUP BY status", (ns,)).fetchall())
    # One pass over a covering index (memories_state): the namespace's rows are counted, never read.
    counts = db.one("SELECT count(*) FILTER (WHERE indexed = 1 AND valid_to IS NULL AND forgotten_at IS NULL)"
                    " AS current, count(*) FILTER (WHERE valid_to IS NOT NULL AND forgotten_at IS NULL) AS superseded,"
                    " count(*) FILTER (WHERE forgotten_at IS NOT NULL) AS forgotten,"
                    " count(*) FILTER (WHERE erased_at IS NOT NULL) AS erased"
                    " FROM memories INDEXED BY memories_state WHERE ns = ?", (ns,))
    return {
        "namespace": ns,
        "documents": docs,
        "chunks": db.scalar("SELECT count(*) FROM chunks WHERE ns=? AND indexed=1", (ns,)),
        "memories": counts,
        "newestFacts": list_at(db, ns, None, limit=5),
    }
