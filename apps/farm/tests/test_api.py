"""The HTTP API over the same database as the CLI: submit, status, cancel, the tokens, the address;
the workers' routes: bundles by hash, part uploads."""

from __future__ import annotations

import errno
import hashlib
import io
import re
import sys
import tarfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from starlette.testclient import TestClient

from farm import remotion
from farm.api import build, listen_address
from farm.config import load
from farm.db import DB
from farm.remotion import tree_hash
from farm.statemachine import StateMachine

SPEC = {"renderer": "testsrc", "width": 320, "height": 180, "fps": 30, "frames": 120}


@pytest.fixture
def api(tmp_path):
    s = load(None, db_path=str(tmp_path / "farm.db"), output_dir=str(tmp_path / "out"),
             work_dir=str(tmp_path / "work"), parts_dir=str(tmp_path / "parts"), never_lend=["vca-node2"])
    client = TestClient(build(s, "secret", "worker-secret"))
    client.headers["Authorization"] = "Bearer secret"
    client.settings = s
    return client


def as_worker(api):
    api.headers["Authorization"] = "Bearer worker-secret"
    return api


def attempt_headers(api, jid, name) -> dict:
    """The headers of the attempt that holds this part's chunk (its attempts recorded first, as the
    coordinator does when the job runs)."""
    m = re.fullmatch(r"part-(\d{5})\.(ts|wav)", name)
    db = DB(api.settings.db_path)
    if not m or db.job(jid) is None:
        return {}
    if not db.one("SELECT 1 AS x FROM attempts WHERE job_id=?", (jid,)):
        StateMachine(api.settings, db).running(jid)
    a = db.one("SELECT id, key FROM attempts WHERE job_id=? AND idx=?", (jid, int(m.group(1))))
    return {"X-Farm-Attempt": a["id"], "X-Farm-Attempt-Key": a["key"]} if a else {}


def put_part(api, jid, name, body: bytes, digest: str | None = None):
    return api.put("/v1/jobs/%s/parts/%s" % (jid, name), content=body,
                   headers={"X-Content-SHA256": digest if digest is not None else hashlib.sha256(body).hexdigest(),
                            **attempt_headers(api, jid, name)})


def test_submit_status_cancel(api):
    r = api.post("/v1/jobs", json={"spec": SPEC, "out": "a.mp4", "nodes": ["vca-node0", "vca-node1"]})
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    v = api.get("/v1/jobs/" + jid).json()
    assert v["job"]["state"] == "submitted" and v["job"]["nodes"] == ["vca-node0", "vca-node1"]
    assert len(v["chunks"]) == 4 and v["doneFrames"] == 0
    assert [j["id"] for j in api.get("/v1/jobs").json()["jobs"]] == [jid]
    assert api.delete("/v1/jobs/" + jid).status_code == 202
    assert api.get("/v1/jobs/nope").status_code == 404 and api.delete("/v1/jobs/nope").status_code == 404


def test_bad_requests_change_nothing(api):
    assert api.post("/v1/jobs", json={"spec": SPEC, "out": "a.mp4", "nodes": ["vca-node2"]}).json() == {
        "error": "vca-node2 is never lent"}
    assert api.post("/v1/jobs", json={"spec": SPEC}).status_code == 400
    assert api.post("/v1/jobs", json={"spec": SPEC, "out": "a.mp4", "colour": 1}).status_code == 400
    assert api.post("/v1/jobs", json={"spec": {"renderer": "testsrc"}, "out": "a.mp4"}).status_code == 400
    assert api.post("/v1/jobs", content=b"{", headers={"content-type": "application/json"}).status_code == 400
    assert api.get("/v1/jobs").json()["jobs"] == []
    api.headers["Authorization"] = "Bearer wrong"
    assert api.get("/v1/jobs").status_code == 401


def test_the_api_listens_on_loopback_unless_told():
    assert listen_address(load(None)) == ("127.0.0.1", 8790)
    assert listen_address(load(None, api_listen="[::1]:9000")) == ("::1", 9000)
    with pytest.raises(SystemExit, match="refusing to listen on every address"):
        listen_address(load(None, api_listen="0.0.0.0:8790"))
    assert listen_address(load(None, api_listen="0.0.0.0:8790", allow_public_listen=True)) == ("0.0.0.0", 8790)


def test_the_tokens_open_only_their_routes(api, tmp_path):
    jid = api.post("/v1/jobs", json={"spec": SPEC, "out": "a.mp4"}).json()["id"]
    digest = make_bundle(tmp_path / "work")
    routes = [("GET", "/v1/jobs"), ("GET", "/v1/jobs/" + jid), ("POST", "/v1/jobs"), ("DELETE", "/v1/jobs/" + jid),
              ("GET", "/v1/bundles/" + digest), ("PUT", "/v1/jobs/%s/parts/part-00000.ts" % jid)]
    allowed = {"secret": {"GET /v1/jobs", "GET /v1/jobs/" + jid, "POST /v1/jobs", "DELETE /v1/jobs/" + jid,
                          "GET /v1/bundles/" + digest},
               "worker-secret": {"GET /v1/bundles/" + digest, "PUT /v1/jobs/%s/parts/part-00000.ts" % jid}}
    for token, mine in allowed.items():
        for verb, route in routes:
            r = api.request(verb, route, headers={"Authorization": "Bearer " + token})
            key = "%s %s" % (verb, route)
            assert (r.status_code != 403) is (key in mine), (token, key, r.status_code)
            assert r.status_code != 401
    for verb, route in routes:
        for headers in ({"Authorization": ""}, {"Authorization": "Bearer wrong"}, {"Authorization": "secret"}):
            assert api.request(verb, route, headers=headers).status_code == 401, (verb, route, headers)
    with pytest.raises(ValueError, match="must all differ"):
        build(api.settings, "same", "same")


def make_bundle(work: Path) -> str:
    staged = work / "bundles" / ".new"
    (staged / "static").mkdir(parents=True)
    (staged / "index.html").write_text("<html/>")
    (staged / "static" / "app.js").write_text("x=1")
    digest = tree_hash(staged)
    staged.rename(staged.with_name(digest))
    return digest


def test_a_bundle_is_a_tar_of_its_files(api, tmp_path):
    digest = make_bundle(tmp_path / "work")
    r = as_worker(api).get("/v1/bundles/" + digest)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(r.content)) as tar:
        assert sorted(m.name for m in tar) == ["index.html", "static", "static/app.js"]
        assert tar.extractfile("static/app.js").read() == b"x=1"
    assert api.get("/v1/bundles/" + "0" * 64).status_code == 404
    assert api.get("/v1/bundles/" + digest[:-1] + "X").status_code == 404
    assert api.get("/v1/bundles/..%2F..%2Fetc").status_code == 404


def test_a_part_upload(api):
    jid = api.post("/v1/jobs", json={"spec": SPEC, "out": "a.mp4"}).json()["id"]
    as_worker(api)
    folder = Path(api.settings.parts_dir) / jid
    r = put_part(api, jid, "part-00001.wav", b"RIFF...")
    assert r.status_code == 201 and r.json()["bytes"] == 7, r.text
    assert (folder / "part-00001.wav").read_bytes() == b"RIFF..."
    assert put_part(api, jid, "part-00001.wav", b"again").status_code == 201
    assert (folder / "part-00001.wav").read_bytes() == b"again"          # replaced whole
    # a body that is not what its header says
    r = put_part(api, jid, "part-00002.ts", b"the part", hashlib.sha256(b"another").hexdigest())
    assert r.status_code == 400 and "sha256" in r.json()["error"]
    assert not (folder / "part-00002.ts").exists()
    for name in ("part-1.ts", "part-00001.mp4", "..%2Fpart-00001.ts", ".part-00001.ts", "part-000011.ts"):
        assert put_part(api, jid, name, b"x").status_code in (400, 404), name
    assert put_part(api, jid, "part-00002.ts", b"x", "").status_code == 400          # no header
    assert put_part(api, jid, "part-00002.ts", b"x", "abc").status_code == 400
    assert sorted(p.name for p in folder.iterdir()) == ["part-00001.wav"]           # no temporary left
    # only a live job takes parts
    assert put_part(api, "nosuchjob", "part-00001.ts", b"x").status_code == 409
    DB(api.settings.db_path).c.execute("UPDATE jobs SET state='joining' WHERE id=?", (jid,))
    assert put_part(api, jid, "part-00003.ts", b"x").status_code == 409
    assert not (folder / "part-00003.ts").exists()


def test_a_job_from_a_project_records_its_bundle_time(api, monkeypatch, tmp_path):
    def job_spec(project, composition, props, settings):
        time.sleep(0.2)
        return {**SPEC, "renderer": "remotion", "bundle": str(tmp_path), "composition": composition}
    monkeypatch.setattr(remotion, "job_spec", job_spec)
    r = api.post("/v1/jobs", json={"project": str(tmp_path), "composition": "Hello", "out": "a.mp4"})
    assert r.status_code == 201, r.text
    v = api.get("/v1/jobs/" + r.json()["id"]).json()
    assert 0.2 <= v["job"]["timings"]["bundle_s"] < 5 and v["timings"] == v["job"]["timings"]


def test_a_part_the_host_has_no_room_for_is_its_own_fault_507(api, monkeypatch):
    """Out of space on the host: 507, which the worker's transport raises as HostFull and reports as
    `interrupted` (nobody charged); nothing is left behind."""
    from farm import api as api_module  # noqa: PLC0415
    jid = api.post("/v1/jobs", json={"spec": SPEC, "out": "a.mp4", "nodes": ["vca-node0"]}).json()["id"]

    async def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(api_module, "_write_part", full)
    r = put_part(as_worker(api), jid, "part-00000.ts", b"part")
    assert r.status_code == 507 and "disk is full" in r.json()["error"], r.text
    assert list((Path(api.settings.parts_dir) / jid).iterdir()) == []
