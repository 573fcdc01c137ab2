"""The keyword phase's cost does not grow with how many facts the query's words match (smem.search._bm25).
Cost is counted in SQLite virtual-machine steps (a progress handler, FTS5's own statements included):
the same on any machine, at any load."""

from __future__ import annotations

import numpy as np
import pytest

from smem import db as dbm
from smem import search, vectors
from smem.config import Settings
from smem.db import content_key, new_id, now

DIM = 16
SCAN = 50


@pytest.fixture
def db(tmp_path):
    d = dbm.DB(str(tmp_path / "k.db"), "test-embedder", DIM)
    yield d
    d.close()


def add(db, ns: str, texts: list[str]) -> list[int]:
    rowids, rng = [], np.random.default_rng(len(texts))
    with db.tx() as c:
        for text in texts:
            v = rng.standard_normal(DIM).astype(np.float32).tobytes()
            c.execute("INSERT INTO memories(id, ns, content, content_key, valid_from, recorded_at, origin, embedding,"
                      " indexed) VALUES (?,?,?,?,'2020','2020','user',?,1)", (new_id("mem"), ns, text,
                                                                               content_key(text), v))
            r = c.last_insert_rowid()
            c.execute("INSERT INTO memories_fts(rowid, content, ns) VALUES (?,?,?)", (r, text, ns))
            vectors.insert(c, "memory", r, ns, v)
            rowids.append(r)
    return rowids


def keyword(db, words: list[str], n: int = 10) -> tuple[list[int], int]:
    """The keyword phase's rowids for alice, and the VM steps it took."""
    steps = [0]

    def tick():
        steps[0] += 1
        return False
    db.conn.set_progress_handler(tick, 1)
    try:
        found = search._bm25(db, "memory", words, {"ns": "alice", "t": now()}, n, scan=SCAN)
    finally:
        db.conn.set_progress_handler(None)
    return found, steps[0]


def common(i: int) -> str:
    return "apple pie recipe number %d from the %s kitchen" % (i, ("north", "south", "east")[i % 3])


def test_the_cost_stays_flat_as_a_word_matches_more_facts(db):
    old = add(db, "alice", ["apple zebra tart"])[0]
    add(db, "alice", [common(i) for i in range(200)])
    found, small = keyword(db, ["apple", "zebra"])
    assert found[0] == old
    _, small_common = keyword(db, ["apple", "pie"])
    add(db, "alice", [common(i) for i in range(200, 1000)])   # 5x the facts that hold "apple"
    found, large = keyword(db, ["apple", "zebra"])
    assert found[0] == old
    _, large_common = keyword(db, ["apple", "pie"])
    assert large <= 1.2 * small, (small, large)
    assert large_common <= 1.2 * small_common, (small_common, large_common)


def test_a_rare_word_finds_its_old_fact_among_many_newer_common_ones(db):
    """BM25 over the rare word's rows: the fact is older than the newest SCAN matches of the common word."""
    old = add(db, "alice", ["apple zebra tart"])[0]
    add(db, "alice", [common(i) for i in range(5 * SCAN)])
    assert keyword(db, ["apple", "zebra"])[0][0] == old
    assert keyword(db, ["zebra"])[0] == [old]


def test_words_that_all_match_many_facts_rank_their_newest_matches(db):
    add(db, "alice", [common(i) for i in range(5 * SCAN)])
    newest = add(db, "alice", ["apple pie, apple pie, apple pie"] + [common(i) for i in range(SCAN - 1)])
    found, _ = keyword(db, ["apple", "pie"], n=5)
    assert len(found) == 5 and set(found) <= set(newest)
    assert found[0] == newest[0]   # the best BM25 among them: the fact that says both most often


def test_another_namespace_is_never_returned(db):
    add(db, "bob", ["zebra crossing"] + [common(i) for i in range(3 * SCAN)])
    mine = add(db, "alice", ["a zebra at noon"])
    assert keyword(db, ["zebra"])[0] == mine
    assert keyword(db, ["apple"])[0] == []


def test_common_words_find_the_namespaces_own_matches_under_another_namespaces_newer_ones(db):
    """The newest matches are the namespace's: bob's newer facts that hold the same common words do not hide
    alice's older ones."""
    mine = add(db, "alice", ["apple pie at home", "apple pie for two"])
    add(db, "bob", [common(i) for i in range(5 * SCAN)])
    found, _ = keyword(db, ["apple", "pie"])
    assert sorted(found) == sorted(mine)


@pytest.mark.parametrize("key,bad", [("keyword_scan", 0), ("keyword_scan", 2.5), ("keyword_scan", True),
                                     ("coarse_oversample", -1), ("coarse_oversample", "8")])
def test_the_knobs_refuse_bad_values(key, bad):
    with pytest.raises(ValueError, match=key):
        Settings(**{key: bad})
