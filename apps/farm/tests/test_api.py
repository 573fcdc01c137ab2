"""The HTTP API over the same database as the CLI: submit, status, cancel, the token, the address."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from starlette.testclient import TestClient

from farm.api import build, listen_address
from farm.config import load

SPEC = {"renderer": "testsrc", "width": 320, "height": 180, "fps": 30, "frames": 120}


@pytest.fixture
def api(tmp_path):
    s = load(None, db_path=str(tmp_path / "farm.db"), output_dir=str(tmp_path / "out"))
    client = TestClient(build(s, "secret"))
    client.headers["Authorization"] = "Bearer secret"
    return client


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
    with pytest.raises(SystemExit, match="not a loopback"):
        listen_address(load(None, api_listen="0.0.0.0:8790"))
    assert listen_address(load(None, api_listen="0.0.0.0:8790", allow_public_listen=True)) == ("0.0.0.0", 8790)
