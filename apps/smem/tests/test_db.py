"""The file: WAL, the versioned schema and its migrations, the namespace partitions of the vector index."""

from __future__ import annotations

import apsw
import numpy as np
import pytest

from smem import db as dbm
from smem.db import DB, SchemaError, connect, migrate, vec_blob


def test_new_file_is_wal_at_the_current_version(tmp_path):
    d = DB(str(tmp_path / "a.db"), "e", 4)
    assert d.scalar("PRAGMA journal_mode") == "wal"
    assert d.version == dbm.VERSION == d.scalar("SELECT max(version) FROM schema_version")
    names = {r["name"] for r in d.rows("SELECT name FROM sqlite_master")}
    for table in ("documents", "chunks", "memories", "history", "jobs", "tokens", "leases",
                  "chunks_fts", "memories_fts", "vec_chunks", "vec_memories"):
        assert table in names


def test_old_version_file_is_migrated_and_keeps_its_data(tmp_path):
    path = str(tmp_path / "old.db")
    c = connect(path)
    assert migrate(c, "e", 4, upto=1) == 1          # a file as version 1 of smem left it
    c.execute("INSERT INTO documents(id, ns, custom_id, content, status, created_at, updated_at)"
              " VALUES ('doc_1', 'alice', 'k', 'old text', 'done', 't', 't')")
    c.close()

    d = DB(path, "e", 4)
    assert d.version == dbm.VERSION == 8
    assert d.scalar("SELECT content FROM documents WHERE id='doc_1'") == "old text"
    versions = [r["version"] for r in d.rows("SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, dbm.VERSION + 1))
    assert "extends" in {r["name"] for r in d.rows("PRAGMA table_info(memories)")}  # migration 3
    # Migration 2's index is in force: customId is unique within a namespace.
    with pytest.raises(apsw.ConstraintError):
        d.conn.execute("INSERT INTO documents(id, ns, custom_id, content, status, created_at, updated_at)"
                       " VALUES ('doc_2', 'alice', 'k', 'x', 'done', 't', 't')")


def test_a_newer_file_is_refused(tmp_path):
    path = str(tmp_path / "new.db")
    DB(path, "e", 4).conn.execute("INSERT INTO schema_version VALUES (99, 't')")
    with pytest.raises(SchemaError, match="99"):
        DB(path, "e", 4)


def test_another_embedders_file_is_refused(tmp_path):
    path = str(tmp_path / "a.db")
    DB(path, "model-a", 4)
    with pytest.raises(SchemaError, match="model-a"):
        DB(path, "model-b", 4)


def test_vector_index_is_partitioned_by_namespace(tmp_path):
    d = DB(str(tmp_path / "a.db"), "e", 4)
    v = np.array([1, 0, 0, 0], dtype=np.float32)
    with d.tx() as c:
        c.execute("INSERT INTO vec_chunks(rowid, ns, embedding) VALUES (1, 'alice', ?), (2, 'bob', ?)",
                  (vec_blob(v), vec_blob(v)))
    hits = d.rows("SELECT rowid FROM vec_chunks WHERE embedding MATCH ? AND k = 10 AND ns = 'alice'", (vec_blob(v),))
    assert [h["rowid"] for h in hits] == [1]


def test_a_version_5_file_upgrades_with_its_facts_findable(tmp_path):
    """A file as smem before migration 6 made it: its facts get their content key (the duplicate check and
    forget by content find them by index) and its vectors move to the small-chunk vector tables intact."""
    path = str(tmp_path / "v5.db")
    c = connect(path)
    assert migrate(c, "e", 4, upto=5) == 5
    v = np.array([0, 1, 0, 0], dtype=np.float32)
    c.execute("INSERT INTO memories(rowid, id, ns, content, valid_from, recorded_at, origin, embedding, indexed)"
              " VALUES (7, 'mem_old', 'alice', 'Ann  LIKES tea', 't', 't', 'user', ?, 1)", (vec_blob(v),))
    c.execute("INSERT INTO vec_memories(rowid, ns, embedding) VALUES (7, 'alice', ?)", (vec_blob(v),))
    c.close()

    d = DB(path, "e", 4)
    assert d.version == dbm.VERSION
    assert d.scalar("SELECT content_key FROM memories WHERE id='mem_old'") == dbm.content_key("ann likes tea")
    hits = d.rows("SELECT rowid FROM vec_memories WHERE embedding MATCH ? AND k = 5 AND ns = 'alice'", (vec_blob(v),))
    assert [h["rowid"] for h in hits] == [7]
    assert "chunk_size=%d" % dbm.VEC_CHUNK_SIZE in d.scalar("SELECT sql FROM sqlite_master WHERE name='vec_memories'")


def test_a_namespace_reserves_little_vector_space(tmp_path):
    """sqlite-vec reserves a chunk of vectors per namespace partition: 20 one-fact namespaces stay small."""
    path = tmp_path / "many.db"
    d = DB(str(path), "e", 384)
    with d.tx() as c:
        for i in range(20):
            c.execute("INSERT INTO vec_memories(rowid, ns, embedding) VALUES (?, ?, ?)",
                      (i + 1, "ns%d" % i, vec_blob(np.ones(384, np.float32))))
    d.close()
    # 20 x 1,024 vectors x 384 floats would be 31 MB; 20 x 64 x 384 x 4 bytes is 2 MB.
    assert path.stat().st_size < 4 * 2**20
