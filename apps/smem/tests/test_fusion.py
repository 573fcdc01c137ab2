"""Weighted Reciprocal Rank Fusion (smem.fusion)."""

from __future__ import annotations

import pytest

from smem import fusion


def test_unweighted_is_the_rrf_search_does_today():
    fused = fusion.rrf([["a", "b"], ["b", "c"]], k=60)
    assert fused == pytest.approx({"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 62})
    assert [key for key, _ in fusion.ranked(fused)] == ["b", "a", "c"]


def test_weights_scale_each_list():
    fused = fusion.rrf([["a"], ["b"]], k=0, weights=[2.0, 1.0])
    assert fused == {"a": 2.0, "b": 1.0}
    # A heavier BM25 list lets its first hit beat the vector list's first hit (a tie unweighted).
    vec, bm25 = ["z", "y"], ["x", "w"]
    assert fusion.ranked(fusion.rrf([vec, bm25], 20))[0][0] == "z"
    weights = fusion.weights_for(["vector", "bm25"], bm25_weight=3.0)
    assert weights == [1.0, 3.0]
    assert [k for k, _ in fusion.ranked(fusion.rrf([vec, bm25], 20, weights))] == ["x", "w", "z", "y"]


def test_ties_keep_first_seen_order_and_empty_lists_are_fine():
    assert [k for k, _ in fusion.ranked(fusion.rrf([["a"], ["b"]], 10))] == ["a", "b"]
    assert fusion.rrf([[], []], 10) == {}
    assert fusion.rrf([], 10) == {}


def test_bad_arguments():
    with pytest.raises(ValueError, match="weights"):
        fusion.rrf([["a"]], 10, [1.0, 2.0])
    with pytest.raises(ValueError, match="k must be"):
        fusion.rrf([["a"]], -1)
    with pytest.raises(ValueError, match="unknown list source"):
        fusion.weights_for(["bm25", "rerank"])
