"""farm.transport against the API in-process (starlette's TestClient) or a crafted answer: a bundle
fetched by hash, checked and cached (a few, least recently used out), a tar with anything but plain
files and directories refused, parts uploaded whole."""

from __future__ import annotations

import io
import os
import re
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from starlette.testclient import TestClient

from farm.api import build
from farm.config import load
from farm.db import DB
from farm.remotion import tree_hash
from farm.statemachine import StateMachine
from farm.transport import Host, TransportError, extract

SPEC = {"renderer": "testsrc", "width": 320, "height": 180, "fps": 30, "frames": 120}


def make_bundle(work: Path, files: dict) -> str:
    staged = work / "bundles" / ".new"
    for name, data in files.items():
        (staged / name).parent.mkdir(parents=True, exist_ok=True)
        (staged / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    digest = tree_hash(staged)
    staged.rename(staged.with_name(digest))
    return digest


@pytest.fixture
def host(tmp_path):
    s = load(None, db_path=str(tmp_path / "farm.db"), work_dir=str(tmp_path / "work"),
             parts_dir=str(tmp_path / "parts"), output_dir=str(tmp_path / "out"))
    client = TestClient(build(s, "api-token", "worker-token"))
    h = Host("http://testserver", "worker-token", tmp_path / "cache", keep=2, client=client)
    h.settings = s
    return h


def test_a_bundle_is_fetched_checked_and_cached(host, tmp_path):
    digest = make_bundle(tmp_path / "work", {"index.html": "<html/>", "static/a.js": "a" * 100000,
                                             "public/tone.wav": os.urandom(5000)})
    got = host.bundle(digest)
    assert got == tmp_path / "cache" / "bundles" / digest and tree_hash(got) == digest
    assert (got / "static" / "a.js").read_text() == "a" * 100000
    assert sorted(p.name for p in got.parent.iterdir()) == [digest]      # no temporary left
    # a second use comes from the cache (the host no longer has it)
    os.rename(tmp_path / "work" / "bundles" / digest, tmp_path / "work" / "moved")
    (tmp_path / "work" / "bundle-tars" / (digest + ".tar")).unlink()
    assert host.bundle(digest) == got
    with pytest.raises(TransportError, match="answered 404"):
        host.bundle("0" * 64)
    with pytest.raises(TransportError, match="not 64 hex"):
        host.bundle("../etc")


def test_the_cache_keeps_the_most_recently_used(host, tmp_path):
    a, b, c = (make_bundle(tmp_path / "work", {"x": name}) for name in "abc")
    cache = tmp_path / "cache" / "bundles"
    host.bundle(a)
    time.sleep(0.02)
    host.bundle(b)
    time.sleep(0.02)
    host.bundle(a)               # a used again: b is now the least recent
    time.sleep(0.02)
    host.bundle(c)               # keep=2
    assert sorted(p.name for p in cache.iterdir()) == sorted([a, c])


def test_a_bundle_whose_files_do_not_hash_to_its_name_is_refused(host, tmp_path):
    digest = make_bundle(tmp_path / "work", {"index.html": "<html/>"})
    (tmp_path / "work" / "bundles" / digest / "index.html").write_text("<html>changed</html>")
    with pytest.raises(TransportError, match="bundle %s: the files fetched hash to [0-9a-f]{64}: refused" % digest):
        host.bundle(digest)
    assert list((tmp_path / "cache" / "bundles").iterdir()) == []


def tar_of(*members) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def member(name: str, kind=tarfile.REGTYPE, data: bytes | None = b"x", **kw):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(data) if kind == tarfile.REGTYPE and data else 0
    for k, v in kw.items():
        setattr(info, k, v)
    return info, data if kind == tarfile.REGTYPE else None


@pytest.mark.parametrize("bad", [
    member("/etc/cron.d/x"),
    member("../outside"),
    member("a/../../outside"),
    member("link", tarfile.SYMTYPE, linkname="/etc/passwd"),
    member("hard", tarfile.LNKTYPE, linkname="index.html"),
    member("dev", tarfile.CHRTYPE, devmajor=1, devminor=3),
    member("fifo", tarfile.FIFOTYPE),
], ids=["absolute", "dotdot", "dotdot-inside", "symlink", "hardlink", "device", "fifo"])
def test_extract_refuses_anything_but_plain_files_and_dirs(tmp_path, bad):
    tar = tmp_path / "b.tar"
    tar.write_bytes(tar_of(member("index.html"), bad))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(TransportError, match="refused tar member"):
        extract(tar, dest)
    assert not (tmp_path / "outside").exists() and not (dest / "link").is_symlink()


def test_a_crafted_bundle_is_refused_and_leaves_nothing(tmp_path):
    """A host (or anything on the way) answering with a tar that climbs out of the cache."""
    body = tar_of(member("index.html"), member("../../escaped"))
    client = httpx.Client(base_url="http://farm", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, content=body)))
    h = Host("http://farm", "t", tmp_path / "cache", client=client)
    with pytest.raises(TransportError, match=re.escape("refused tar member '../../escaped'")):
        h.bundle("a" * 64)
    assert not list(tmp_path.rglob("escaped")) and list((tmp_path / "cache" / "bundles").iterdir()) == []


def test_a_part_is_uploaded_whole_and_a_second_upload_replaces_it(host, tmp_path):
    db = DB(host.settings.db_path)
    jid = db.submit(SPEC, "a.mp4", ["vca-node0"], [(3, 0, 59), (4, 60, 119)], frames=120, fps=30)
    StateMachine(host.settings, db).running(jid)
    mine, other = db.rows("SELECT id, key FROM attempts WHERE job_id=? ORDER BY idx", (jid,))
    part = tmp_path / "part-00003.ts"
    part.write_bytes(os.urandom(300000))
    host.upload(jid, part, attempt=mine["id"], key=mine["key"])
    landed = Path(host.settings.parts_dir) / jid / "part-00003.ts"
    assert landed.read_bytes() == part.read_bytes()
    part.write_bytes(b"second")
    host.upload(jid, part, attempt=mine["id"], key=mine["key"])
    assert landed.read_bytes() == b"second"
    assert sorted(p.name for p in landed.parent.iterdir()) == ["part-00003.ts"]   # no temporary left
    with pytest.raises(TransportError, match=r"upload of nojob/part-00003.ts: the host answered 409"):
        host.upload("nojob", part, attempt=mine["id"], key=mine["key"])
    # a part is its attempt's: another chunk's key, a wrong key, or no attempt cannot write it
    part.write_bytes(b"forged")
    for attempt, key in ((other["id"], other["key"]), (mine["id"], "x" * 24), ("nope", mine["key"])):
        with pytest.raises(TransportError, match="answered 403"):
            host.upload(jid, part, attempt=attempt, key=key)
    assert landed.read_bytes() == b"second"


def test_each_node_uploads_only_the_parts_of_its_own_attempts(tmp_path):
    """Each node's own worker token (worker_tokens_dir): a part upload with node B's token is refused for
    an attempt node A started, whatever key it carries."""
    tokens = tmp_path / "worker-tokens"
    tokens.mkdir()
    (tokens / "vca-node0.token").write_text("token-of-node0\n")
    (tokens / "vca-node1.token").write_text("token-of-node1\n")
    s = load(None, db_path=str(tmp_path / "farm.db"), work_dir=str(tmp_path / "work"),
             parts_dir=str(tmp_path / "parts"), output_dir=str(tmp_path / "out"), worker_tokens_dir=str(tokens))
    assert s.node_tokens() == {"vca-node0": "token-of-node0", "vca-node1": "token-of-node1"}
    client = TestClient(build(s, "api-token", None, node_tokens=s.node_tokens()))
    db = DB(s.db_path)
    jid = db.submit(SPEC, "a.mp4", ["vca-node0", "vca-node1"], [(0, 0, 119)], frames=120, fps=30)
    sm = StateMachine(s, db)
    sm.running(jid)
    a = db.one("SELECT id, key FROM attempts WHERE job_id=?", (jid,))
    sm.apply({"event": "started", "job": jid, "attempt": a["id"], "node": "vca-node0", "ts": time.time(),
              "key": a["key"]})
    part = tmp_path / "part-00000.ts"
    part.write_bytes(b"the part")
    other = Host("http://testserver", "token-of-node1", tmp_path / "c1", client=client)
    with pytest.raises(TransportError, match=r"answered 403.*vca-node0's; the token is vca-node1's"):
        other.upload(jid, part, attempt=a["id"], key=a["key"])
    own = Host("http://testserver", "token-of-node0", tmp_path / "c0", client=client)
    own.upload(jid, part, attempt=a["id"], key=a["key"])
    assert (Path(s.parts_dir) / jid / "part-00000.ts").read_bytes() == b"the part"
    with pytest.raises(ValueError, match="must all differ"):
        build(s, "token-of-node0", None, node_tokens=s.node_tokens())
