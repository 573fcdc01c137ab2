"""kill -9 `smem serve` in the middle of ingest, start it again: every accepted document ends done, once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from smem import auth
from smem.config import Settings
from smem.service import open_db
from smem.text import units

APP_SRC = Path(__file__).resolve().parent.parent / "src"
DOCS = ["\n\n".join("In document %d, part %d, the ferry leaves the harbour at %d o'clock sharp. " % (d, p, p) * 8
                    for p in range(6)) for d in range(4)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(db: Path, cfg: Path, port: int):
    env = dict(os.environ, PYTHONPATH=str(APP_SRC))
    proc = subprocess.Popen([sys.executable, "-m", "smem", "serve", "--db", str(db), "--listen", "127.0.0.1:%d" % port,
                             "--config", str(cfg), "--log-level", "warning"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    until(lambda: _up(port), proc, "the server did not come up")
    return proc


def _up(port: int) -> bool:
    try:
        return httpx.get("http://127.0.0.1:%d/healthz" % port, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def until(cond, proc, what: str, seconds: float = 180):
    """A busy machine makes this slower, never wrong."""
    deadline = time.monotonic() + seconds
    while not cond():
        assert proc.poll() is None, "smem serve exited with %s" % proc.returncode
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_kill_9_mid_ingest_loses_nothing_and_duplicates_nothing(tmp_path):
    db_path = tmp_path / "smem.db"
    db = open_db(str(db_path), Settings())
    token = auth.create(db, ["alice"])
    h = {"Authorization": "Bearer " + token}
    slow, fast = tmp_path / "slow.toml", tmp_path / "fast.toml"
    # Each chunk's embedding waits 0.3 s: 24 chunks are seconds of ingest to be killed in.
    slow.write_text("test_chunk_sleep_s = 0.3\nembed_batch = 1\npoll_interval_s = 0.05\n")
    fast.write_text("poll_interval_s = 0.05\n")
    port = free_port()
    base = "http://127.0.0.1:%d/v5/ns/alice" % port

    proc = start(db_path, slow, port)
    accepted = []
    for content in DOCS:
        r = httpx.post(base + "/documents", json={"content": content}, headers=h, timeout=30)
        assert r.status_code == 202
        accepted.append(r.json()["id"])
    fact = httpx.post(base + "/memories", json={"content": "The ferry is blue."}, headers=h, timeout=30)
    assert fact.status_code == 201
    until(lambda: db.scalar("SELECT count(*) FROM chunks WHERE embedding IS NOT NULL") >= 3, proc,
          "no chunk was embedded")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = db.scalar("SELECT count(*) FROM documents WHERE status='done'")
    assert done < len(DOCS), "ingest had finished before the kill: the test proved nothing"
    assert db.scalar("SELECT count(*) FROM jobs WHERE state='running'") >= 1

    proc = start(db_path, fast, port)
    try:
        until(lambda: all(httpx.get(base + "/documents/" + d, headers=h, timeout=30).json()["status"]
                          in ("done", "failed") for d in accepted), proc, "not every accepted document got to an end")
    finally:
        proc.terminate()
        proc.wait()

    assert [r["status"] for r in db.rows("SELECT status FROM documents")] == ["done"] * len(DOCS)
    for doc_id, content in zip(accepted, DOCS, strict=True):
        n = len(units(content, Settings().chunk_tokens))
        assert db.scalar("SELECT count(*) FROM chunks WHERE document_id=?", (doc_id,)) == n
        assert db.scalar("SELECT count(DISTINCT seq) FROM chunks WHERE document_id=?", (doc_id,)) == n
    total = db.scalar("SELECT count(*) FROM chunks")
    assert db.scalar("SELECT count(*) FROM chunks_fts") == total
    assert db.scalar("SELECT count(*) FROM vec_chunks") == total
    assert db.scalar("SELECT count(*) FROM memories") == 1 == db.scalar("SELECT count(*) FROM vec_memories")
    assert [r["state"] for r in db.rows("SELECT state FROM jobs")] == ["done"] * len(DOCS)
    assert db.scalar("PRAGMA integrity_check") == "ok"
