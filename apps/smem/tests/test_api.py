"""The v5 routes, one behaviour each."""

from __future__ import annotations


def test_healthz_needs_no_token_and_the_rest_does(svc):
    assert svc.client.get("/healthz").json()["ok"] is True
    assert svc.client.get("/v5/namespaces").status_code == 401
    r = svc.client.get("/v5/namespaces", headers={"Authorization": "Bearer smem_not-a-token"})
    assert r.status_code == 401 and r.json()["error"]


def test_documents_list_get_delete(svc):
    a = svc.ingest("alice", "First document about kayaks.")
    b = svc.ingest("alice", "Second document about canoes.", metadata={"src": "t"})
    listed = svc.call("GET", "/v5/ns/alice/documents").json()
    assert [d["id"] for d in listed["documents"]] == [a, b] and listed["total"] == 2
    assert svc.call("GET", "/v5/ns/alice/documents/" + b).json()["metadata"] == {"src": "t"}
    assert svc.call("DELETE", "/v5/ns/alice/documents/" + a).json() == {"id": a, "deleted": True, "factsRetired": 0,
                                                                        "erased": False}
    assert svc.call("GET", "/v5/ns/alice/documents/" + a).status_code == 404
    assert all("kayaks" not in r["content"] for r in svc.search("alice", "kayaks")["results"])
    assert svc.db.scalar("SELECT count(*) FROM chunks_fts") == 1
    assert svc.db.scalar("SELECT count(*) FROM vec_chunks") == 1


def test_supersede_closes_the_old_fact_and_keeps_its_history(svc):
    old = svc.remember("alice", "Ann works at Acme.", validAt="2021-01-01")
    r = svc.call("POST", "/v5/ns/alice/memories", json={"content": "Ann works at Globex.", "validAt": "2024-02-01",
                                                        "supersedes": old["id"]})
    assert r.status_code == 201
    new = r.json()
    assert new["supersedes"] == old["id"]
    current = svc.call("GET", "/v5/ns/alice/memories?history=1").json()["memories"]
    assert [m["id"] for m in current] == [new["id"]]
    past = svc.call("GET", "/v5/ns/alice/memories", params={"asOf": "2022-01-01", "history": "1"}).json()
    (o,) = past["memories"]
    assert o["id"] == old["id"] and o["validTo"] == "2024-02-01T00:00:00.000000Z" and o["expiredAt"]
    assert [(h["event"], h["otherId"]) for h in o["history"]] == [("created", None), ("superseded", new["id"])]
    assert svc.db.scalar("SELECT count(*) FROM memories") == 2     # nothing deleted
    again = svc.call("POST", "/v5/ns/alice/memories", json={"content": "Ann works at Initech.",
                                                            "supersedes": old["id"]})
    assert again.status_code == 409


def test_duplicate_fact_is_not_stored_twice(svc):
    a = svc.remember("alice", "Ann likes tea.")
    b = svc.call("POST", "/v5/ns/alice/memories", json={"content": "  ann LIKES tea. "})
    assert b.status_code == 200 and b.json()["id"] == a["id"] and b.json()["duplicate"] is True
    assert svc.db.scalar("SELECT count(*) FROM memories") == 1


def test_forget_dry_run_changes_nothing_then_forget_does(svc):
    m = svc.remember("alice", "Ann's password hint is 'blue'.")
    before = svc.search("alice", "password hint", mode="memories")["results"]
    dry = svc.call("POST", "/v5/ns/alice/forget", json={"content": "ann's password hint is 'blue'.", "dryRun": True})
    assert dry.status_code == 200 and [f["id"] for f in dry.json()["forgotten"]] == [m["id"]]
    assert svc.search("alice", "password hint", mode="memories")["results"] == before
    assert svc.db.scalar("SELECT forgotten_at FROM memories") is None
    real = svc.call("POST", "/v5/ns/alice/forget", json={"content": "Ann's password hint is 'blue'."})
    assert [f["id"] for f in real.json()["forgotten"]] == [m["id"]]
    assert svc.search("alice", "password hint", mode="memories")["results"] == []
    assert svc.call("POST", "/v5/ns/alice/forget", json={"id": m["id"]}).status_code == 404


def test_profile_and_namespaces(svc):
    svc.ingest("alice", "A document.")
    svc.remember("alice", "Ann has a dog.")
    svc.remember("bob", "Bob has a cat.")
    p = svc.call("GET", "/v5/ns/alice/profile").json()
    assert p["documents"] == {"done": 1} and p["chunks"] == 1 and p["memories"]["current"] == 1
    assert [f["content"] for f in p["newestFacts"]] == ["Ann has a dog."]
    mine = svc.call("GET", "/v5/namespaces").json()["namespaces"]
    assert [n["name"] for n in mine] == ["alice"]
    everyone = svc.call("GET", "/v5/namespaces", "admin").json()["namespaces"]
    assert [(n["name"], n["memories"]) for n in everyone] == [("alice", 1), ("bob", 1)]
