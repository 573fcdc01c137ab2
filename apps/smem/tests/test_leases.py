"""Leases against real llama-server processes: drain, routing around a leased node, release, expiry, restart.
Which node got a call is asked of the llama-server itself (its n_decode_total counter)."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from conftest import EMBED_FLAGS, LlamaServer, lane_settings
from smem.lanes import Lanes, NoNode
from smem.leases import Leases
from smem.service import open_db


@pytest.fixture(scope="module")
def spare(llama_logs):
    s = LlamaServer(llama_logs, "i1", *EMBED_FLAGS).wait_ready()
    yield s
    s.kill()


@pytest.fixture
def farm(llama_embed, llama_chat, spare, lane_service):
    settings = lane_settings({"i0": {"embed": llama_embed.url}, "i1": {"embed": spare.url}},
                             {"b0": {"embed": llama_embed.url, "chat": llama_chat.url}}, chat=True)
    return lane_service(settings), settings, spare


def lease(svc, nodes, ttl=60, who="admin"):
    return svc.call("POST", "/v5/admin/leases", who, json={"nodes": nodes, "holder": "render", "ttlSeconds": ttl})


def long_chat(server, finished: dict | None = None):
    # ~100 generated tokens: seconds of work in flight on the chat server.
    answer = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Count to one hundred."}],
                                                  "max_tokens": 100, "ignore_eos": True})
    if finished is not None:
        finished["at"] = time.monotonic()
    return answer


def test_a_lease_drains_its_nodes_and_routes_around_them(farm, llama_embed, llama_chat, lane_service):
    svc, settings, spare = farm
    lanes = svc.app.state.lanes
    svc.remember("alice", "The ferry to Vaxholm leaves at 9:40.")  # no extraction: no chat call

    # A call in flight on b0's chat server when the lease comes.
    done = {}
    t = threading.Thread(target=lambda: done.update(answer=lanes.call("background", "chat",
                                                                      lambda s: long_chat(s, done))))
    t.start()
    deadline = time.monotonic() + 60
    while llama_chat.metric("requests_processing") < 1:
        assert time.monotonic() < deadline and t.is_alive(), "the chat call never got to the server"
        time.sleep(0.05)
    r = lease(svc, ["b0", "i0"])
    answered = time.monotonic()
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["drained"] is True and body["nodes"] == ["b0", "i0"] and body["holder"] == "render"
    t.join()
    assert done["at"] <= answered and done["answer"].served == "background/b0"   # it finished, not cut off
    assert done["answer"].value["choices"][0]["message"]["content"]

    # No new call goes to a leased node: the servers say so.
    chat_work, embed_work, spare_work = (s.metric("n_decode_total") for s in (llama_chat, llama_embed, spare))
    with pytest.raises(NoNode):
        lanes.call("background", "chat", long_chat)
    out = svc.search("alice", "ferry")
    assert out["served"]["embed"] == "interactive/i1" and out["degraded"] == []
    assert llama_chat.metric("n_decode_total") == chat_work
    assert llama_embed.metric("n_decode_total") == embed_work
    assert spare.metric("n_decode_total") > spare_work

    assert [x["id"] for x in svc.call("GET", "/v5/admin/leases", "admin").json()["leases"]] == [body["id"]]
    report = svc.call("GET", "/v5/admin/lanes", "admin").json()["lanes"]
    assert report["background"]["nodes"]["b0"]["leasedBy"]["id"] == body["id"]
    assert report["interactive"]["nodes"]["i1"]["leasedBy"] is None
    assert report["interactive"]["nodes"]["i0"]["models"]["embed"]["url"] == llama_embed.url
    assert lease(svc, ["i0"]).status_code == 409

    # A restarted smem honours the lease: the new process's lanes skip the leased nodes too.
    again = lane_service(settings, svc.path)
    assert again.search("alice", "ferry")["served"]["embed"] == "interactive/i1"
    assert llama_embed.metric("n_decode_total") == embed_work

    r = again.call("DELETE", "/v5/admin/leases/" + body["id"], "admin")
    assert r.status_code == 200 and r.json()["released"] is True
    assert again.search("alice", "ferry")["served"]["embed"] == "interactive/i0"   # back in the lane
    assert llama_embed.metric("n_decode_total") > embed_work
    assert again.call("GET", "/v5/admin/leases", "admin").json()["leases"] == []
    assert again.call("DELETE", "/v5/admin/leases/" + body["id"], "admin").status_code == 404


def test_an_expired_lease_gives_its_node_back_by_itself(farm):
    svc, _, _ = farm
    svc.remember("alice", "The ferry to Vaxholm leaves at 9:40.")  # no extraction: no chat call
    r = lease(svc, ["i0"], ttl=3)
    assert r.status_code == 201
    assert svc.search("alice", "ferry")["served"]["embed"] == "interactive/i1"
    expires = datetime.fromisoformat(r.json()["expiresAt"].replace("Z", "+00:00"))
    time.sleep(max(0.0, (expires - datetime.now(UTC)).total_seconds()) + 0.1)
    assert svc.search("alice", "ferry")["served"]["embed"] == "interactive/i0"
    assert svc.call("GET", "/v5/admin/leases", "admin").json()["leases"] == []
    assert lease(svc, ["i0"]).status_code == 201      # an expired lease does not block a new one


def test_leases_need_the_lease_scope_and_lanes_an_admin_and_check_their_input(farm):
    svc, _, _ = farm
    for method, path, needs in (("POST", "/v5/admin/leases", "lease"), ("GET", "/v5/admin/leases", "lease"),
                                ("DELETE", "/v5/admin/leases/lse_0", "lease"),
                                ("PATCH", "/v5/admin/leases/lse_0", "lease"), ("GET", "/v5/admin/lanes", "admin")):
        r = svc.call(method, path, "alice", json={"nodes": ["i0"], "holder": "x", "ttlSeconds": 5})
        assert r.status_code == 403 and r.json() == {"error": "forbidden: this needs an admin token" if needs == "admin"
                                                     else "forbidden: this needs a token with the lease scope"}
        assert svc.client.request(method, path).status_code == 401
    assert svc.db.scalar("SELECT count(*) FROM leases") == 0
    r = lease(svc, ["i0", "vca-node9"])
    assert r.status_code == 400 and "unknown node(s): vca-node9" in r.json()["error"]
    for bad in ({"nodes": [], "holder": "x", "ttlSeconds": 5}, {"nodes": ["i0"], "holder": "x", "ttlSeconds": 0},
                {"nodes": ["i0"], "ttlSeconds": 5}, {"nodes": ["i0"], "holder": "x", "ttlSeconds": 5, "extra": 1}):
        assert svc.call("POST", "/v5/admin/leases", "admin", json=bad).status_code == 400
    assert svc.db.scalar("SELECT count(*) FROM leases") == 0


def renew(svc, lease_id, who="admin", **kw):
    return svc.call("PATCH", "/v5/admin/leases/" + lease_id, who, **kw)


def epoch(t: str) -> float:
    return datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()


def sleep_past(expires_at: str) -> None:
    time.sleep(max(0.0, epoch(expires_at) - time.time()) + 0.1)


def test_a_renewed_lease_keeps_its_id_and_nodes_and_outlives_its_first_expiry(farm, lane_service):
    svc, settings, _ = farm
    svc.remember("alice", "The ferry to Vaxholm leaves at 9:40.")  # no extraction: no chat call
    first = lease(svc, ["i0"], ttl=2).json()
    before = time.time()
    r = renew(svc, first["id"], json={"ttlSeconds": 60})
    after = time.time()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body == svc.call("GET", "/v5/admin/leases", "admin").json()["leases"][0]   # the lease as GET shows it
    assert {k: body[k] for k in ("id", "nodes", "holder", "createdAt")} == \
        {k: first[k] for k in ("id", "nodes", "holder", "createdAt")}
    assert body["expiresAt"] > first["expiresAt"]
    assert before + 60 - 0.01 <= epoch(body["expiresAt"]) <= after + 60 + 0.01   # now + ttl

    sleep_past(first["expiresAt"])    # the first expiry has passed: the node stays lent, to the same lease
    assert svc.search("alice", "ferry")["served"]["embed"] == "interactive/i1"
    assert svc.call("GET", "/v5/admin/leases", "admin").json()["leases"] == [body]
    assert svc.call("GET", "/v5/admin/lanes", "admin").json()["lanes"]["interactive"]["nodes"]["i0"]["leasedBy"] \
        == {k: body[k] for k in ("id", "holder", "expiresAt")}
    assert lease(svc, ["i0"]).status_code == 409
    again = lane_service(settings, svc.path)    # the database holds the new expiry: a restart honours it
    assert again.search("alice", "ferry")["served"]["embed"] == "interactive/i1"


def test_an_expired_or_released_lease_cannot_be_renewed(farm):
    svc, _, _ = farm
    svc.remember("alice", "The ferry to Vaxholm leaves at 9:40.")  # no extraction: no chat call
    old = lease(svc, ["i0"], ttl=1).json()
    sleep_past(old["expiresAt"])
    r = renew(svc, old["id"], json={"ttlSeconds": 60})
    assert r.status_code == 404 and r.json() == {"error": "no live lease %s" % old["id"]}
    assert svc.call("GET", "/v5/admin/leases", "admin").json()["leases"] == []
    assert svc.search("alice", "ferry")["served"]["embed"] == "interactive/i0"    # not revived in the lanes
    assert svc.db.scalar("SELECT expires_at FROM leases WHERE id=?", (old["id"],)) == old["expiresAt"]

    new = lease(svc, ["i0"]).json()              # its node lent again: the old lease still stays dead
    assert renew(svc, old["id"], json={"ttlSeconds": 60}).status_code == 404
    assert svc.call("GET", "/v5/admin/leases", "admin").json()["leases"] == \
        [{k: v for k, v in new.items() if k != "drained"}]
    assert svc.call("DELETE", "/v5/admin/leases/" + new["id"], "admin").status_code == 200
    assert renew(svc, new["id"], json={"ttlSeconds": 60}).status_code == 404    # released
    assert renew(svc, "lse_unknown", json={"ttlSeconds": 60}).status_code == 404
    assert svc.call("GET", "/v5/admin/leases", "admin").json()["leases"] == []


def test_renew_checks_its_body(farm):
    svc, _, _ = farm
    made = lease(svc, ["i0"]).json()
    for bad in ({"ttlSeconds": 0}, {"ttlSeconds": -5}, {"ttlSeconds": "60"}, {"ttlSeconds": None},
                {"ttlSeconds": 30 * 86400 + 1}, {}, {"ttlSeconds": 5, "holder": "x"}, [5], 5):
        r = renew(svc, made["id"], json=bad)
        assert r.status_code == 400 and r.json()["error"], (bad, r.text)
    assert renew(svc, made["id"], content=b"{ttlSeconds: 5").status_code == 400
    assert svc.call("GET", "/v5/admin/leases", "admin").json()["leases"][0]["expiresAt"] == made["expiresAt"]


def test_renew_needs_the_lease_scope(farm):
    svc, _, _ = farm
    made = lease(svc, ["i0"]).json()
    assert svc.client.patch("/v5/admin/leases/" + made["id"], json={"ttlSeconds": 5}).status_code == 401
    assert svc.client.patch("/v5/admin/leases/" + made["id"], json={"ttlSeconds": 5},
                            headers={"Authorization": "Bearer smem_wrong"}).status_code == 401
    r = renew(svc, made["id"], "alice", json={"ttlSeconds": 5})
    assert r.status_code == 403 and r.json() == {"error": "forbidden: this needs a token with the lease scope"}
    assert svc.call("GET", "/v5/admin/leases", "admin").json()["leases"][0]["expiresAt"] == made["expiresAt"]


def test_a_lease_is_kept_in_the_database(tmp_path):
    s = lane_settings({"i0": {"embed": "http://127.0.0.1:9"}}, {})
    db = open_db(str(tmp_path / "s.db"), s)
    made = Leases(db, Lanes(s)).create(["i0"], "render", 60)
    assert made["drained"] is True
    fresh = Lanes(s)
    Leases(db, fresh)   # as at a start
    assert fresh.report()["interactive"]["nodes"]["i0"]["leasedBy"]["id"] == made["id"]


def test_ingest_waits_for_a_leased_lane_and_spends_no_attempt(llama_embed, llama_chat, spare, lane_service):
    settings = lane_settings({"i0": {"embed": spare.url}}, {"b0": {"embed": llama_embed.url, "chat": llama_chat.url}},
                             chat=True, lease_wait_s=1)
    svc = lane_service(settings)
    r = lease(svc, ["b0"])
    assert r.status_code == 201
    doc_id = svc.ingest("alice", "Maria moved to Lisbon in March 2024.")   # runs what is due: the job waits
    doc = svc.call("GET", "/v5/ns/alice/documents/" + doc_id).json()
    assert doc["status"] != "done" and doc["job"]["state"] == "queued" and doc["job"]["attempts"] == 0, doc
    assert "leased: b0" in doc["job"]["stages"]["waiting"]["reason"]
    assert svc.call("DELETE", "/v5/admin/leases/" + r.json()["id"], "admin").status_code == 200
    time.sleep(1.1)
    svc.pipeline.run_until_idle()
    doc = svc.call("GET", "/v5/ns/alice/documents/" + doc_id).json()
    assert doc["status"] == "done" and doc["job"]["attempts"] == 0, doc
