"""The coarse KNN pass on bits held in memory (smem.bit_cache): the same candidates as sqlite-vec's scan of the
bit table, right after another process's writes (caught up from the change log, or read again), never a
vector deleted (a fact forgotten or erased), nothing from a write transaction that did not commit, and
within its memory bound."""

from __future__ import annotations

import numpy as np
import pytest
from test_vectors import DIM, exact_top, unit

from smem import archive, bulk, facts, memories, search, vectors
from smem import db as dbm
from smem.bit_cache import BitCache, Held
from smem.config import Settings


@pytest.fixture
def file(tmp_path):
    """3,000 facts of alice in 5 topics (as sentence embeddings sit), 3 of bob; the topics' centres."""
    rng = np.random.default_rng(31)
    centres = unit(rng.standard_normal((5, DIM)))
    path = str(tmp_path / "h.db")
    db = dbm.DB(path, "test-embedder", DIM)
    bulk.facts(db, "alice", 3000, DIM, rng=rng, vecs=unit(centres[rng.integers(0, 5, 3000)]
                                                          + 1.2 * unit(rng.standard_normal((3000, DIM)))))
    bulk.facts(db, "bob", 3, DIM, rng=rng)
    db.close()
    return path, centres, rng


def open_db(path: str, **kw) -> dbm.DB:
    """A DB object of its own: its connections and its held bits are as another process's."""
    return dbm.DB(path, "test-embedder", DIM, **kw)


def held_nearest(db, ns: str, q: np.ndarray, m: int) -> list[int] | None:
    with db.reading() as (c, clean):
        return db.bit_cache.nearest(c, clean=clean, kind="memory", table="vec_memories_bits", ns=ns,
                                    query_bits=vectors.bits(q.tobytes()), m=m)


def hamming(db, rowids: list[int], q: np.ndarray) -> list[int]:
    qb = np.unpackbits(np.frombuffer(vectors.bits(q.tobytes()), np.uint8))
    out = []
    for r in rowids:
        b = db.scalar("SELECT embedding FROM vec_memories_bits WHERE rowid = ?", (r,))
        out.append(int((np.unpackbits(np.frombuffer(b, np.uint8)) != qb).sum()))
    return sorted(out)


def table_bits(db, ns: str) -> dict[int, bytes]:
    return {r["rowid"]: r["embedding"] for r in db.rows("SELECT rowid, embedding FROM vec_memories_bits WHERE ns = ?",
                                                        (ns,))}


def copy_bits(db, ns: str) -> dict[int, bytes]:
    """What the held copy of ns holds: {rowid: bits}."""
    h = db.bit_cache._held[("memory", ns)]
    live = np.flatnonzero(~h.dead[:h.n])
    return {int(h.rowids[i]): h.cols[:, i].copy().view(np.uint8)[:DIM // 8].tobytes() for i in live}


def test_the_held_copy_is_the_namespaces_bit_table(file):
    """Read from sqlite-vec's own chunk tables: every live row of the namespace, with its bits, and no other
    namespace's; rows deleted in the middle of a chunk are not in it."""
    path, _, _ = file
    db = open_db(path)
    with db.tx() as c:
        for m in db.rows("SELECT * FROM memories WHERE ns = 'alice' AND rowid % 7 = 0"):
            facts.forget(db, c, "alice", m, erase=False)
    q = unit(np.ones(DIM))
    assert held_nearest(db, "alice", q, 10) is not None and db.bit_cache.loads == 1
    want = table_bits(db, "alice")
    assert len(want) == 3000 - 3000 // 7
    assert copy_bits(db, "alice") == want
    db.close()


def test_held_candidates_are_sqlite_vecs_by_hamming_distance(file):
    """The m nearest by Hamming distance, as sqlite-vec's KNN on the bit table finds them (ties may pick
    other rows at the same distance: the distances are compared)."""
    path, centres, rng = file
    db = open_db(path)
    for i in range(5):
        q = unit(centres[i] + 1.2 * unit(rng.standard_normal(DIM)))
        held = held_nearest(db, "alice", q, 400)
        sql = [r for (r,) in db.conn.execute("SELECT rowid FROM vec_memories_bits WHERE embedding MATCH vec_bit(?)"
                                             " AND k = 400 AND ns = 'alice'", (vectors.bits(q.tobytes()),))]
        assert len(held) == 400
        assert hamming(db, held, q) == hamming(db, sql, q)
        bob = {r for (r,) in db.conn.execute("SELECT rowid FROM memories WHERE ns = 'bob'")}
        assert not bob & set(held)
    db.close()


def test_recall_through_the_held_copy(file):
    """search's and the duplicate check's KNN, as smem runs them (held bits, then exact cosine), against the
    exact top 10 of 30 queries."""
    path, centres, rng = file
    db = open_db(path)
    near = knn = 0
    for i in range(30):
        q = unit(centres[i % 5] + 1.2 * unit(rng.standard_normal(DIM)))
        want = set(exact_top(db, "alice", q, 10))
        near += len(want & {m["id"] for m in facts.nearest(db, "alice", q, 10)})
        rowids = search._knn(db, "memory", q, {"ns": "alice", "t": dbm.now()}, 50)[:10]
        knn += len(want & {db.scalar("SELECT id FROM memories WHERE rowid = ?", (r,)) for r in rowids})
    assert db.bit_cache.loads == 1   # every query went through the one held copy
    db.close()
    assert near >= 0.95 * 300 and knn >= 0.95 * 300, (near, knn)


def test_another_process_write_is_seen_without_reading_the_namespace_again(file):
    path, centres, _ = file
    reader, writer = open_db(path), open_db(path)
    q = centres[0]
    assert facts.nearest(reader, "alice", q, 1)   # held from here
    bulk.facts(writer, "alice", 1, DIM, vecs=q[None, :])
    new_id = writer.scalar("SELECT id FROM memories WHERE rowid = (SELECT max(rowid) FROM memories)")
    assert facts.nearest(reader, "alice", q, 1)[0]["id"] == new_id
    assert reader.bit_cache.loads == 1   # caught up from the change log
    assert copy_bits(reader, "alice") == table_bits(reader, "alice")
    # A namespace held while it had no vectors: its copy is as wide as the vectors that come.
    assert facts.nearest(reader, "carol", q, 1) == []
    bulk.facts(writer, "carol", 2, DIM)
    assert len(facts.nearest(reader, "carol", q, 5)) == 2 and reader.bit_cache.held_rows("memory", "carol") == 2
    writer.close()
    reader.close()


def test_forgotten_and_erased_facts_leave_the_held_copy(file):
    path, centres, _ = file
    reader, writer = open_db(path), open_db(path)
    q = centres[1]
    top = facts.nearest(reader, "alice", q, 3)
    memories.forget(writer, "alice", top[0]["id"], None, False)
    memories.forget(writer, "alice", top[1]["id"], None, False, erase=True)
    gone = {writer.scalar("SELECT rowid FROM memories WHERE id = ?", (m["id"],)) for m in top[:2]}
    assert not gone & set(held_nearest(reader, "alice", q, 3000))   # the candidates themselves, not only the rows
    assert [m["id"] for m in facts.nearest(reader, "alice", q, 1)] == [top[2]["id"]]
    assert not gone & set(search._knn(reader, "memory", q, {"ns": "alice", "t": dbm.now()}, 50))
    assert reader.bit_cache.loads == 1
    writer.close()
    reader.close()


def test_a_copy_further_behind_than_the_log_reads_its_namespace_again(file, monkeypatch):
    path, centres, _ = file
    monkeypatch.setattr(vectors, "LOG_KEEP", 4)
    monkeypatch.setattr(vectors, "LOG_PRUNE_EVERY", 4)
    reader, writer = open_db(path), open_db(path)
    q = centres[2]
    facts.nearest(reader, "alice", q, 1)
    bulk.facts(writer, "alice", 20, DIM, vecs=np.repeat(q[None, :], 20, axis=0), batch=1)
    assert writer.scalar("SELECT count(*) FROM vector_log") <= 8   # pruned
    assert 1 - facts.nearest(reader, "alice", q, 1)[0]["distance"] > 0.999
    assert reader.bit_cache.loads == 2
    assert copy_bits(reader, "alice") == table_bits(reader, "alice")
    writer.close()
    reader.close()


def test_a_write_transaction_that_rolls_back_leaves_nothing_in_the_copy(file):
    """Inside a write transaction, a held copy behind it is not used (the transaction's own uncommitted
    vectors would go into it): the SQL scan answers, and sees them."""
    path, centres, _ = file
    db = open_db(path)
    q = centres[3]
    facts.nearest(db, "alice", q, 1)
    before = copy_bits(db, "alice")
    with pytest.raises(RuntimeError), db.tx() as c:
        c.execute("INSERT INTO memories(id, ns, content, valid_from, recorded_at, origin, embedding, indexed)"
                  " VALUES ('mem_tmp', 'alice', 'x', '2020', '2020', 'user', ?, 1)", (q.tobytes(),))
        vectors.insert(c, "memory", c.last_insert_rowid(), "alice", q.tobytes())
        assert facts.nearest(db, "alice", q, 1)[0]["id"] == "mem_tmp"
        raise RuntimeError("roll back")
    assert copy_bits(db, "alice") == before == table_bits(db, "alice")
    assert facts.nearest(db, "alice", q, 1)[0]["id"] != "mem_tmp"
    db.close()


def test_a_namespace_over_the_bound_is_scanned_in_sqlite_and_the_least_recent_goes_first(file):
    path, centres, _ = file
    db = open_db(path)
    q = centres[4]
    want = [m["id"] for m in facts.nearest(open_db(path, bit_cache_mb=0), "alice", q, 10)]
    db.bit_cache = BitCache(100_000)   # alice's 3,000 rows need ~210 kB
    assert held_nearest(db, "alice", q, 10) is None
    assert [m["id"] for m in facts.nearest(db, "alice", q, 10)] == want   # the SQL scan answered
    assert db.bit_cache.loads == 0
    db.bit_cache = BitCache(300_000)
    facts.nearest(db, "alice", q, 1)
    facts.nearest(db, "bob", q, 1)
    assert db.bit_cache.held_rows("memory", "alice") == 3000 and db.bit_cache.held_rows("memory", "bob") == 3
    bulk.facts(db, "bob", 2000, DIM)
    facts.nearest(db, "bob", q, 1)   # bob's 2,003 and alice's 3,000 do not fit together: alice goes
    assert db.bit_cache.held_rows("memory", "alice") is None and db.bit_cache.held_rows("memory", "bob") == 2003
    db.close()


def test_a_new_epoch_drops_the_copy(file, tmp_path):
    """A restore stamps the file with a new epoch: a process's copy of the file it replaced is not used."""
    path, centres, _ = file
    db = open_db(path)
    facts.nearest(db, "alice", centres[0], 1)
    copy = str(tmp_path / "copy.db")
    archive.backup(path, to=copy)
    restored = str(tmp_path / "restored.db")
    archive.restore(copy, restored)
    epoch = "SELECT value FROM meta WHERE key = 'vectors_epoch'"
    assert open_db(restored).scalar(epoch) != db.scalar(epoch)
    other = dbm.connect(path)
    vectors.new_epoch(other)
    other.close()
    facts.nearest(db, "alice", centres[0], 1)
    assert db.bit_cache.loads == 2
    db.close()


def test_held_rows_under_random_changes():
    """Out-of-order inserts, deletes, re-inserts of a deleted rowid, replacements, compactions: the copy's live
    rows are always the model's."""
    rng = np.random.default_rng(2)
    model: dict[int, bytes] = {}
    held = Held(np.zeros(0, np.int64), np.zeros((6, 0), np.uint64), 0, "e")
    for step in range(20_000):
        r = int(rng.integers(1, 6000))
        if rng.random() < 0.6:
            b = rng.integers(0, 256, 48, dtype=np.uint8).tobytes()
            held.add(r, b)
            model[r] = b
        else:
            held.remove(r)
            model.pop(r, None)
        if step % 2500 == 0 or step == 19_999:
            live = np.flatnonzero(~held.dead[:held.n])
            got = {int(held.rowids[i]): held.cols[:, i].copy().view(np.uint8).tobytes() for i in live}
            assert got == model
            assert sorted(held.nearest(np.zeros(6, np.uint64), 10**6).tolist()) == sorted(model)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_a_bad_bound_is_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="bit_cache_mb: a whole number >= 0"):
        Settings(bit_cache_mb=bad)
    with pytest.raises(ValueError, match="bit_cache_mb: a whole number >= 0"):
        dbm.DB(str(tmp_path / "b.db"), "test-embedder", DIM, bit_cache_mb=bad)
