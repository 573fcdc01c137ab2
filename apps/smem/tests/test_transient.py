"""A model call that fails outside the document (the node answers 503, as a restarting llama-server does)
spends no attempt: the job comes back after a growing wait and goes on once the node answers; only a fault
that outlasts transient_retry_s fails the document, saying so."""

from __future__ import annotations

import threading

from conftest import JSONStub, Service
from smem.config import Settings

DIM = 8


class Embeddings(JSONStub):
    """An embeddings server that answers 503 to its first `failures` calls (or to all: None)."""

    def __init__(self, failures: int | None):
        self.calls, self.failures, self.lock = 0, failures, threading.Lock()

        def respond(path, body, headers):
            with self.lock:
                self.calls += 1
                failing = self.failures is None or self.calls <= self.failures
            if failing:
                return 503, {"error": "loading model"}
            return 200, {"data": [{"index": i, "embedding": [1.0] + [0.0] * (DIM - 1)}
                                  for i in range(len(body["input"]))]}
        super().__init__(respond)


def service(tmp_path, url: str, **more) -> Service:
    nodes = {"nodes": {"n0": {"embed": url}}}
    settings = Settings(models={"embed": {"name": "stub", "dim": DIM}},
                        lanes={"interactive": dict(nodes), "background": {"nodes": {"b0": {"embed": url}}}},
                        down_s=0.0, transient_backoff_s=0.0, **more)
    return Service(tmp_path / "smem.db", settings, None)


def test_a_node_that_fails_for_a_while_delays_the_document_and_it_completes(tmp_path):
    stub = Embeddings(failures=6)   # more than job_max_attempts (3) failed tries
    try:
        svc = service(tmp_path, stub.url)
        doc = svc.ingest("alice", "Ann moved to Lisbon in May.")
        d = svc.call("GET", "/v5/ns/alice/documents/" + doc).json()
        assert d["status"] == "done", d
        assert d["job"]["attempts"] == 0   # the node's faults spent none of the document's attempts
        assert stub.calls > 6
    finally:
        stub.close()


def test_a_fault_that_outlasts_the_window_fails_the_document_and_says_why(tmp_path):
    stub = Embeddings(failures=None)
    try:
        svc = service(tmp_path, stub.url, transient_retry_s=0.3)
        doc = svc.ingest("alice", "Ann moved to Lisbon in May.")
        d = svc.call("GET", "/v5/ns/alice/documents/" + doc).json()
        assert d["status"] == "failed"
        assert "503" in d["error"] and "the lane's nodes failed for" in d["error"], d["error"]
        assert d["job"]["stages"]["transient"]["tries"] >= 2
    finally:
        stub.close()
