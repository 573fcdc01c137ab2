"""Facts and chunks in the indexes: putting them in, taking them out, and erasing them for good.

Everything here runs inside the caller's write transaction (`c`, from DB.tx())."""

from __future__ import annotations

import hashlib

import numpy as np

from smem.db import DB, now, vec_blob
from smem.text import date_label, index_texts, normalise

CURRENT = "valid_to IS NULL AND forgotten_at IS NULL"


def index_memory(c, ns: str, m: dict) -> None:
    c.execute("INSERT INTO memories_fts(rowid, content, ns) VALUES (?,?,?)", (m["rowid"], m["content"], ns))
    c.execute("INSERT INTO vec_memories(rowid, ns, embedding) VALUES (?,?,?)", (m["rowid"], ns, m["embedding"]))
    c.execute("UPDATE memories SET indexed=1 WHERE rowid=?", (m["rowid"],))


def chunk_index_texts(settings, contents: list[str], valid_at: str | None) -> list[str]:
    """What BM25 reads of each chunk: the chunk with its neighbours and the document's date."""
    s = settings
    return index_texts(contents, before=s.context_before, after=s.context_after,
                       header=date_label(valid_at) if s.context_date else None)


def unindex_memory(c, rowid: int) -> None:
    c.execute("DELETE FROM memories_fts WHERE rowid=?", (rowid,))
    c.execute("DELETE FROM vec_memories WHERE rowid=?", (rowid,))


def drop_chunk_index(c, doc_id: str) -> None:
    """The document's chunks out of both indexes (the chunk rows stay)."""
    for (rowid,) in c.execute("SELECT rowid FROM chunks WHERE document_id=? AND indexed=1", (doc_id,)).fetchall():
        c.execute("DELETE FROM chunks_fts WHERE rowid=?", (rowid,))
        c.execute("DELETE FROM vec_chunks WHERE rowid=?", (rowid,))


def content_hash(content: str) -> str:
    return "sha256:" + hashlib.sha256(content.encode()).hexdigest()


def forget(db: DB, c, ns: str, m: dict, *, erase: bool, event: str = "forgotten", **detail) -> None:
    """Out of both indexes, forgotten from now (the row stays for the history). erase: its content,
    embedding, metadata and every history detail go too; what stays is the tombstone: the id, the
    times, and the content's hash in an "erased" event."""
    t = now()
    unindex_memory(c, m["rowid"])
    c.execute("UPDATE memories SET forgotten_at=coalesce(forgotten_at, ?), expired_at=coalesce(expired_at, ?)"
              " WHERE rowid=?", (t, t, m["rowid"]))
    if m.get("forgotten_at") is None:
        db.history(c, ns, m["id"], event, None, **detail)
    if erase and m.get("erased_at") is None:
        digest = content_hash(m["content"])
        c.execute("UPDATE memories SET content='', embedding=NULL, metadata='{}', erased_at=? WHERE rowid=?",
                  (t, m["rowid"]))
        c.execute("UPDATE history SET detail='{}' WHERE ns=? AND memory_id=?", (ns, m["id"]))
        db.history(c, ns, m["id"], "erased", None, contentHash=digest)


def retire_document_facts(db: DB, c, ns: str, doc_id: str, *, erase: bool) -> int:
    """A deleted document's facts: the pending ones dropped, the indexed ones forgotten ("retired")."""
    c.execute("DELETE FROM memories WHERE document_id=? AND indexed=0", (doc_id,))
    rows = db.rows("SELECT * FROM memories WHERE document_id=? AND ns=?", (doc_id, ns))
    for m in rows:
        forget(db, c, ns, m, erase=erase, event="retired", documentId=doc_id)
    return len(rows)


def supersede_document_facts(db: DB, c, ns: str, doc_id: str, at: str) -> int:
    """A document replaced (its customId posted again): the old version's current facts close at `at`."""
    rows = db.rows("SELECT id, valid_from FROM memories WHERE document_id=? AND ns=? AND indexed=1 AND " + CURRENT,
                   (doc_id, ns))
    for m in rows:
        c.execute("UPDATE memories SET valid_to=max(valid_from, ?), expired_at=? WHERE id=?", (at, now(), m["id"]))
        db.history(c, ns, m["id"], "superseded", None, documentId=doc_id, reason="the document was replaced")
    return len(rows)


def find_duplicate(db: DB, ns: str, content: str, vector: np.ndarray, near: float) -> str | None:
    """An exact (normalised) or near (cosine >= near) duplicate among the namespace's current facts."""
    key = normalise(content)
    for m in db.rows("SELECT id, content FROM memories WHERE ns=? AND indexed=1 AND " + CURRENT, (ns,)):
        if normalise(m["content"]) == key:
            return m["id"]
    for hit in db.rows("SELECT rowid, distance FROM vec_memories WHERE embedding MATCH ? AND k = 10 AND ns = ?",
                       (vec_blob(vector), ns)):
        if 1 - hit["distance"] < near:
            break
        m = db.one("SELECT id FROM memories WHERE rowid=? AND " + CURRENT, (hit["rowid"],))
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
        m = db.one("SELECT id, content FROM memories WHERE rowid=? AND " + CURRENT, (hit["rowid"],))
        if m:
            out.append(m)
    return out
