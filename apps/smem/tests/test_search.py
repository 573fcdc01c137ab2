"""Search: fusion, modes, time, forgetting, the token budget, degraded lanes."""

from __future__ import annotations

from smem.config import Settings
from smem.search import search
from smem.text import estimate_tokens, speaker

DOCS = [
    "The quarterly report says the Oslo office doubled its revenue.",
    "Our cat Miso likes to sleep on the radiator in winter.",
    "The VCA card's nodes boot over the PCIe virtual network.",
    "Lunch on Fridays is pizza from the place on the corner.",
]


def test_hybrid_finds_by_keyword_and_by_meaning(svc):
    for d in DOCS:
        svc.ingest("alice", d)
    svc.remember("alice", "Miso is a ginger cat.")
    by_word = svc.search("alice", "radiator", mode="chunks")["results"]
    assert "radiator" in by_word[0]["content"]
    by_meaning = svc.search("alice", "which pet naps near the heater?")["results"]
    assert {r["kind"] for r in by_meaning} == {"chunk", "memory"}
    assert "Miso" in by_meaning[0]["content"]
    memories_only = svc.search("alice", "Miso", mode="memories")["results"]
    assert memories_only and {r["kind"] for r in memories_only} == {"memory"}


def test_rrf_k_is_a_setting_and_scores_follow_it(make_service):
    scores = {}
    for k in (1, 60):
        svc = make_service(rrf_k=k)
        svc.ingest("alice", DOCS[1])
        top = svc.search("alice", "Miso radiator", mode="chunks")["results"][0]
        scores[k] = top["score"]
        svc.db.close()
        svc.path.unlink()
    # First in both lists: (bm25_weight + 1) / (k + 1), bm25_weight 2 by default.
    assert scores == {1: 1.5, 60: round(3 / 61, 6)}


def test_budget_tokens_packs_whole_results_within_the_budget(svc):
    for d in DOCS:
        svc.ingest("alice", d)
    budget = estimate_tokens(DOCS[0]) + estimate_tokens(DOCS[2])
    out = svc.search("alice", "office revenue card nodes network", mode="chunks", budgetTokens=budget)
    assert out["usedTokens"] <= budget
    assert sum(estimate_tokens(r["content"]) for r in out["results"]) == out["usedTokens"]
    assert len(out["results"]) < len(DOCS)
    assert len(svc.search("alice", "office revenue card nodes network", mode="chunks")["results"]) == len(DOCS)


def test_as_of_answers_with_the_fact_in_force_then(svc):
    old = svc.remember("alice", "Ann lives in Oslo.", validAt="2020-01-01")
    new = svc.remember("alice", "Ann lives in Bergen.", validAt="2023-06-01", supersedes=old["id"])
    now_ids = [r["id"] for r in svc.search("alice", "where does Ann live", mode="memories")["results"]]
    assert now_ids == [new["id"]]
    then = svc.search("alice", "where does Ann live", mode="memories", asOf="2021-03-01")["results"]
    assert [r["id"] for r in then] == [old["id"]]
    assert then[0]["validTo"] == "2023-06-01T00:00:00.000000Z"
    before_all = svc.search("alice", "where does Ann live", mode="memories", asOf="2019-01-01")["results"]
    assert before_all == []


def test_forgotten_fact_never_comes_back(svc):
    m = svc.remember("alice", "The door code is 4321.")
    svc.remember("alice", "The office plant is a fern.")
    r = svc.call("POST", "/v5/ns/alice/forget", json={"id": m["id"]})
    assert r.status_code == 200 and [f["id"] for f in r.json()["forgotten"]] == [m["id"]]
    for mode in ("hybrid", "memories", "chunks"):
        for q in ("door code", "The door code is 4321.", "4321"):
            assert m["id"] not in [x["id"] for x in svc.search("alice", q, mode=mode)["results"]]
            assert m["id"] not in [x["id"] for x in svc.search("alice", q, mode=mode, asOf="2000-01-01")["results"]]
    assert m["id"] not in [x["id"] for x in svc.call("GET", "/v5/ns/alice/memories").json()["memories"]]
    assert svc.db.scalar("SELECT count(*) FROM vec_memories WHERE rowid=(SELECT rowid FROM memories WHERE id=?)",
                         (m["id"],)) == 0


def test_vector_lane_down_is_said_not_hidden(svc):
    for d in DOCS:
        svc.ingest("alice", d)
    svc.embedder.down = True
    out = svc.search("alice", "radiator")
    assert out["degraded"] == ["embedder"]
    assert "radiator" in out["results"][0]["content"]          # BM25 still answers


def test_rerank_order_without_a_reranker_is_degraded(svc):
    svc.ingest("alice", DOCS[0])
    assert svc.search("alice", "revenue", rerank="none")["degraded"] == []
    out = svc.search("alice", "revenue", rerank="order")
    assert out["degraded"] == ["reranker"] and out["results"]


def test_threshold_drops_dissimilar_results(svc):
    for d in DOCS:
        svc.ingest("alice", d)
    loose = svc.search("alice", "cat sleeping", mode="chunks", threshold=0.0)["results"]
    strict = svc.search("alice", "cat sleeping", mode="chunks", threshold=0.4)["results"]
    assert len(loose) == len(DOCS)
    assert [r["content"] for r in strict] == [DOCS[1]]


def test_a_transcript_is_a_chunk_a_turn_indexed_with_its_neighbours_and_date(svc):
    turns = ["Ann: I adopted a puppy called Biscuit.", "Bob: What breed is it?", "Ann: A beagle, three months old.",
             "Bob: Nice! Send a photo."]
    doc = svc.ingest("alice", "\n".join(turns), validAt="2023-05-08T13:56:00")
    rows = svc.db.rows("SELECT c.content, f.content AS indexed FROM chunks c JOIN chunks_fts f ON f.rowid = c.rowid"
                       " WHERE c.document_id=? ORDER BY c.seq", (doc,))
    assert [r["content"] for r in rows] == turns
    assert rows[2]["indexed"] == "\n".join(["8 May 2023", *turns])
    # Found by a word only its neighbours hold; returned and counted alone.
    found = [r["content"] for r in svc.search("alice", "Biscuit", mode="chunks")["results"]]
    assert turns[2] in found and all(c in turns for c in found)
    out = svc.search("alice", "Biscuit", mode="chunks", budgetTokens=estimate_tokens(turns[2]))
    assert out["usedTokens"] == sum(estimate_tokens(r["content"]) for r in out["results"]) <= estimate_tokens(turns[2])
    assert svc.search("alice", "May 2023", mode="chunks")["results"]


def test_a_turn_whose_speaker_the_query_names_ranks_first(make_service):
    """speaker_boost: "where did Ann go hiking" asks what Ann said or did; Bob's turn that only talks about her
    ranks first on its words, Ann's own turn first with the boost."""
    turns = ["Bob: Ann, Ann, hiking with Ann is hiking at its best, Ann!", "Ann: I went to the Alps last summer."]
    svc = make_service(context_before=0, context_after=0, context_date=False, turn_tokens=0)   # turns whole, alone
    svc.ingest("alice", "\n".join(turns))
    for boost, first in ((0.0, turns[0]), (2.0, turns[1])):
        s = Settings(speaker_boost=boost, context_before=0, context_after=0, context_date=False)
        got = [r["content"] for r in search(svc.db, svc.embedder, s, "alice", "Where did Ann go hiking?",
                                            mode="chunks")["results"]]
        assert got[0] == first, (boost, got)
    assert speaker("Ann: hi") == "Ann" and speaker("[10:02] Dr Who: hi") == "Dr Who" and speaker("no label") is None


def test_a_long_turn_is_chunked_in_its_sentences_and_its_pieces_keep_their_speaker(make_service):
    turns = ["Ann: We spent last week at the lake house. The weather was lovely. I took up pottery there.",
             "Bob: Ann's pottery is lovely, I saw it."]
    svc = make_service(turn_tokens=16, context_before=0, context_after=0, context_date=False)
    doc = svc.ingest("alice", "\n".join(turns))
    chunks = [r["content"] for r in svc.db.rows("SELECT content FROM chunks WHERE document_id=? ORDER BY seq",
                                                (doc,))]
    assert chunks == ["Ann: We spent last week at the lake house.", "The weather was lovely.",
                      "I took up pottery there.", turns[1]]
    # The third piece has no label of its own: it is Ann's, so "what does Ann do" ranks it above Bob's turn.
    for boost, first in ((0.0, turns[1]), (1.0, chunks[2])):
        s = Settings(speaker_boost=boost)
        got = search(svc.db, svc.embedder, s, "alice", "What pottery does Ann do?", mode="chunks")["results"]
        assert got[0]["content"] == first, (boost, [r["content"] for r in got])
