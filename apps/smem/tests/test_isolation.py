"""A token sees its namespaces only: no route, search included, gives out another namespace's data."""

from __future__ import annotations

import json

SECRET = "Bob's vault combination is 77-31-05 and it sits behind the painting."


def seed(svc):
    bob_doc = svc.ingest("bob", SECRET)
    bob_mem = svc.remember("bob", SECRET)
    svc.ingest("alice", "Alice keeps notes about vaults and paintings too.")
    svc.remember("alice", "Alice's vault is empty.")
    return bob_doc, bob_mem["id"]


ROUTES = [("GET", "/v5/ns/{ns}/documents", None), ("POST", "/v5/ns/{ns}/documents", {"content": "x"}),
          ("GET", "/v5/ns/{ns}/documents/{doc}", None), ("DELETE", "/v5/ns/{ns}/documents/{doc}", None),
          ("POST", "/v5/ns/{ns}/search", {"q": "vault combination"}),
          ("POST", "/v5/ns/{ns}/memories", {"content": "y"}), ("GET", "/v5/ns/{ns}/memories", None),
          ("POST", "/v5/ns/{ns}/forget", {"content": SECRET}), ("GET", "/v5/ns/{ns}/profile", None)]


def test_other_namespace_is_403_and_the_same_as_one_that_does_not_exist(svc):
    bob_doc, _ = seed(svc)
    before = svc.db.scalar("SELECT count(*) FROM documents"), svc.db.scalar("SELECT count(*) FROM memories")
    for method, path, body in ROUTES:
        answers = []
        for ns in ("bob", "nobody-here"):
            r = svc.call(method, path.format(ns=ns, doc=bob_doc), "alice", json=body)
            answers.append((r.status_code, r.content))
        assert answers[0] == answers[1], path
        assert answers[0][0] == 403, path
        assert b"77-31-05" not in answers[0][1] and bob_doc.encode() not in answers[0][1]
    after = svc.db.scalar("SELECT count(*) FROM documents"), svc.db.scalar("SELECT count(*) FROM memories")
    assert after == before


def test_own_namespace_routes_never_carry_bobs_data(svc):
    bob_doc, bob_mem = seed(svc)
    seen = []
    for mode in ("hybrid", "memories", "chunks"):
        for q in ("vault combination 77-31-05", SECRET, "painting"):
            seen.append(svc.search("alice", q, mode=mode, limit=100))
            seen.append(svc.search("alice", q, mode=mode, limit=100, asOf="2999-01-01"))
    seen.append(svc.call("GET", "/v5/ns/alice/documents").json())
    seen.append(svc.call("GET", "/v5/ns/alice/memories").json())
    seen.append(svc.call("GET", "/v5/ns/alice/profile").json())
    seen.append(svc.call("GET", "/v5/namespaces").json())
    blob = json.dumps(seen)
    assert "77-31-05" not in blob and bob_doc not in blob and bob_mem not in blob and '"bob"' not in blob
    assert any(r["results"] for r in seen[:18])                  # alice's own data does come back
    # Bob's ids named under alice's namespace: not found, and nothing changed for bob.
    assert svc.call("GET", "/v5/ns/alice/documents/" + bob_doc).status_code == 404
    assert svc.call("DELETE", "/v5/ns/alice/documents/" + bob_doc).status_code == 404
    assert svc.call("POST", "/v5/ns/alice/forget", json={"id": bob_mem}).status_code == 404
    assert svc.call("POST", "/v5/ns/alice/forget", json={"content": SECRET}).json()["forgotten"] == []
    r = svc.call("POST", "/v5/ns/alice/memories", json={"content": "Alice's guess.", "supersedes": bob_mem})
    assert r.status_code == 404
    assert svc.search("bob", "vault combination", mode="memories")["results"][0]["id"] == bob_mem
    assert svc.call("GET", "/v5/ns/bob/documents/" + bob_doc, "bob").json()["status"] == "done"


def test_a_token_for_two_namespaces_reaches_both(svc):
    seed(svc)
    assert svc.call("GET", "/v5/ns/bob/profile", "both").status_code == 200
    assert svc.call("GET", "/v5/ns/alice/profile", "both").status_code == 200
