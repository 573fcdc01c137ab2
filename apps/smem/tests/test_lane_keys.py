"""Each lane node's API key (lane_keys_file): sent on every call to that node and only to it, a wrong one
said plainly, a bad file refused at start. Stubs on 127.0.0.1 that answer as llama-server --api-key-file
does, and one real llama-server started with --api-key-file."""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from conftest import EMBED_FLAGS, lane_settings
from smem import cli, config
from smem.embed import EmbedderError
from smem.lanes import LaneChat, LaneEmbedder, LaneReranker, Lanes, NoNode
from smem.service import Busy

DIM = 576   # lane_settings' embedding model
KEY_A, KEY_B = "kA9xQ2mZ7pL4vR8sT1wY6nB3cD5fG0hJ", "kB0yW3nX8qM5uS9tV2zA7oC4dE6gH1iK"
INVALID = {"error": {"message": "Invalid API Key", "type": "authentication_error", "code": 401}}


class KeyedLlama:
    """Answers as llama-server with --api-key-file: 401 (its JSON) unless Authorization is "Bearer KEY",
    /health public. key None: a server that takes no key. echo: a 401 that repeats the header it got
    (llama-server never does; a server that did must not get the key into smem's errors).
    .seen: (path, the Authorization header or None) of every request."""

    def __init__(self, key: str | None, echo: bool = False):
        self.key, self.echo, self.seen = key, echo, []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self, status: int, body: dict) -> None:
                out = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def do_GET(self):
                stub.seen.append((self.path, self.headers.get("Authorization")))
                if self.path == "/health":
                    self.answer(200, {"status": "ok"})
                elif stub.authorised(self.headers):
                    self.answer(404, {"error": {"message": "File Not Found", "code": 404}})
                else:
                    self.answer(401, stub.invalid(self.headers))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.seen.append((self.path, self.headers.get("Authorization")))
                if not stub.authorised(self.headers):
                    self.answer(401, stub.invalid(self.headers))
                else:
                    self.answer(200, stub.respond(self.path, body))

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def authorised(self, headers) -> bool:
        return self.key is None or headers.get("Authorization") == "Bearer " + self.key

    def invalid(self, headers) -> dict:
        if self.echo:
            return {"error": {**INVALID["error"], "message": "Invalid API Key: %s" % headers.get("Authorization")}}
        return INVALID

    @staticmethod
    def respond(path: str, body: dict) -> dict:
        if path == "/v1/embeddings":
            return {"data": [{"index": i, "embedding": [1.0 + i] + [0.5] * (DIM - 1)}
                             for i in range(len(body["input"]))]}
        if path == "/v1/rerank":
            return {"results": [{"index": i, "relevance_score": float(-i)} for i in range(len(body["documents"]))]}
        if path == "/v1/chat/completions":
            return {"choices": [{"message": {"content": '{"facts": []}'}, "finish_reason": "stop"}]}
        raise AssertionError(path)

    def auth(self, path: str | None = None) -> list:
        return [a for p, a in self.seen if path is None or p == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def keyed():
    made = []

    def make(key, **kw) -> KeyedLlama:
        made.append(KeyedLlama(key, **kw))
        return made[-1]
    yield make
    for s in made:
        s.close()


@pytest.fixture
def keys_file(tmp_path):
    def write(keys) -> str:
        path = tmp_path / "lane-keys.json"
        path.write_text(keys if isinstance(keys, str) else json.dumps(keys))
        return str(path)
    return write


def test_the_stub_answers_as_llama_server_does(keyed):
    s = keyed(KEY_A)
    assert httpx.get(s.url + "/health").status_code == 200
    r = httpx.post(s.url + "/v1/embeddings", json={"input": ["x"]})
    assert r.status_code == 401 and r.json() == INVALID
    r = httpx.post(s.url + "/v1/embeddings", json={"input": ["x"]}, headers={"Authorization": "Bearer " + KEY_A})
    assert r.status_code == 200


def test_every_call_to_a_node_carries_that_nodes_key_and_only_its(keyed, keys_file):
    n0, n1, n2 = keyed(KEY_A), keyed(KEY_B), keyed(None)
    s = lane_settings({"n0": {"embed": n0.url, "rerank": n0.url}, "n2": {"embed": n2.url}},
                      {"n1": {"embed": n1.url, "chat": n1.url}}, chat=True, rerank=True,
                      lane_keys_file=keys_file({"n0": KEY_A, "n1": KEY_B}))
    lanes = Lanes(s)
    search = LaneEmbedder(lanes, s.model("embed"), "interactive")
    assert search.embed_answer(["the ferry"]).served == "interactive/n0"
    rr = LaneReranker(lanes, s.model("rerank")).rerank("ferry", ["a", "b"], budget_s=10)
    assert rr.served == "interactive/n0" and rr.value == [0.0, -1.0]
    ingest = LaneEmbedder(lanes, s.model("embed"), "background")
    assert ingest.embed_answer(["a chunk"]).served == "background/n1"
    text, _ = LaneChat(lanes, s.model("chat"), 64).complete([{"role": "user", "content": "x"}], {"type": "object"})
    assert text == '{"facts": []}'
    lanes.lease(["n0"], {"id": "l1", "holder": "test", "expiresAt": "-", "until": time.time() + 60})
    assert search.embed_answer(["the ferry"]).served == "interactive/n2"

    assert n0.seen == [("/v1/embeddings", "Bearer " + KEY_A), ("/v1/rerank", "Bearer " + KEY_A)]
    assert n1.seen == [("/v1/embeddings", "Bearer " + KEY_B), ("/v1/chat/completions", "Bearer " + KEY_B)]
    assert n2.seen == [("/v1/embeddings", None)]      # not in the file: no header at all


def test_the_service_sends_the_keys_and_never_shows_them(keyed, keys_file, lane_service):
    n0 = keyed(KEY_A)
    svc = lane_service(lane_settings({"n0": {"embed": n0.url}}, {"b0": {"embed": n0.url}},
                                     lane_keys_file=keys_file({"n0": KEY_A, "b0": KEY_A})))
    svc.ingest("alice", "The ferry to Vaxholm leaves at 9:40.")
    out = svc.search("alice", "boat")
    assert out["degraded"] == [] and out["served"]["embed"] == "interactive/n0"
    assert n0.auth() and set(n0.auth()) == {"Bearer " + KEY_A}
    for path, who in (("/healthz", "alice"), ("/v5/admin/lanes", "admin")):
        r = svc.call("GET", path, who)
        assert r.status_code == 200 and KEY_A not in r.text
    assert KEY_A not in repr(svc.pipeline.settings)


@pytest.mark.parametrize("echo", [False, True])
def test_a_wrong_key_is_a_configuration_error_said_plainly(keyed, keys_file, lane_service, caplog, echo):
    bad, good = keyed(KEY_A, echo=echo), keyed(KEY_B)
    svc = lane_service(lane_settings({"n0": {"embed": bad.url}, "n1": {"embed": good.url}}, {},
                                     lane_keys_file=keys_file({"n0": KEY_B, "n1": KEY_B})))
    with caplog.at_level(logging.WARNING, logger="smem.lanes"):
        svc.remember("alice", "The ferry leaves at 9:40.")     # embedded on the interactive lane: n0 first
        out = svc.search("alice", "ferry")
    # The lane's other node answers; the refusing one is skipped (and stays so for down_s), the log says
    # why, once, as an error.
    assert out["served"]["embed"] == "interactive/n1" and out["degraded"] == ["interactive/n0"]
    [rec] = [r for r in caplog.records if "interactive/n0" in r.getMessage()]
    msg = rec.getMessage()
    assert rec.levelno == logging.ERROR
    assert "answered 401" in msg and "refused lane_keys_file's key for n0" in msg
    assert "a configuration error, not the node down" in msg
    report = svc.call("GET", "/v5/admin/lanes", "admin").json()["lanes"]["interactive"]["nodes"]
    assert "refused lane_keys_file's key for n0" in report["n0"]["models"]["embed"]["authError"]
    assert report["n1"]["models"]["embed"]["authError"] is None
    # Alone in its lane: the call fails with the reason, then and while the node is skipped.
    alone = lane_settings({"n0": {"embed": bad.url}}, {}, lane_keys_file=keys_file({"n0": KEY_B}))
    emb = LaneEmbedder(Lanes(alone), alone.model("embed"), "interactive")
    with pytest.raises(EmbedderError) as first:
        emb.embed(["x"])
    assert "refused lane_keys_file's key for n0" in str(first.value)
    with pytest.raises(EmbedderError) as again:
        emb.embed(["x"])
    assert "refused their key from lane_keys_file (a configuration error" in str(again.value)
    assert "down:" not in str(again.value)
    shown = caplog.text + json.dumps(out) + json.dumps(report) + str(first.value) + str(again.value)
    assert KEY_A not in shown and KEY_B not in shown
    assert bad.auth() and set(bad.auth()) == {"Bearer " + KEY_B}    # it was sent, and refused


def test_a_node_that_wants_a_key_the_file_lacks_says_so(keyed, keys_file):
    n0 = keyed(KEY_A)
    lanes = Lanes(lane_settings({"n0": {"embed": n0.url}}, {}, lane_keys_file=keys_file({"other": KEY_B})))
    with pytest.raises(NoNode, match="the node wants an API key and lane_keys_file has none for n0"):
        lanes.call("interactive", "embed", lambda s: s.post("/v1/embeddings", {"input": ["x"]}))
    assert n0.auth() == [None]


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read it: No such file or directory"),
    ("dir", "cannot read it: Is a directory"),
    ("", "not JSON (Expecting value at line 1 column 1)"),
    ('{"n0": "%s",}' % KEY_A, "not JSON"),
    (b"\xff\xfe\x00", "not UTF-8 text"),
    ('["%s"]' % KEY_A, 'expected a JSON object {"node": "key", ...}, got a list'),
    ('{"n0": 5}', "node 'n0': its key must be"),
    ('{"n0": ""}', "node 'n0': its key must be"),
    ('{"n0": "two words"}', "node 'n0': its key must be"),
    ('{"n0": "line\\nbreak"}', "node 'n0': its key must be"),
    ('{"n0": "#commented"}', "not starting with #"),
    ('{"": "%s"}' % KEY_A, "a node with an empty name"),
])
def test_a_bad_keys_file_is_a_clear_error_at_start(tmp_path, monkeypatch, capsys, content, message):
    path = tmp_path / "lane-keys.json"
    if content == "dir":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    cfg = tmp_path / "smem.toml"
    cfg.write_text('lane_keys_file = "%s"\n[models]\nembed = {name = "e", dim = 4}\n'
                   '[lanes.interactive.nodes]\nn0 = {embed = "http://127.0.0.1:9"}\n' % path)
    with pytest.raises(ValueError) as e:
        config.load(str(cfg))
    assert str(e.value).startswith("%s: lane_keys_file %s: " % (cfg, path)) and message in str(e.value)
    for secret in (KEY_A, "two words", "break", "commented"):
        assert secret not in str(e.value)

    def no_lock(db):
        raise Busy("got past the config")
    monkeypatch.setattr(cli, "take_lock", no_lock)
    assert cli.main(["serve", "--db", str(tmp_path / "s.db"), "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert err == "smem: %s\n" % e.value


def test_keys_file_setting_is_checked():
    with pytest.raises(ValueError, match="lane_keys_file: a path"):
        lane_settings({"n0": {"embed": "http://127.0.0.1:9"}}, {}, lane_keys_file=3)


def test_lane_keys_is_not_a_setting(tmp_path):
    cfg = tmp_path / "smem.toml"
    cfg.write_text('lane_keys = {n0 = "%s"}\n' % KEY_A)
    with pytest.raises(ValueError, match="unknown settings lane_keys"):
        config.load(str(cfg))


def test_a_real_llama_server_with_an_api_key_file(tmp_path, spawn_llama, keys_file, lane_service, caplog):
    api_keys = tmp_path / "smem.api-keys"
    api_keys.write_text(KEY_A + "\n")   # as roles/llama_server writes /etc/llama-server/<owner>.api-keys
    node = spawn_llama("keyed", *EMBED_FLAGS, "--api-key-file", str(api_keys)).wait_ready()   # /health: public
    svc = lane_service(lane_settings({"n0": {"embed": node.url}}, {}, lane_keys_file=keys_file({"n0": KEY_A})))
    svc.remember("alice", "The ferry to Vaxholm leaves at 9:40.")
    out = svc.search("alice", "boat departure")
    assert out["degraded"] == [] and out["served"]["embed"] == "interactive/n0" and out["results"]

    wrong = Lanes(lane_settings({"n0": {"embed": node.url}}, {}, lane_keys_file=keys_file({"n0": KEY_B})))
    with caplog.at_level(logging.ERROR, logger="smem.lanes"), pytest.raises(NoNode) as e:
        wrong.call("interactive", "embed", lambda s: s.post("/v1/embeddings", {"input": ["x"]}))
    assert "answered 401" in str(e.value) and "Invalid API Key" in str(e.value)
    assert "refused lane_keys_file's key for n0" in str(e.value) and "not the node down" in caplog.text
    assert KEY_A not in caplog.text + str(e.value) and KEY_B not in caplog.text + str(e.value)

    none = Lanes(lane_settings({"n0": {"embed": node.url}}, {}))
    with pytest.raises(NoNode, match="lane_keys_file has none for n0"):
        none.call("interactive", "embed", lambda s: s.post("/v1/embeddings", {"input": ["x"]}))
