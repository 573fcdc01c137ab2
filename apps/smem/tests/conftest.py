"""smem's tests: the package from src/, a real SQLite file per test, the real in-process embedder."""

from __future__ import annotations

import sys
from pathlib import Path

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


class Service:
    def __init__(self, path: Path, settings: Settings, embedder):
        self.path = path
        self.embedder = Switchable(embedder)
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
