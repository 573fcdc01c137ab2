"""Input that cannot hurt the lanes, and HTTP as clients expect it (issue 27, points 5 and 6)."""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import requests
import uvicorn

from conftest import JSONStub, free_port
from smem import text
from smem.config import Settings

# -- chunks bounded in the embedder's tokens, for any script ------------------------------------
SCRIPTS = {
    "chinese": "机器学习是人工智能的一个分支。它使计算机能够从数据中学习而无需明确编程。" * 120,
    "japanese": "東京は日本の首都であり、世界で最も人口の多い都市圏の一つです。" * 150,
    "thai": "ประเทศไทยเป็นประเทศในเอเชียตะวันออกเฉียงใต้มีกรุงเทพมหานครเป็นเมืองหลวง" * 80,
    "korean": "서울은 대한민국의 수도이며 가장 큰 도시입니다 " * 150,
    "space-less ascii": "https://example.invalid/" + "a1b2c3d4e5f6" * 900,
    "mixed": ("The log said: エラーが発生しました at 12:04; 重试 failed. " * 60),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_every_chunk_fits_the_embedders_tokens_in_any_script(minilm, name):
    content = SCRIPTS[name]
    limit = 200
    pieces = text.units(content, limit)
    assert len(pieces) > 1, "the text is over the limit: it must be cut"
    real = [len(minilm._tok.encode(p, add_special_tokens=False).ids) for p in pieces]
    assert max(real) <= limit, (name, max(real))
    assert "".join("".join(pieces).split()) == "".join(content.split())   # nothing lost, nothing added


# -- a stub that answers as llama-server does ---------------------------------------------------
TOO_LARGE_500 = {"error": {"code": 500, "message": "input (4121 tokens) is too large to process. increase the "
                           "physical batch size (current batch size: 512)", "type": "server_error"}}
TOO_LARGE_400 = {"error": {"code": 400, "message": "the request exceeds the available context size, try increasing "
                           "it", "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 2048}}
DIM = 576


def vector(t: str) -> list[float]:
    seed = int.from_bytes(hashlib.sha256(t.encode()).digest()[:4], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32).tolist()


class LlamaLike:
    """/v1/embeddings that refuses any input containing `marker` with `refusal`, and /v1/rerank that takes
    `rerank_s` seconds; every request counted by path."""

    def __init__(self, marker: str = "", refusal: dict | None = None, rerank_s: float = 0.0):
        self.calls: dict[str, int] = {}

        def respond(path, body, headers):
            self.calls[path] = self.calls.get(path, 0) + 1
            if path == "/v1/embeddings":
                if marker and any(marker in t for t in body["input"]):
                    return refusal["error"]["code"], refusal
                return 200, {"data": [{"index": i, "embedding": vector(t)} for i, t in enumerate(body["input"])]}
            if path == "/v1/rerank":
                time.sleep(rerank_s)
                return 200, {"results": [{"index": i, "relevance_score": 1.0 / (i + 1)}
                                         for i in range(len(body["documents"]))]}
            return 404, {"error": {"code": 404, "message": "no route"}}
        self.stub = JSONStub(respond)
        self.url = self.stub.url


def stub_settings(interactive: str, background: str, **more) -> Settings:
    models = {"embed": {"name": "stub-embed", "dim": DIM}}
    if more.pop("rerank", False):
        models["rerank"] = {"name": "stub-rerank"}
    return Settings(models=models, retry_backoff_s=0, lanes={
        "interactive": {"nodes": {"i0": {"embed": interactive, **({"rerank": interactive} if "rerank" in models
                                                                  else {})}}, "concurrency": 1},
        "background": {"nodes": {"b0": {"embed": background}}, "concurrency": 1}}, **more)


def lanes_down(svc) -> list[str]:
    report = svc.call("GET", "/v5/admin/lanes", "admin").json()
    return sorted("%s/%s" % (lane, node) for lane, v in report["lanes"].items() for node, n in v["nodes"].items()
                  if n["downUntil"])


@pytest.mark.parametrize("refusal", [TOO_LARGE_500, TOO_LARGE_400], ids=["500-batch", "400-context"])
def test_input_too_large_is_the_documents_error_never_a_node_down(lane_service, refusal):
    node = LlamaLike(marker="GIGANTIC", refusal=refusal)
    try:
        svc = lane_service(stub_settings(node.url, node.url, job_max_attempts=3))
        bad = svc.ingest("alice", "A GIGANTIC document the model cannot take.")
        d = svc.call("GET", "/v5/ns/alice/documents/" + bad).json()
        assert d["status"] == "failed" and "too large" in d["error"], d
        assert d["job"]["attempts"] == 1, "a final failure: the same input fails the same way again"
        assert lanes_down(svc) == []
        good = svc.ingest("alice", "A small document right after it.")
        assert svc.call("GET", "/v5/ns/alice/documents/" + good).json()["status"] == "done"
        out = svc.search("alice", "small document")
        assert out["degraded"] == [] and out["served"]["embed"] == "interactive/i0"
    finally:
        node.stub.close()


def test_rerank_past_its_budget_degrades_the_answer_and_marks_no_node_down(lane_service):
    node = LlamaLike(rerank_s=1.5)
    try:
        svc = lane_service(stub_settings(node.url, node.url, rerank=True, rerank_budget_ms=300))
        for t in ("The ferry leaves at 9:40.", "The ferry is blue.", "Ferry tickets cost 60 kronor."):
            svc.remember("alice", t)
        out = svc.search("alice", "ferry", mode="memories", rerank="order")      # the call runs past the budget
        assert "reranker" in out["degraded"] and "interactive/i0" not in out["degraded"], out
        assert lanes_down(svc) == []

        # One search holds the node's only rerank slot; a second must not wait past its own budget for it.
        svc.pipeline.settings.rerank_budget_ms = 5000
        ends = {}

        def slow():
            ends["slow"] = (svc.search("alice", "ferry", mode="memories", rerank="order"), time.monotonic())
        t = threading.Thread(target=slow)
        t.start()
        deadline = time.monotonic() + 30
        while node.calls.get("/v1/rerank", 0) < 2:      # the slow search's rerank is at the node
            assert time.monotonic() < deadline
            time.sleep(0.01)
        svc.pipeline.settings.rerank_budget_ms = 200
        fast = svc.search("alice", "ferry", mode="memories", rerank="order")
        ends["fast"] = time.monotonic()
        t.join()
        assert "reranker" in fast["degraded"] and "interactive/i0" not in fast["degraded"], fast
        assert ends["fast"] < ends["slow"][1], "the second search waited for the first one's slot"
        assert ends["slow"][0]["degraded"] == [] and node.calls["/v1/rerank"] == 2   # the second never called
        assert lanes_down(svc) == []
    finally:
        node.stub.close()


# -- HTTP as clients expect it --------------------------------------------------------------------
@pytest.fixture
def served(make_service):
    """The app under a real uvicorn on 127.0.0.1 (what urllib and requests meet in production)."""
    svc = make_service(max_document_bytes=1_000_000)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(svc.app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.02)
    svc.url = "http://127.0.0.1:%d" % port
    yield svc
    server.should_exit = True
    t.join(timeout=10)


BIG = b'{"content": "' + b"z" * (64 * 1024 * 1024) + b'"}'


def test_a_64_mib_body_gets_a_413_that_urllib_reads(served):
    req = urllib.request.Request(served.url + "/v5/ns/alice/documents", data=BIG, method="POST",
                                 headers={**served.h("alice"), "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=120)
    assert e.value.code == 413
    assert "max_document_bytes" in json.loads(e.value.read())["error"]
    assert served.db.scalar("SELECT count(*) FROM documents") == 0


def test_a_64_mib_body_gets_a_413_that_requests_reads(served):
    r = requests.post(served.url + "/v5/ns/alice/documents", data=BIG, timeout=120,
                      headers={**served.h("alice"), "Content-Type": "application/json"})
    assert r.status_code == 413 and "max_document_bytes" in r.json()["error"]
    # and the server still answers (on a new connection: this one was closed after the 413)
    assert requests.get(served.url + "/healthz", timeout=30).status_code == 200


def nested(depth: int):
    v: object = "leaf"
    for _ in range(depth):
        v = {"k": v}
    return v


def test_json_nesting_past_the_bound_is_a_400(svc):
    r = svc.call("POST", "/v5/ns/alice/memories", json={"content": "ok", "metadata": nested(20)})
    assert r.status_code in (200, 201), r.text
    before = svc.db.scalar("SELECT count(*) FROM memories")
    r = svc.call("POST", "/v5/ns/alice/memories", json={"content": "deep", "metadata": nested(40)})
    assert r.status_code == 400 and "nest" in r.json()["error"], r.text
    deep = b'{"content": "x", "metadata": ' + b'[' * 100000 + b']' * 100000 + b'}'
    r = svc.call("POST", "/v5/ns/alice/documents", content=deep, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert svc.db.scalar("SELECT count(*) FROM memories") == before
    assert svc.db.scalar("SELECT count(*) FROM documents") == 0


@pytest.mark.parametrize("query", ["limit=-1", "limit=0", "limit=1001", "limit=ten", "offset=-1", "offset=x",
                                   "limit=2.5"])
def test_limit_and_offset_outside_their_range_are_400(svc, query):
    svc.ingest("alice", "One document.")
    for route in ("documents", "memories"):
        if route == "memories" and query.startswith("offset"):
            continue    # memories page by cursor
        r = svc.call("GET", "/v5/ns/alice/%s?%s" % (route, query))
        assert r.status_code == 400, (route, query, r.text)
        assert query.split("=")[0] in r.json()["error"]


def test_memories_page_by_cursor_to_the_end(svc):
    made = [svc.remember("alice", "Fact %d: the %s is in room %d." % (i, w, 100 + i))["id"]
            for i, w in enumerate(("kettle", "ladder", "mirror", "anchor", "basket"))]
    seen, cursor, pages = [], None, 0
    while True:
        r = svc.call("GET", "/v5/ns/alice/memories?limit=2" + ("&cursor=" + cursor if cursor else ""))
        assert r.status_code == 200, r.text
        body = r.json()
        seen += [m["id"] for m in body["memories"]]
        pages += 1
        if not (cursor := body["nextCursor"]):
            break
    assert pages == 3 and sorted(seen) == sorted(made) and len(set(seen)) == 5
    assert svc.call("GET", "/v5/ns/alice/memories?cursor=bogus").status_code == 400
