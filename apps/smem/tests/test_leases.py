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


def test_leases_and_lanes_are_admin_only_and_check_their_input(farm):
    svc, _, _ = farm
    for method, path in (("POST", "/v5/admin/leases"), ("GET", "/v5/admin/leases"),
                         ("DELETE", "/v5/admin/leases/lse_0"), ("GET", "/v5/admin/lanes")):
        r = svc.call(method, path, "alice", json={"nodes": ["i0"], "holder": "x", "ttlSeconds": 5})
        assert r.status_code == 403 and r.json() == {"error": "forbidden: this needs an admin token"}
        assert svc.client.request(method, path).status_code == 401
    assert svc.db.scalar("SELECT count(*) FROM leases") == 0
    r = lease(svc, ["i0", "vca-node9"])
    assert r.status_code == 400 and "unknown node(s): vca-node9" in r.json()["error"]
    for bad in ({"nodes": [], "holder": "x", "ttlSeconds": 5}, {"nodes": ["i0"], "holder": "x", "ttlSeconds": 0},
                {"nodes": ["i0"], "ttlSeconds": 5}, {"nodes": ["i0"], "holder": "x", "ttlSeconds": 5, "extra": 1}):
        assert svc.call("POST", "/v5/admin/leases", "admin", json=bad).status_code == 400
    assert svc.db.scalar("SELECT count(*) FROM leases") == 0


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
