"""Weighted Reciprocal Rank Fusion: what search.py can call in place of its inline RRF loop.

score(key) = sum over lists of weight(list) / (k + rank of key in that list), rank from 1.

Weights and k are settings tuned on data (bench/smem_locomo.py tunes them on LoCoMo conversations
0-4 and reports on 5-9): with a contextual BM25 index the BM25 lists earn a larger weight than the
vector lists, and a smaller k than 60 lets the head of each list count for more."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def rrf(lists: Sequence[Sequence[Hashable]], k: float = 60, weights: Sequence[float] | None = None
        ) -> dict[Hashable, float]:
    """Fused scores of every key in any list. weights: one per list (default 1.0 each)."""
    if weights is None:
        weights = [1.0] * len(lists)
    if len(weights) != len(lists):
        raise ValueError("rrf: %d weights for %d lists" % (len(weights), len(lists)))
    if k < 0:
        raise ValueError("rrf: k must be >= 0, not %r" % (k,))
    fused: dict[Hashable, float] = {}
    for weight, ranked in zip(weights, lists, strict=True):
        for rank, key in enumerate(ranked, start=1):
            fused[key] = fused.get(key, 0.0) + weight / (k + rank)
    return fused


def ranked(fused: dict[Hashable, float]) -> list[tuple[Hashable, float]]:
    """(key, score) best first; ties keep the order in which the keys were first met."""
    return sorted(fused.items(), key=lambda kv: -kv[1])


def weights_for(sources: Sequence[str], bm25_weight: float = 1.0, vector_weight: float = 1.0) -> list[float]:
    """One weight per list from what made it: "bm25" or "vector" (search appends its lists in that order)."""
    table = {"bm25": bm25_weight, "vector": vector_weight}
    try:
        return [table[s] for s in sources]
    except KeyError as e:
        raise ValueError("weights_for: unknown list source %s" % e) from None
