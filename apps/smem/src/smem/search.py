"""Search: BM25 (FTS5) and vectors (sqlite-vec), fused with Reciprocal Rank Fusion, optionally reranked,
packed into a token budget."""

from __future__ import annotations

import re
import time

import numpy as np

from smem import facts, fusion, vectors
from smem.config import Settings
from smem.db import DB, now, vec_blob
from smem.embed import Embedder
from smem.lanes import embed_answer
from smem.text import estimate_tokens, speaker

MODES = ("hybrid", "memories", "chunks")

FACT_AT = facts.IN_FORCE_AT
CHUNK_AT = "c.indexed = 1 AND d.created_at <= :t"


# Function words only: OR-ed into the query they would let any sentence with "the" rank first.
STOPWORDS = frozenset("""a an and are as at be by did do does for from had has have he her his how i in is it its
me my near of on or our she so that the their them they this to was we were what when where which who whom why
will with you your""".split())


def query_words(q: str) -> list[str]:
    """The query's content words (its stop words dropped, unless that leaves none)."""
    return [w for w in re.findall(r"\w+", q) if w.lower() not in STOPWORDS] or re.findall(r"\w+", q)


def fts_query(q: str) -> str | None:
    """Every content word of the query as a quoted FTS5 term, OR-ed: BM25 ranks, no FTS syntax gets through."""
    return _or(query_words(q))


def _or(words: list[str]) -> str | None:
    return " OR ".join('"%s"' % w for w in words) if words else None


FTS = {"chunk": "chunks_fts", "memory": "memories_fts"}


def rare_words(db: DB, kind: str, words: list[str], scan: int) -> list[str]:
    """The words that match at most `scan` rows of the index (any namespace); each count stops at scan + 1."""
    probe = "SELECT count(*) FROM (SELECT rowid FROM %s WHERE %s MATCH ? LIMIT ?)" % (FTS[kind], FTS[kind])
    return [w for w in words if db.scalar(probe, ('"%s"' % w, scan + 1)) <= scan]


def _bm25(db: DB, kind: str, words: list[str], params: dict, n: int, *, scan: int) -> list[int]:
    """The keyword phase, its cost bounded by `scan` whatever the words match: BM25 over the rows that hold a
    word matching at most `scan` rows of the file (the others weigh little in BM25: their IDF is low); if every
    word matches more, BM25 over the namespace's newest `scan` rows that match any of them. In a file shared by
    many namespaces that last scan also passes over other namespaces' newer matches."""
    # FTS first, then the rows it found (CROSS JOIN keeps that order): started from the namespace's rows,
    # SQLite would run the MATCH once per row of the namespace. The pool bounds the joins at n x 4.
    rare = rare_words(db, kind, words, scan)
    fts = FTS[kind]
    if rare:
        found = (f"(SELECT rowid AS r, bm25({fts}) AS score FROM {fts} WHERE {fts} MATCH :q AND ns = :ns"
                 " ORDER BY score LIMIT :pool)")
    else:
        # ns inside the newest-first scan: the namespace's own newest matches, not the file's (another
        # namespace's newer facts would hide all of its). Its cost: the matches newer than those.
        found = (f"(SELECT r, score FROM (SELECT rowid AS r, bm25({fts}) AS score FROM {fts} WHERE {fts} MATCH :q"
                 " AND ns = :ns ORDER BY rowid DESC LIMIT :scan) ORDER BY score LIMIT :pool)")
    if kind == "chunk":
        sql = ("SELECT c.rowid FROM " + found + " f CROSS JOIN chunks c ON c.rowid = f.r CROSS JOIN documents d"
               " ON d.id = c.document_id WHERE c.ns = :ns AND " + CHUNK_AT + " ORDER BY f.score LIMIT :n")
    else:
        sql = ("SELECT m.rowid FROM " + found + " f CROSS JOIN memories m ON m.rowid = f.r WHERE m.ns = :ns AND "
               + FACT_AT + " ORDER BY f.score LIMIT :n")
    return [r["rowid"] for r in db.rows(sql, {**params, "q": _or(rare or words), "n": n, "pool": 4 * n,
                                              "scan": scan})]


def _knn(db: DB, kind: str, qv: np.ndarray, params: dict, n: int) -> list[int]:
    # The k nearest in the namespace's partition (by the bit vectors, then exactly: smem.vectors), then the
    # time filter on those rows: ask for more than n.
    def statement(near: str) -> str:
        if kind == "chunk":
            return ("SELECT c.rowid FROM " + near + " v CROSS JOIN chunks c ON c.rowid = v.r CROSS JOIN documents d"
                    " ON d.id = c.document_id WHERE c.ns = :ns AND " + CHUNK_AT +
                    " ORDER BY " + vectors.DISTANCE % "c" + " LIMIT :n")
        return ("SELECT m.rowid FROM " + near + " v CROSS JOIN memories m ON m.rowid = v.r"
                " WHERE m.ns = :ns AND " + FACT_AT + " ORDER BY " + vectors.DISTANCE % "m" + " LIMIT :n")
    return [r["rowid"] for r in vectors.knn(db, kind, params["ns"], vec_blob(qv), n * 4, statement=statement,
                                            params={**params, "n": n})]


def search(db: DB, embedder: Embedder, settings: Settings, ns: str, q: str, *, mode: str = "hybrid",
           limit: int | None = None, as_of: str | None = None, rerank: str = "none",
           threshold: float | None = None, budget_tokens: int | None = None, reranker=None) -> dict:
    """reranker: a smem.lanes.LaneReranker, or None (then rerank "order" is degraded "reranker")."""
    t0 = time.perf_counter()
    limit = limit or settings.default_limit
    kinds = {"hybrid": ("memory", "chunk"), "memories": ("memory",), "chunks": ("chunk",)}[mode]
    params = {"ns": ns, "t": as_of or now()}
    degraded: list[str] = []
    timing: dict[str, float] = {}
    lists: list[list[tuple[str, int]]] = []
    sources: list[str] = []  # what made each list: "bm25" or "vector" (fusion weights them)

    words = query_words(q)
    t = time.perf_counter()
    if words:
        for kind in kinds:
            lists.append([(kind, r) for r in _bm25(db, kind, words, params, settings.candidates,
                                                   scan=settings.keyword_scan)])
            sources.append("bm25")
    timing["bm25Ms"] = round(1000 * (time.perf_counter() - t), 2)

    t = time.perf_counter()
    qv = None
    served = {"embed": None, "rerank": None}
    try:
        answer = embed_answer(embedder, [q])
        qv, served["embed"] = answer.value[0], answer.served
        _down(degraded, answer.down)
    except Exception as e:  # any failure of the vector lane: answer from BM25 and say so
        _down(degraded, getattr(e, "down", []))
        degraded.append("embedder")
    if qv is not None:
        for kind in kinds:
            lists.append([(kind, r) for r in _knn(db, kind, qv, params, settings.candidates)])
            sources.append("vector")
    timing["vectorMs"] = round(1000 * (time.perf_counter() - t), 2)

    ordered = fusion.ranked(fusion.rrf(lists, settings.rrf_k, fusion.weights_for(sources, settings.bm25_weight)))
    if settings.speaker_boost:
        ordered = _speaker_boost(db, ordered, q, settings.speaker_boost)
    rerank_scores: dict = {}
    if rerank == "order":
        t = time.perf_counter()
        if reranker is None:
            degraded.append("reranker")
        else:
            try:
                ordered, rerank_scores, served["rerank"], down = _rerank(db, reranker, settings, q, ordered)
                _down(degraded, down)
            except Exception as e:  # over budget or no node: unreranked, and say so
                _down(degraded, getattr(e, "down", []))
                degraded.append("reranker")
        timing["rerankMs"] = round(1000 * (time.perf_counter() - t), 2)

    results, used = _pack(db, ordered, rerank_scores, qv, threshold, budget_tokens=budget_tokens, limit=limit)
    timing["totalMs"] = round(1000 * (time.perf_counter() - t0), 2)
    return {"results": results, "degraded": degraded, "timing": timing, "usedTokens": used, "served": served}


def _down(degraded: list[str], nodes: list[str]) -> None:
    degraded.extend(n for n in nodes if n not in degraded)


def _rerank(db: DB, reranker, settings: Settings, q: str, ranked: list):
    """The fused top rerank_top_k in the reranker's order, the rest after them as they were;
    (that order, the rerank scores, the node that served, the nodes skipped as down)."""
    top = ranked[:settings.rerank_top_k]
    if not top:
        return ranked, {}, None, []
    texts = [_load(db, kind, rowid)["content"] for (kind, rowid), _ in top]
    answer = reranker.rerank(q, texts, settings.rerank_budget_ms / 1000)
    order = sorted(range(len(top)), key=lambda i: -answer.value[i])
    scores = {top[i][0]: answer.value[i] for i in order}
    return [top[i] for i in order] + ranked[len(top):], scores, answer.served, answer.down


def _speaker_boost(db: DB, ranked: list, q: str, boost: float) -> list:
    """A transcript's turn whose speaker the query names ("what did Ann ...") scores (1 + boost) times its
    fused score: the question is about what that person said or did. Chunks that are no turn of a
    transcript (no speaker label before them) are left as they are."""
    words = {w.lower() for w in re.findall(r"\w+", q)}
    who = _speakers(db, [rowid for (kind, rowid), _ in ranked if kind == "chunk"])
    named = {r for r, name in who.items() if name and set(re.findall(r"\w+", name.lower())) <= words}
    if not named:
        return ranked
    boosted = [(key, score * (1 + boost) if key[0] == "chunk" and key[1] in named else score) for key, score in ranked]
    return sorted(boosted, key=lambda kv: -kv[1])


def _speakers(db: DB, rowids: list[int], back: int = 8) -> dict[int, str | None]:
    """The speaker of each chunk: its own label, or (a piece of a longer turn) the label of the nearest of the
    `back` chunks before it in its document that has one; None for a chunk of no transcript."""
    out: dict[int, str | None] = {}
    spans: dict[str, list] = {}
    for i in range(0, len(rowids), 500):
        part = rowids[i:i + 500]
        for r in db.rows("SELECT rowid, document_id, seq, content FROM chunks WHERE rowid IN (%s)"
                         % ",".join("?" * len(part)), part):
            out[r["rowid"]] = speaker(r["content"])
            if out[r["rowid"]] is None and r["seq"] > 0:
                spans.setdefault(r["document_id"], []).append((r["rowid"], r["seq"]))
    for doc, items in spans.items():
        lo, hi = min(seq for _, seq in items) - back, max(seq for _, seq in items)
        labels = {x["seq"]: speaker(x["content"]) for x in db.rows(
            "SELECT seq, content FROM chunks WHERE document_id=? AND seq BETWEEN ? AND ?", (doc, lo, hi))}
        for rowid, seq in items:
            out[rowid] = next((labels[s] for s in range(seq - 1, seq - back - 1, -1) if labels.get(s)), None)
    return out


def _pack(db: DB, ranked: list, rerank_scores: dict, qv, threshold: float | None, *, budget_tokens: int | None,
          limit: int):
    """In ranked order, each result whole or not at all, within budgetTokens (text.estimate_tokens)."""
    results, used = [], 0
    for (kind, rowid), score in ranked:
        item = _load(db, kind, rowid)
        vec = item.pop("_vec")
        if threshold is not None:
            if qv is None:
                break  # no similarity to compare; "embedder" is already in degraded
            if float(np.frombuffer(vec, np.float32) @ qv) < threshold:
                continue
        tokens = item.pop("_tokens")
        if budget_tokens is not None and used + tokens > budget_tokens:
            continue
        used += tokens
        item["score"] = round(score, 6)
        if (kind, rowid) in rerank_scores:
            item["rerankScore"] = round(rerank_scores[(kind, rowid)], 6)
        results.append(item)
        if len(results) >= limit:
            break
    return results, used


def _load(db: DB, kind: str, rowid: int) -> dict:
    if kind == "chunk":
        r = db.one("SELECT id, content, document_id, tokens, embedding FROM chunks WHERE rowid=?", (rowid,))
        return {"id": r["id"], "kind": "chunk", "content": r["content"], "documentId": r["document_id"],
                "_tokens": r["tokens"], "_vec": r["embedding"]}
    r = db.one("SELECT id, content, document_id, valid_from, valid_to, embedding FROM memories WHERE rowid=?", (rowid,))
    item = {"id": r["id"], "kind": "memory", "content": r["content"], "validFrom": r["valid_from"],
            "validTo": r["valid_to"], "_tokens": estimate_tokens(r["content"]), "_vec": r["embedding"]}
    if r["document_id"]:
        item["documentId"] = r["document_id"]
    return item
