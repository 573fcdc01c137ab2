"""/v3 and /v4 (Supermemory's shapes) onto the v5 handlers: same scopes, same 403, same bad-input rules."""

from __future__ import annotations

import pytest

from smem.api import FORBIDDEN


def test_v3_documents_lands_in_the_container_tags_namespace(svc):
    r = svc.call("POST", "/v3/documents", json={"content": "The ferry to Vaxholm leaves at 9:40.",
                                                "containerTags": ["alice"], "customId": "ferry",
                                                "metadata": {"src": "sdk"}})
    assert r.status_code == 202 and r.json()["status"] == "queued"
    doc = r.json()["id"]
    svc.pipeline.run_until_idle()
    d = svc.call("GET", "/v5/ns/alice/documents/" + doc).json()
    assert (d["status"], d["customId"], d["metadata"]) == ("done", "ferry", {"src": "sdk"})
    # The same customId replaces it, as in v5.
    r = svc.call("POST", "/v3/documents", json={"content": "The ferry now leaves at 10:15.",
                                                "containerTags": ["alice"], "customId": "ferry"})
    assert r.json()["id"] == doc
    assert svc.call("GET", "/v5/ns/bob/documents", "bob").json()["total"] == 0


def test_v3_and_v4_search_answer_as_v5_does(svc):
    svc.ingest("alice", "The ferry to Vaxholm leaves at 9:40.")
    svc.remember("alice", "Ann takes the Vaxholm ferry on Mondays.")
    v3 = svc.call("POST", "/v3/search", json={"q": "Vaxholm ferry", "containerTags": ["alice"], "limit": 5})
    assert v3.status_code == 200
    assert [r["kind"] for r in v3.json()["results"]] == ["chunk"]            # v3: documents (chunks)
    assert v3.json()["results"] == svc.search("alice", "Vaxholm ferry", mode="chunks", limit=5)["results"]
    v4 = svc.call("POST", "/v4/search", json={"q": "Vaxholm ferry", "containerTag": "alice", "limit": 5})
    assert v4.status_code == 200 and [r["kind"] for r in v4.json()["results"]] == ["memory"]   # v4: memories
    hybrid = svc.call("POST", "/v4/search", json={"q": "Vaxholm ferry", "containerTag": "alice", "mode": "hybrid"})
    assert {r["kind"] for r in hybrid.json()["results"]} == {"chunk", "memory"}
    rr = svc.call("POST", "/v4/search", json={"q": "ferry", "containerTag": "alice", "rerank": True})
    assert rr.json()["degraded"] == ["reranker"]
    admin = svc.call("POST", "/v4/search", "admin", json={"q": "ferry", "containerTag": "alice"})
    assert admin.status_code == 200 and admin.json()["results"]


@pytest.mark.parametrize(("path", "body"), [
    ("/v3/documents", {"content": "x", "containerTags": ["bob"]}),
    ("/v3/search", {"q": "x", "containerTags": ["bob"]}),
    ("/v4/search", {"q": "x", "containerTag": "bob"}),
    ("/v4/search", {"q": "x", "containerTag": "nobody-has-this"}),
])
def test_another_namespaces_container_tag_is_403(svc, path, body):
    r = svc.call("POST", path, "alice", json=body)
    assert r.status_code == 403 and r.json() == {"error": FORBIDDEN}
    assert svc.client.post(path, json=body).status_code == 401
    assert svc.db.scalar("SELECT count(*) FROM documents") == 0


@pytest.mark.parametrize(("path", "body", "message"), [
    ("/v3/documents", {"content": "x", "containerTags": []}, "exactly one container tag"),
    ("/v3/documents", {"content": "x", "containerTags": ["alice", "bob"]}, "exactly one container tag"),
    ("/v3/documents", {"content": "x"}, "'containerTags' is a required property"),
    ("/v3/documents", {"content": "x", "containerTags": "alice"}, "is not of type 'array'"),
    ("/v3/documents", {"content": "x", "containerTags": ["alice"], "validAt": "2024-01-01"}, "Additional properties"),
    ("/v3/documents", {"content": "  ", "containerTags": ["alice"]}, "content is empty"),
    ("/v3/search", {"q": "x", "containerTags": ["alice", "alice"]}, "exactly one container tag"),
    ("/v3/search", {"q": "x", "containerTag": "alice"}, "Additional properties"),
    ("/v3/search", {"q": "", "containerTags": ["alice"]}, "should be non-empty"),
    ("/v4/search", {"q": "x", "containerTags": ["alice"]}, "Additional properties"),
    ("/v4/search", {"q": "x", "containerTag": ["alice"]}, "is not of type 'string'"),
    ("/v4/search", {"q": "x", "containerTag": "alice", "limit": 0}, "less than the minimum"),
    ("/v4/search", {"q": "x", "containerTag": "alice", "rerank": "yes"}, "is not one of"),
])
def test_bad_compat_input_is_400_and_changes_nothing(svc, path, body, message):
    r = svc.call("POST", path, "alice", json=body)
    assert r.status_code == 400 and message in r.json()["error"], r.text
    assert svc.db.scalar("SELECT count(*) FROM documents") == 0


def test_malformed_json_is_400(svc):
    r = svc.call("POST", "/v3/documents", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("malformed JSON")
