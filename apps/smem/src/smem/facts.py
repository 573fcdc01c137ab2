"""Facts and chunks in the indexes: putting them in, taking them out, and erasing them for good.

Everything here runs inside the caller's write transaction (`c`, from DB.tx())."""

from __future__ import annotations

import hashlib

import numpy as np

from smem import vectors
from smem.db import DB, content_key, now, vec_blob
from smem.text import date_label, index_texts

# "In force", the one way it is written: a fact (alias m) in the indexes, not forgotten, and valid at :t in
# the world's time. CURRENT is the same at "now" regardless of validFrom: not closed, not forgotten.
IN_FORCE_AT = ("m.indexed = 1 AND m.forgotten_at IS NULL AND m.valid_from <= :t"
               " AND (m.valid_to IS NULL OR m.valid_to > :t)")
CURRENT = "m.indexed = 1 AND m.valid_to IS NULL AND m.forgotten_at IS NULL"


def index_memory(c, ns: str, m: dict) -> None:
    c.execute("INSERT INTO memories_fts(rowid, content, ns) VALUES (?,?,?)", (m["rowid"], m["content"], ns))
    vectors.insert(c, "memory", m["rowid"], ns, m["embedding"])
    c.execute("UPDATE memories SET indexed=1 WHERE rowid=?", (m["rowid"],))


def chunk_index_texts(settings, contents: list[str], valid_at: str | None) -> list[str]:
    """What BM25 reads of each chunk: the chunk with its neighbours and the document's date."""
    s = settings
    return index_texts(contents, before=s.context_before, after=s.context_after,
                       header=date_label(valid_at) if s.context_date else None)


def unindex_memory(c, rowid: int, ns: str) -> None:
    c.execute("DELETE FROM memories_fts WHERE rowid=?", (rowid,))
    vectors.delete(c, "memory", rowid, ns)


def drop_chunk_index(c, doc_id: str) -> None:
    """The document's chunks out of both indexes (the chunk rows stay)."""
    for rowid, ns in c.execute("SELECT rowid, ns FROM chunks WHERE document_id=? AND indexed=1", (doc_id,)).fetchall():
        c.execute("DELETE FROM chunks_fts WHERE rowid=?", (rowid,))
        vectors.delete(c, "chunk", rowid, ns)


def content_hash(content: str) -> str:
    return "sha256:" + hashlib.sha256(content.encode()).hexdigest()


def forget(db: DB, c, ns: str, m: dict, *, erase: bool, event: str = "forgotten", **detail) -> None:
    """Out of both indexes, forgotten from now (the row stays for the history). erase: its content,
    embedding, metadata and every history detail go too; what stays is the tombstone: the id, the
    times, and the content's hash in an "erased" event."""
    t = now()
    unindex_memory(c, m["rowid"], ns)
    c.execute("UPDATE memories SET forgotten_at=coalesce(forgotten_at, ?), expired_at=coalesce(expired_at, ?)"
              " WHERE rowid=?", (t, t, m["rowid"]))
    if m.get("forgotten_at") is None:
        db.history(c, ns, m["id"], event, None, **detail)
    if erase and m.get("erased_at") is None:
        digest = content_hash(m["content"])
        c.execute("UPDATE memories SET content='', content_key=NULL, embedding=NULL, metadata='{}', erased_at=?"
                  " WHERE rowid=?",
                  (t, m["rowid"]))
        c.execute("UPDATE history SET detail='{}' WHERE ns=? AND memory_id=?", (ns, m["id"]))
        db.history(c, ns, m["id"], "erased", None, contentHash=digest)


def retire_document_facts(db: DB, c, ns: str, doc_id: str, *, erase: bool) -> int:
    """A deleted document's facts: the pending ones dropped, the indexed ones forgotten ("retired")."""
    c.execute("DELETE FROM memories WHERE document_id=? AND indexed=0", (doc_id,))
    rows = db.rows("SELECT * FROM memories INDEXED BY memories_document WHERE document_id=? AND ns=?", (doc_id, ns))
    for m in rows:
        forget(db, c, ns, m, erase=erase, event="retired", documentId=doc_id)
    return len(rows)


def supersede_document_facts(db: DB, c, ns: str, doc_id: str, at: str) -> int:
    """A document replaced (its customId posted again): the old version's current facts close at `at`."""
    rows = db.rows("SELECT m.id, m.valid_from FROM memories m INDEXED BY memories_document WHERE m.document_id=?"
                   " AND m.ns=? AND " + CURRENT,
                   (doc_id, ns))
    for m in rows:
        c.execute("UPDATE memories SET valid_to=max(valid_from, ?), expired_at=? WHERE id=?", (at, now(), m["id"]))
        db.history(c, ns, m["id"], "superseded", None, documentId=doc_id, reason="the document was replaced")
    return len(rows)


def exact_duplicate(db: DB, ns: str, content: str) -> str | None:
    """A current fact of the namespace with the same text but for case and spacing (an index lookup)."""
    return db.scalar("SELECT m.id FROM memories m WHERE m.ns = ? AND m.content_key = ? AND " + CURRENT +
                     " ORDER BY m.rowid LIMIT 1", (ns, content_key(content)))


def near_duplicate(db: DB, ns: str, vector: np.ndarray, near: float, k: int = 10) -> str | None:
    """A current fact of the namespace with cosine >= near, among the k nearest vectors."""
    for m in nearest(db, ns, vector, k):
        if 1 - m["distance"] < near:
            break
        return m["id"]
    return None


def nearest(db: DB, ns: str, vector: np.ndarray, k: int) -> list[dict]:
    """Up to k current facts of the namespace among its nearest vectors, nearest first: {id, content, distance}."""
    return vectors.knn(db, "memory", ns, vec_blob(vector), k, params={}, statement=lambda near: (
        "SELECT m.id, m.content, " + vectors.DISTANCE % "m" + " AS distance FROM " + near +
        " v CROSS JOIN memories m ON m.rowid = v.r WHERE " + CURRENT + " ORDER BY distance LIMIT :k"))


def find_duplicate(db: DB, ns: str, content: str, vector: np.ndarray, near: float) -> str | None:
    """An exact (normalised) or near (cosine >= near) duplicate among the namespace's current facts:
    an index lookup and one bounded KNN query, whatever the namespace's size."""
    return exact_duplicate(db, ns, content) or near_duplicate(db, ns, vector, near)


def newer_duplicate(db: DB, ns: str, content: str, vector: np.ndarray, *, near: float, after: int) -> str | None:
    """The re-check under the write lock of a duplicate check made before it: a fact written since
    (rowid >= after) that duplicates this one; the facts written meanwhile, not the namespace, are read."""
    key = content_key(content)
    v = np.asarray(vector, np.float32)
    # NOT INDEXED: the rowid range is the few rows written since; an index on ns would be the namespace.
    for m in db.rows("SELECT m.id, m.content_key, m.embedding FROM memories m NOT INDEXED WHERE m.ns = ?"
                     " AND m.rowid >= ? AND " + CURRENT + " ORDER BY m.rowid", (ns, after)):
        if m["content_key"] == key:
            return m["id"]
        if m["embedding"] is not None:
            e = np.frombuffer(m["embedding"], np.float32)
            if float(e @ v) / (float(np.linalg.norm(e) * np.linalg.norm(v)) or 1.0) >= near:
                return m["id"]
    return None


def last_rowid(db: DB) -> int:
    return db.scalar("SELECT max(rowid) FROM memories") or 0


def nearest_current(db: DB, ns: str, vector: np.ndarray, k: int, close: float) -> list[dict]:
    """Up to k current facts of the namespace with cosine >= close to vector, nearest first."""
    return [{"id": m["id"], "content": m["content"]} for m in nearest(db, ns, vector, 4 * k)
            if 1 - m["distance"] >= close][:k]
