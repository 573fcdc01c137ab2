"""smem's tests: the package from src/, a real SQLite file per test, the real in-process embedder, and
real llama-server processes (SMEM_LLAMA_SERVER, SMEM_TEST_GGUF) for the model lanes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import pytest

APP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(APP / "src"))

from starlette.testclient import TestClient  # noqa: E402

from smem import auth  # noqa: E402
from smem.config import Settings  # noqa: E402
from smem.embed import EmbedderError, MiniLMEmbedder  # noqa: E402
from smem.service import build  # noqa: E402


@pytest.fixture(scope="session")
def minilm():
    return MiniLMEmbedder()


class Switchable:
    """The real embedder, which a test can turn off to take the vector lane down."""

    def __init__(self, inner):
        self.inner, self.name, self.dim, self.down = inner, inner.name, inner.dim, False

    def embed(self, texts: list[str]) -> np.ndarray:
        if self.down:
            raise EmbedderError("switched off by the test")
        return self.inner.embed(texts)


class JSONStub:
    """A loopback JSON server for the few cases where an answer must be wrong on demand:
    respond(path, body, headers) -> (status, answer object or None)."""

    def __init__(self, respond):
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                status, answer = respond(self.path, body, self.headers)
                out = b"" if answer is None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Service:
    def __init__(self, path: Path, settings: Settings, embedder):
        self.path = path
        self.embedder = Switchable(embedder) if embedder else None  # None: the lanes' embedders
        self.app, self.pipeline = build(str(path), settings, embedder=self.embedder, start_workers=False)
        self.db = self.pipeline.db
        self.client = TestClient(self.app)
        self.tokens = {"alice": auth.create(self.db, ["alice"]), "bob": auth.create(self.db, ["bob"]),
                       "both": auth.create(self.db, ["alice", "bob"]), "admin": auth.create(self.db, [], admin=True)}

    def h(self, who: str) -> dict:
        return {"Authorization": "Bearer " + self.tokens[who]}

    def call(self, method: str, path: str, who: str = "alice", **kw):
        return self.client.request(method, path, headers={**self.h(who), **kw.pop("headers", {})}, **kw)

    def ingest(self, ns: str, content: str, who: str | None = None, **fields) -> str:
        r = self.call("POST", "/v5/ns/%s/documents" % ns, who or ns, json={"content": content, **fields})
        assert r.status_code == 202, r.text
        self.pipeline.run_until_idle()
        return r.json()["id"]

    def remember(self, ns: str, content: str, who: str | None = None, **fields) -> dict:
        r = self.call("POST", "/v5/ns/%s/memories" % ns, who or ns, json={"content": content, **fields})
        assert r.status_code in (200, 201), r.text
        return r.json()

    def search(self, ns: str, q: str, who: str | None = None, **fields) -> dict:
        r = self.call("POST", "/v5/ns/%s/search" % ns, who or ns, json={"q": q, **fields})
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture
def make_service(tmp_path, minilm):
    def make(**settings) -> Service:
        return Service(tmp_path / "smem.db", Settings(**settings), minilm)
    return make


@pytest.fixture
def svc(make_service) -> Service:
    return make_service()


# -- real llama-server processes ------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llama_paths() -> tuple[str, str]:
    binary, gguf = os.environ.get("SMEM_LLAMA_SERVER"), os.environ.get("SMEM_TEST_GGUF")
    problems = []
    if not binary or not os.access(binary, os.X_OK):
        problems.append("SMEM_LLAMA_SERVER (the llama-server binary) is %s" % ("unset" if not binary else
                                                                              "not executable: " + binary))
    if not gguf or not os.path.isfile(gguf):
        problems.append("SMEM_TEST_GGUF (SmolLM2-135M-Instruct GGUF) is %s" % ("unset" if not gguf else
                                                                              "not a file: " + gguf))
    if problems:
        pytest.fail("these tests need a real llama-server: " + "; ".join(problems), pytrace=False)
    return binary, gguf


class LlamaServer:
    """One llama-server process on 127.0.0.1, as in production one per model per node."""

    def __init__(self, log_dir: Path, name: str, *flags: str):
        binary, gguf = llama_paths()
        self.name, self.port = name, free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.log = log_dir / ("llama-%s-%d.log" % (name, self.port))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
                                          "-c", "2048", "-t", "1", "--parallel", "1", "--metrics", *flags],
                                         stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, seconds: float = 180) -> LlamaServer:
        deadline = time.monotonic() + seconds
        while True:
            if self.proc.poll() is not None:
                pytest.fail("llama-server %s exited (%s): %s" % (self.name, self.proc.returncode,
                                                                  self.log.read_text()[-2000:]), pytrace=False)
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("llama-server %s not ready after %d s" % (self.name, seconds), pytrace=False)
            time.sleep(0.2)

    def metric(self, name: str) -> float:
        """A counter from /metrics, e.g. n_decode_total: how much work this server has been given."""
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("llamacpp:%s " % name):
                return float(line.split()[1])
        raise KeyError(name)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


EMBED_FLAGS = ("--embeddings", "--pooling", "mean")


@pytest.fixture(scope="session")
def llama_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("llama")


@pytest.fixture(scope="session")
def llama_embed(llama_logs):
    s = LlamaServer(llama_logs, "embed", *EMBED_FLAGS).wait_ready()
    yield s
    s.kill()


@pytest.fixture(scope="session")
def llama_chat(llama_logs):
    s = LlamaServer(llama_logs, "chat").wait_ready()
    yield s
    s.kill()


@pytest.fixture
def spawn_llama(llama_logs):
    """More llama-server processes for one test (to kill, or to lease), stopped after it."""
    started = []

    def spawn(name: str, *flags: str) -> LlamaServer:
        started.append(LlamaServer(llama_logs, name, *flags))
        return started[-1]
    yield spawn
    for s in started:
        s.kill()


def lane_settings(interactive: dict, background: dict, chat: bool = False, rerank: bool = False, **more):
    """Settings with the SmolLM2 models on the given lanes' nodes."""
    models = {"embed": {"name": "smollm2-135m", "dim": 576}}
    if chat:
        models["chat"] = {"name": "smollm2-135m-instruct"}
    if rerank:
        models["rerank"] = {"name": "smollm2-135m-as-reranker"}
    lanes = {name: {"nodes": nodes} for name, nodes in (("interactive", interactive), ("background", background))
             if nodes}
    return Settings(models=models, lanes=lanes, **{"retry_backoff_s": 0, **more})


@pytest.fixture
def lane_service(tmp_path):
    def make(settings: Settings, path: Path | None = None) -> Service:
        return Service(path or tmp_path / "smem.db", settings, None)
    return make
