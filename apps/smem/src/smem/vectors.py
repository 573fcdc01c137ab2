"""The vector indexes. Each kind (a fact, a chunk) has two sqlite-vec tables, partitioned by namespace: its
float vectors (vec_memories, vec_chunks) and beside them the sign of each float as one bit (vec_memories_bits,
vec_chunks_bits). A KNN query runs on the bits (Hamming distance, 32x less to read than the floats) for
`oversample` times the candidates it needs, then ranks those exactly by cosine with the float vector the row
itself holds (memories.embedding, chunks.embedding): a coarse pass that grows with the namespace but is cheap,
and an exact one that grows only with k."""

from __future__ import annotations

import json
import secrets

import apsw
import numpy as np

FLOAT = {"memory": "vec_memories", "chunk": "vec_chunks"}
BITS = {"memory": "vec_memories_bits", "chunk": "vec_chunks_bits"}
ROWS = {"memory": "memories", "chunk": "chunks"}
FILL_KEY = {"memory": "bits_fill_memories", "chunk": "bits_fill_chunks"}   # meta: the last rowid filled
FILL_BATCH = 2000

# The exact distance of a candidate, from the float vector its row holds (:v is the query's float vector).
DISTANCE = "vec_distance_cosine(%s.embedding, :v)"


def bits(embedding: bytes) -> bytes:
    """The sign of each float (1: > 0), 8 to a byte, the first float in the lowest bit (sqlite-vec's order);
    a dimension that is no multiple of 8 is padded with 0 bits."""
    return np.packbits(np.frombuffer(embedding, np.float32) > 0, bitorder="little").tobytes()


def insert(c, kind: str, rowid: int, ns: str, embedding: bytes) -> None:
    b = bits(embedding)
    c.execute("INSERT INTO %s(rowid, ns, embedding) VALUES (?,?,?)" % FLOAT[kind], (rowid, ns, embedding))
    c.execute("INSERT INTO %s(rowid, ns, embedding) VALUES (?,?,vec_bit(?))" % BITS[kind], (rowid, ns, b))
    _log(c, kind, ns, rowid, b)


def delete(c, kind: str, rowid: int, ns: str) -> None:
    c.execute("DELETE FROM %s WHERE rowid=?" % FLOAT[kind], (rowid,))
    c.execute("DELETE FROM %s WHERE rowid=?" % BITS[kind], (rowid,))
    # The log's earlier copy of its bits goes too (an erased fact leaves no trace of its vector); a copy
    # catching up reads that entry as a delete, and this one after it in any snapshot that sees either.
    c.execute("UPDATE vector_log SET bits = NULL WHERE kind = ? AND item = ? AND bits IS NOT NULL", (kind, rowid))
    _log(c, kind, ns, rowid, None)


# The change log of the bit tables (smem.bit_cache): the newest LOG_KEEP changes, older ones pruned every
# LOG_PRUNE_EVERY; a copy held in memory that is further behind reads its namespace again.
LOG_KEEP = 50_000
LOG_PRUNE_EVERY = 1_000


def _log(c, kind: str, ns: str, rowid: int, b: bytes | None) -> None:
    c.execute("INSERT INTO vector_log(kind, ns, item, bits) VALUES (?,?,?,?)", (kind, ns, rowid, b))
    seq = c.last_insert_rowid()
    if seq % LOG_PRUNE_EVERY == 0:
        c.execute("DELETE FROM vector_log WHERE seq <= ?", (seq - LOG_KEEP,))


def create_log(c: apsw.Connection) -> None:
    """Migration 8: the change log of the bit tables, and the file's epoch (a restore gives it a new one)."""
    c.execute("CREATE TABLE vector_log(seq INTEGER PRIMARY KEY, kind TEXT NOT NULL, ns TEXT NOT NULL,"
              " item INTEGER NOT NULL, bits BLOB)")
    c.execute("CREATE INDEX vector_log_item ON vector_log(kind, item) WHERE bits IS NOT NULL")
    new_epoch(c)


def new_epoch(c: apsw.Connection) -> None:
    c.execute("INSERT INTO meta VALUES ('vectors_epoch', ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
              (secrets.token_hex(8),))


# The fewest k the coarse pass multiplies: a small k's exact top is often outside its k x 8 nearest by the
# bits (the duplicate check's k = 10 on 20,000 clustered vectors: 68% of its top 10 at 80 candidates, 100% at
# 400), while the pass costs about the same for 80 or 1,600 (it reads every bit vector either way).
MIN_K = 50


# The candidates the in-memory copy found (smem.bit_cache), as candidates() names them.
HELD = "(SELECT value AS r FROM json_each(:near))"


def knn(db, kind: str, ns: str, embedding: bytes, k: int, *, statement, params: dict) -> list[dict]:
    """The rows of statement(near), near a subquery of the namespace's (:ns) rowids nearest to the query
    vector (:v): by the bits held in memory when the DB holds them (smem.bit_cache), else candidates().
    The candidates and the rows come from one read transaction, so a vector deleted before it (a fact
    forgotten or erased) is in neither."""
    p = {**params, "ns": ns, "k": k, "v": embedding}
    with db.reading() as (c, clean):
        coarse = db.coarse()
        near = None
        if coarse and db.bit_cache is not None:
            near = db.bit_cache.nearest(c, clean=clean, kind=kind, table=BITS[kind], ns=ns, query_bits=bits(embedding),
                                        m=max(k, MIN_K) * db.coarse_oversample)
        if near is not None:
            return db.rows(statement(HELD), {**p, "near": json.dumps(near)})
        return db.rows(statement(candidates(kind, coarse)), {**p, "bits": bits(embedding),
                                                              "oversample": db.coarse_oversample})


def candidates(kind: str, coarse: bool) -> str:
    """A subquery of rowids (column r) of the namespace's (:ns) vectors nearest to :v: with coarse, the
    max(:k, MIN_K) * :oversample nearest by their bits (:bits, bits(:v); rank them by DISTANCE); else the :k
    nearest floats, exactly."""
    if coarse:
        return ("(SELECT rowid AS r FROM %s WHERE embedding MATCH vec_bit(:bits) AND k = max(:k, %d) * :oversample"
                " AND ns = :ns)" % (BITS[kind], MIN_K))
    return "(SELECT rowid AS r FROM %s WHERE embedding MATCH :v AND k = :k AND ns = :ns)" % FLOAT[kind]


def create_bit_tables(c: apsw.Connection, dim: int, chunk_size: int) -> None:
    """Migration 7: the bit tables, empty; fill_bits fills them from the float ones after it."""
    for kind in ("chunk", "memory"):
        c.execute("CREATE VIRTUAL TABLE %s USING vec0(ns text partition key, embedding bit[%d], chunk_size=%d)"
                  % (BITS[kind], -(-dim // 8) * 8, chunk_size))
        c.execute("INSERT INTO meta VALUES (?, '0')", (FILL_KEY[kind],))


def fill_bits(c: apsw.Connection, batch: int | None = None) -> int:
    """The bits of the vectors indexed before migration 7, FILL_BATCH rows of the table a transaction (a
    writer waits for one batch at most); resumable, and safe beside another process filling or writing.
    Until it ends (its meta keys gone) KNN queries use the float tables. Returns the rows filled."""
    batch, filled = batch or FILL_BATCH, 0
    for kind in ("memory", "chunk"):
        while True:
            c.execute("BEGIN IMMEDIATE")
            try:
                row = c.execute("SELECT value FROM meta WHERE key=?", (FILL_KEY[kind],)).fetchone()
                if row is None:
                    c.execute("COMMIT")
                    break
                rowids = [r for (r,) in c.execute("SELECT rowid FROM %s WHERE rowid > ? ORDER BY rowid LIMIT ?"
                                                  % ROWS[kind], (int(row[0]), batch))]
                if not rowids:
                    c.execute("DELETE FROM meta WHERE key=?", (FILL_KEY[kind],))
                else:
                    marks = ",".join("?" * len(rowids))
                    # A row written since migration 7 has its bits already: replaced, not doubled.
                    c.execute("DELETE FROM %s WHERE rowid IN (%s)" % (BITS[kind], marks), rowids)
                    rows = c.execute("SELECT rowid, ns, embedding FROM %s WHERE rowid IN (%s)"
                                     % (FLOAT[kind], marks), rowids).fetchall()
                    c.executemany("INSERT INTO %s(rowid, ns, embedding) VALUES (?,?,vec_bit(?))" % BITS[kind],
                                  [(r, ns, bits(e)) for r, ns, e in rows])
                    filled += len(rows)
                    c.execute("UPDATE meta SET value=? WHERE key=?", (str(rowids[-1]), FILL_KEY[kind]))
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                raise
    return filled


def bits_ready(c: apsw.Connection) -> bool:
    return not c.execute("SELECT 1 FROM meta WHERE key IN (?, ?)", tuple(FILL_KEY.values())).fetchall()
