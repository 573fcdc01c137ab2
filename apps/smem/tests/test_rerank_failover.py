"""Rerank within its budget: a node that runs past its share of the budget is passed over (not marked down:
it is slow, not broken) and the next node answers in the time left; the next search goes to the node that
answered (a node that ran late goes after the lane's other idle nodes for down_s)."""

from __future__ import annotations

import threading

from conftest import JSONStub
from smem.config import Settings
from smem.lanes import LaneReranker, Lanes


class Reranker(JSONStub):
    """A /v1/rerank server; slow: it holds every call until released (past any budget)."""

    def __init__(self, slow: bool):
        self.calls, self.release = 0, threading.Event()

        def respond(path, body, headers):
            self.calls += 1
            if slow:
                self.release.wait(30)
            n = len(body["documents"])
            return 200, {"results": [{"index": i, "relevance_score": float(n - i)} for i in range(n)]}
        super().__init__(respond)


def test_a_slow_first_reranker_is_passed_over_within_the_budget():
    slow, fast = Reranker(slow=True), Reranker(slow=False)
    try:
        settings = Settings(models={"embed": {"name": "e", "dim": 4}, "rerank": {"name": "r"}},
                            lanes={"interactive": {"nodes": {"a": {"embed": slow.url, "rerank": slow.url},
                                                             "b": {"embed": fast.url, "rerank": fast.url}}}})
        reranker = LaneReranker(Lanes(settings), {"name": "r"})
        first = reranker.rerank("q", ["x", "y", "z"], budget_s=4.0)
        assert first.served == "interactive/b" and first.down == []
        assert first.value == [3.0, 2.0, 1.0]
        again = reranker.rerank("q", ["x", "y"], budget_s=4.0)
        assert again.served == "interactive/b" and slow.calls == 1   # the slow node is not asked again
    finally:
        slow.release.set()
        slow.close()
        fast.close()
