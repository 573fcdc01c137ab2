"""Model lanes against real llama-server processes: settings, the pick, concurrency, nodes going down, rerank."""

from __future__ import annotations

import threading
import time

import pytest

from conftest import EMBED_FLAGS, free_port, lane_settings
from smem import config
from smem.config import Settings
from smem.lanes import Lanes, NoNode

SPEC_EXAMPLE = """
[models]
embed  = {name = "smollm2-135m", dim = 576}
chat   = {name = "smollm2-135m-instruct"}
rerank = {name = "qwen3-reranker-0.6b"}

[lanes.interactive]
concurrency = 2
timeout_s = 10.0
[lanes.interactive.nodes]
vca-node0 = {embed = "http://172.31.1.1:8410", rerank = "http://172.31.1.1:8412"}
vca-node1 = {embed = "http://172.31.2.1:8410"}

[lanes.background]
concurrency = 1
timeout_s = 120.0
[lanes.background.nodes]
vca-node4 = {embed = "http://172.31.5.1:8410", chat = "http://172.31.5.1:8411"}
"""


def test_the_spec_settings_load(tmp_path):
    path = tmp_path / "smem.toml"
    path.write_text(SPEC_EXAMPLE)
    s = config.load(str(path))
    lanes = Lanes(s)
    assert lanes.nodes == {"vca-node0", "vca-node1", "vca-node4"}
    assert [x.node for x in lanes.servers["interactive", "embed"]] == ["vca-node0", "vca-node1"]
    assert lanes.has("background", "chat") and not lanes.has("interactive", "chat")
    assert s.lane("background")["concurrency"] == 1 and s.lane("interactive")["timeout_s"] == 10.0


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.replace("timeout_s = 10.0", "timeout = 10.0"), "lanes.interactive: unknown key timeout"),
    (lambda t: t.replace('{embed = "http://172.31.2.1:8410"}', '{embd = "http://172.31.2.1:8410"}'),
     "lanes.interactive.nodes.vca-node1: unknown key embd"),
    (lambda t: t.replace('rerank = {name = "qwen3-reranker-0.6b"}', 'rerank = {name = "q", url = "x"}'),
     "models.rerank: unknown key url"),
    (lambda t: t.replace("[lanes.background]", "[lanes.batch]").replace("lanes.background.nodes", "lanes.batch.nodes"),
     "lanes: unknown key batch"),
    (lambda t: t.replace('embed  = {name = "smollm2-135m", dim = 576}', ""), "[models].embed is required"),
    (lambda t: t.replace('embed  = {name = "smollm2-135m", dim = 576}', 'embed = {name = "e"}'), "dim"),
    (lambda t: t.replace('chat   = {name = "smollm2-135m-instruct"}', ""), "serves chat, but [models] has no chat"),
    (lambda t: t.replace('"http://172.31.2.1:8410"', '"172.31.2.1:8410"'), "an http:// URL"),
    (lambda t: t + "\n[embedder]\nkind = \"http\"\n", "remove [embedder]"),
])
def test_bad_lane_settings_are_clear_errors(tmp_path, change, message):
    path = tmp_path / "smem.toml"
    path.write_text(change(SPEC_EXAMPLE))
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        config.load(str(path))


def test_no_lanes_is_the_embedded_default():
    s = Settings()
    assert s.embedder == {"kind": "local"} and Lanes(s).nodes == set()


def test_calls_wait_for_the_concurrency_limit_and_go_to_the_least_busy_node(llama_embed):
    # Two nodes that are one real server: at most `concurrency` calls in flight on each, spread between them.
    s = lane_settings({"n0": {"embed": llama_embed.url}, "n1": {"embed": llama_embed.url}}, {})
    assert s.lane("interactive")["concurrency"] == 2
    lanes = Lanes(s)
    lock = threading.Lock()
    now, peak, served = {"n0": 0, "n1": 0}, {"n0": 0, "n1": 0}, []

    def fn(server):
        with lock:
            now[server.node] += 1
            peak[server.node] = max(peak[server.node], now[server.node])
        server.post("/v1/embeddings", {"input": ["the ferry leaves at nine"]})
        time.sleep(0.3)
        with lock:
            now[server.node] -= 1
        return server.node

    threads = [threading.Thread(target=lambda: served.append(lanes.call("interactive", "embed", fn).served))
               for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(served) == ["interactive/n0"] * 3 + ["interactive/n1"] * 3
    assert peak == {"n0": 2, "n1": 2}


DOC = "The ferry to Vaxholm leaves at 9:40 from Strandvagen. Tickets are sold on board."


def test_a_killed_interactive_node_is_skipped_and_reported_then_bm25_alone(llama_embed, spawn_llama, lane_service):
    a, b = spawn_llama("i0", *EMBED_FLAGS), spawn_llama("i1", *EMBED_FLAGS)
    a.wait_ready(), b.wait_ready()
    svc = lane_service(lane_settings({"i0": {"embed": a.url}, "i1": {"embed": b.url}},
                                     {"b0": {"embed": llama_embed.url}}))
    svc.ingest("alice", DOC)
    out = svc.search("alice", "boat departure schedule")  # no word in common: only vectors can find it
    assert out["degraded"] == [] and out["served"] == {"embed": "interactive/i0", "rerank": None}
    assert out["results"]

    a.kill()
    out = svc.search("alice", "boat departure schedule")
    assert out["degraded"] == ["interactive/i0"]
    assert out["served"]["embed"] == "interactive/i1"
    assert out["results"] and out["results"][0]["kind"] == "chunk"
    # Marked down: the next search does not try it again, and still says it is down.
    calls = b.metric("n_decode_total")
    out = svc.search("alice", "boat departure schedule")
    assert out["degraded"] == ["interactive/i0"] and out["served"]["embed"] == "interactive/i1"
    assert b.metric("n_decode_total") > calls
    report = svc.call("GET", "/v5/admin/lanes", "admin").json()["lanes"]["interactive"]["nodes"]
    assert report["i0"]["downUntil"] and report["i1"]["downUntil"] is None

    b.kill()
    out = svc.search("alice", "Vaxholm ferry")
    assert out["degraded"] == ["interactive/i0", "interactive/i1", "embedder"]
    assert out["served"]["embed"] is None
    assert "Vaxholm" in out["results"][0]["content"]     # BM25 alone
    assert svc.search("alice", "boat departure schedule")["results"] == []


def test_ingest_borrows_the_interactive_lane_for_embeddings_and_fails_with_the_reason_when_none(
        llama_embed, lane_service):
    svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url}}, {}))
    doc = svc.ingest("alice", DOC)
    assert svc.call("GET", "/v5/ns/alice/documents/" + doc).json()["status"] == "done"

    dead = "http://127.0.0.1:%d" % free_port()
    # Nodes down are the lane's fault, not the document's: no attempt spent; failed once that outlasts
    # transient_retry_s (0 here: at the first fault).
    svc = lane_service(lane_settings({"i0": {"embed": dead}}, {"b0": {"embed": dead}}, transient_retry_s=0),
                       svc.path.with_name("other.db"))
    doc = svc.ingest("alice", DOC)
    d = svc.call("GET", "/v5/ns/alice/documents/" + doc).json()
    assert d["status"] == "failed" and d["job"]["attempts"] == 0 and "the lane's nodes failed for" in d["error"]
    assert "no embed node in the background lane could answer" in d["error"]
    assert "no embed node in the interactive lane could answer" in d["error"]


def test_rerank_on_the_interactive_lane_within_its_budget(llama_embed, spawn_llama, lane_service):
    # SmolLM2 has no ranking head: llama-server --reranking still answers /v1/rerank (with meaningless scores),
    # which is enough to see the request and the reordering work end to end.
    rr = spawn_llama("rerank", "--reranking").wait_ready()
    svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url, "rerank": rr.url}},
                                     {"b0": {"embed": llama_embed.url}}, rerank=True, rerank_top_k=3))
    for i, text in enumerate(["The ferry leaves at 9:40.", "The ferry is blue.", "Ferry tickets cost 60 kronor.",
                              "The ferry has a cafe.", "Gulls follow the ferry."]):
        svc.remember("alice", text, validAt="2024-01-0%d" % (i + 1))
    plain = svc.search("alice", "ferry", mode="memories", rerank="none")
    out = svc.search("alice", "ferry", mode="memories", rerank="order")
    assert out["degraded"] == [] and out["served"] == {"embed": "interactive/i0", "rerank": "interactive/i0"}
    top = out["results"][:3]
    assert all("rerankScore" in r for r in top) and all("rerankScore" not in r for r in out["results"][3:])
    assert [r["rerankScore"] for r in top] == sorted((r["rerankScore"] for r in top), reverse=True)
    assert {r["id"] for r in top} == {r["id"] for r in plain["results"][:3]}    # only the fused top k
    assert [r["id"] for r in out["results"][3:]] == [r["id"] for r in plain["results"][3:]]

    svc.pipeline.settings.rerank_budget_ms = 0.01   # over budget: unreranked, and said so
    out = svc.search("alice", "ferry", mode="memories", rerank="order")
    assert "reranker" in out["degraded"] and out["served"]["rerank"] is None
    assert [r["id"] for r in out["results"]] == [r["id"] for r in plain["results"]]
    assert all("rerankScore" not in r for r in out["results"])


def test_rerank_configured_but_down_and_not_configured(llama_embed, lane_service):
    dead = "http://127.0.0.1:%d" % free_port()
    svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url, "rerank": dead}},
                                     {"b0": {"embed": llama_embed.url}}, rerank=True))
    svc.remember("alice", "The ferry leaves at 9:40.")
    out = svc.search("alice", "ferry", rerank="order")
    assert out["degraded"] == ["interactive/i0", "reranker"]
    assert out["served"] == {"embed": "interactive/i0", "rerank": None} and out["results"]

    svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url}}, {}), svc.path.with_name("b.db"))
    svc.remember("alice", "The ferry leaves at 9:40.")
    out = svc.search("alice", "ferry", rerank="order")
    assert out["degraded"] == ["reranker"] and out["served"]["rerank"] is None and out["results"]


def test_no_node_left_is_a_clear_error(llama_embed):
    lanes = Lanes(lane_settings({"i0": {"embed": "http://127.0.0.1:%d" % free_port()}}, {}))
    with pytest.raises(NoNode, match="no embed node in the interactive lane") as e:
        lanes.call("interactive", "embed", lambda s: s.post("/v1/embeddings", {"input": ["x"]}))
    assert e.value.down == ["interactive/i0"]
    with pytest.raises(NoNode, match="none configured"):
        lanes.call("background", "chat", lambda s: None)
