"""Rows straight into smem's own tables, many at a time: the bulk of a large namespace for the query-plan
test and bench/smem_scale.py. Not a service path: no embedder (random unit vectors), no judge, no checks.
What it writes is what smem's write path writes for a fact a caller adds (memories, memories_fts,
vec_memories and its bits, a "created" history event) and for a done document (documents, chunks, chunks_fts,
vec_chunks and its bits, a done job)."""

from __future__ import annotations

import datetime as dt

import numpy as np

from smem import vectors
from smem.db import DB, TIME_FMT, content_key, new_id
from smem.text import estimate_tokens


class Words:
    """Sentences of made-up words with a Zipf-like spread, so that FTS sees rare and common terms."""

    def __init__(self, rng: np.random.Generator, vocabulary: int = 20_000):
        self.rng = rng
        self.words = ["w%s" % np.base_repr(i, 36).lower() for i in range(vocabulary)]
        p = 1.0 / np.arange(1, vocabulary + 1)
        self.p = p / p.sum()

    def sentence(self, n: int = 12) -> str:
        return " ".join(self.words[i] for i in self.rng.choice(len(self.words), size=n, p=self.p))


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _stamp(i: int) -> str:
    # Fixed-width times one second apart from 2020, as db.now() writes them.
    return (dt.datetime(2020, 1, 1) + dt.timedelta(seconds=i)).strftime(TIME_FMT)


def facts(db: DB, ns: str, n: int, dim: int, *, rng: np.random.Generator | None = None,
          words: Words | None = None, batch: int = 5000, start: int = 0, vecs: np.ndarray | None = None) -> None:
    """n current facts in ns, in transactions of `batch`; vecs: their vectors (else random unit vectors)."""
    rng = rng or np.random.default_rng(0)
    words = words or Words(rng)
    c = db.conn
    for lo in range(0, n, batch):
        k = min(batch, n - lo)
        part = unit_vectors(rng, k, dim) if vecs is None else np.asarray(vecs[lo:lo + k], np.float32)
        with db.tx():
            for j in range(k):
                text = words.sentence()
                t = _stamp(start + lo + j)
                mem_id = new_id("mem")
                blob = part[j].tobytes()
                c.execute("INSERT INTO memories(id, ns, content, content_key, valid_from, recorded_at, origin,"
                          " embedding, indexed) VALUES (?,?,?,?,?,?,'user',?,1)",
                          (mem_id, ns, text, content_key(text), t, t, blob))
                rowid = c.last_insert_rowid()
                c.execute("INSERT INTO memories_fts(rowid, content, ns) VALUES (?,?,?)", (rowid, text, ns))
                vectors.insert(c, "memory", rowid, ns, blob)
                c.execute("INSERT INTO history(ns, memory_id, event, at) VALUES (?,?,'created',?)", (ns, mem_id, t))


def documents(db: DB, ns: str, n: int, chunks_each: int, dim: int, *, rng: np.random.Generator | None = None,
              words: Words | None = None) -> list[str]:
    """n done documents of chunks_each indexed chunks in ns; their ids."""
    rng = rng or np.random.default_rng(1)
    words = words or Words(rng)
    c = db.conn
    ids = []
    with db.tx():
        for i in range(n):
            t = _stamp(i)
            doc_id = new_id("doc")
            ids.append(doc_id)
            texts = [words.sentence(40) for _ in range(chunks_each)]
            c.execute("INSERT INTO documents(id, ns, content, status, created_at, updated_at) VALUES (?,?,?,?,?,?)",
                      (doc_id, ns, "\n\n".join(texts), "done", t, t))
            for seq, (text, v) in enumerate(zip(texts, unit_vectors(rng, chunks_each, dim), strict=True)):
                c.execute("INSERT INTO chunks(id, ns, document_id, seq, content, tokens, embedding, indexed)"
                          " VALUES (?,?,?,?,?,?,?,1)", (new_id("chk"), ns, doc_id, seq, text, estimate_tokens(text),
                                                         v.tobytes()))
                rowid = c.last_insert_rowid()
                c.execute("INSERT INTO chunks_fts(rowid, content, ns) VALUES (?,?,?)", (rowid, text, ns))
                vectors.insert(c, "chunk", rowid, ns, v.tobytes())
            c.execute("INSERT INTO jobs(ns, document_id, stage, state, run_after, created_at, updated_at)"
                      " VALUES (?,?,'done','done',?,?,?)", (ns, doc_id, t, t, t))
    return ids
