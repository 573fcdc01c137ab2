"""What a job must be to be taken in (README "Bad requests fail at submit"), and how long its chunks
may be (README "Long jobs"). Each refusal records nothing."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from starlette.testclient import TestClient

from farm.api import build
from farm.config import Settings, load
from farm.coordinator import verified_text
from farm.db import DB
from farm.gc import free_gib
from farm.jobs import resolve_out, submit
from farm.statemachine import StateMachine

SPEC = {"renderer": "testsrc", "width": 64, "height": 36, "fps": 30, "frames": 120}


@pytest.fixture
def s(tmp_path):
    return load(None, db_path=str(tmp_path / "state" / "farm.db"), output_dir=str(tmp_path / "out"),
                work_dir=str(tmp_path / "work"), parts_dir=str(tmp_path / "parts"), min_free_gib=0.0)


def jobs(s):
    return DB(s.db_path).rows("SELECT id FROM jobs")


@pytest.mark.parametrize("out", ["../x.mp4", "/tmp/x.mp4", "sub/../../x.mp4", "", "/etc/passwd"])
def test_an_output_outside_output_dir_is_refused(s, out):
    with pytest.raises(ValueError, match=r"outside output_dir|a file name under output_dir"):
        submit(s, SPEC, out, ["vca-node0"])
    assert jobs(s) == []


def test_the_database_cannot_be_an_output(s, tmp_path):
    with pytest.raises(ValueError, match="outside output_dir"):
        submit(s, SPEC, s.db_path, ["vca-node0"])


def test_outputs_under_output_dir_are_taken(s):
    assert resolve_out(s, "sub/x.mp4") == Path(s.output_dir).resolve() / "sub" / "x.mp4"
    assert resolve_out(s, str(Path(s.output_dir) / "y.mp4")) == Path(s.output_dir).resolve() / "y.mp4"
    (Path(s.output_dir) / "d").mkdir(parents=True)
    with pytest.raises(ValueError, match="is a directory"):
        resolve_out(s, "d")


@pytest.mark.parametrize("key", ["node", "browser", "node_modules", "concurrency"])
def test_a_spec_naming_executables_is_refused(s, key):
    with pytest.raises(ValueError, match="executables come from each machine's own settings"):
        submit(s, {**SPEC, key: "/tmp/evil"}, "a.mp4", ["vca-node0"])
    assert jobs(s) == []


@pytest.mark.parametrize("spec, why", [({**SPEC, "frames": 0}, "frames"), ({**SPEC, "frames": "9"}, "frames"),
                                       ({**SPEC, "fps": -1}, "fps"), ({**SPEC, "s_per_frame": 0}, "s_per_frame"),
                                       ({"fps": 30}, "no 'frames'"), ([1], "JSON object")])
def test_bad_specs_are_refused(s, spec, why):
    with pytest.raises(ValueError, match=why):
        submit(s, spec, "a.mp4", ["vca-node0"])
    assert jobs(s) == []


def test_a_submit_below_the_free_space_floor_is_refused(s):
    s.min_free_gib = 1e9
    with pytest.raises(ValueError, match=r"GiB free under .*farm gc"):
        submit(s, SPEC, "a.mp4", ["vca-node0"])
    assert jobs(s) == []


def test_the_api_refuses_the_same_and_bounds_uploads(s):
    s.max_part_bytes = 10
    api = TestClient(build(s, "secret", "worker-secret"))
    api.headers["Authorization"] = "Bearer secret"
    for body in ({"spec": SPEC, "out": "../x.mp4"}, {"spec": {**SPEC, "node": "/tmp/evil"}, "out": "a.mp4"}):
        r = api.post("/v1/jobs", json=body)
        assert r.status_code == 400 and r.json()["error"], r.text
    jid = api.post("/v1/jobs", json={"spec": SPEC, "out": "a.mp4"}).json()["id"]
    assert [j["id"] for j in jobs(s)] == [jid]
    api.headers["Authorization"] = "Bearer worker-secret"
    StateMachine(s, DB(s.db_path)).running(jid)
    attempt = DB(s.db_path).one("SELECT id, key FROM attempts WHERE job_id=? AND idx=0", (jid,))
    mine = {"X-Farm-Attempt": attempt["id"], "X-Farm-Attempt-Key": attempt["key"]}
    big = b"x" * 11
    r = api.put("/v1/jobs/%s/parts/part-00000.ts" % jid, content=big,
                headers={"X-Content-SHA256": hashlib.sha256(big).hexdigest(), **mine})
    assert r.status_code == 413 and "max_part_bytes" in r.json()["error"]
    r = api.put("/v1/jobs/%s/parts/part-00000.ts" % jid, content=iter([b"x" * 6, b"x" * 6]),   # no Content-Length
                headers={"X-Content-SHA256": hashlib.sha256(b"x" * 12).hexdigest(), **mine})
    assert r.status_code == 413
    assert not (Path(s.parts_dir) / jid / "part-00000.ts").exists()
    assert list((Path(s.parts_dir) / jid).iterdir()) == []            # no temporary left either


def test_chunks_are_bounded_by_render_time_so_a_long_video_gets_more_of_them(s):
    two_hours = {**SPEC, "renderer": "remotion", "frames": 216_000}
    s.chunk_target_s = 300.0
    jid = submit(s, two_hours, "long.mp4", ["vca-node0", "vca-node1", "vca-node4", "vca-node5"])
    chunks = DB(s.db_path).rows("SELECT first, last FROM chunks WHERE job_id=?", (jid,))
    longest = max(c["last"] - c["first"] + 1 for c in chunks)
    assert longest * s.s_per_frame(two_hours) <= 300.0           # not 16 chunks of 13,500 frames
    assert len(chunks) == -(-216_000 // int(300 / 0.0704))
    soft, hard = s.worker_limits()
    assert s.time_limit_s(longest, s.s_per_frame(two_hours)) <= soft < hard < s.broker_consumer_timeout_s
    # the broker never takes one back mid-render
    # the seeds' episode on four nodes is still the per-node plan: 16 chunks
    jid = submit(s, {**two_hours, "frames": 15_474}, "ep.mp4", ["vca-node0", "vca-node1", "vca-node4", "vca-node5"])
    assert len(DB(s.db_path).rows("SELECT 1 FROM chunks WHERE job_id=?", (jid,))) == 16
    # a job's own estimate wins: a slow composition gets shorter chunks
    jid = submit(s, {**two_hours, "frames": 9000, "s_per_frame": 1.0}, "slow.mp4", ["vca-node0"])
    assert max(c["last"] - c["first"] + 1 for c in DB(s.db_path).rows(
        "SELECT first, last FROM chunks WHERE job_id=?", (jid,))) == 300


def test_a_chunk_bound_that_would_outlive_the_consumer_timeout_is_a_settings_error():
    with pytest.raises(ValueError, match="consumer_timeout"):
        Settings(chunk_limit_cap_s=3600, broker_consumer_timeout_s=1800)
    Settings(chunk_limit_cap_s=1500, broker_consumer_timeout_s=1800)
    with pytest.raises(ValueError, match="chunk_limit_cap_s"):
        Settings(chunk_limit_cap_s=100, chunk_limit_floor_s=120)


def test_a_job_whose_parts_would_not_fit_above_the_floor_is_refused(s):
    """Parts and output of an estimated size (frames x pixels x part_bytes_per_pixel): a job that would
    leave less than min_free_gib free is refused at submit, before anything is recorded."""
    free = free_gib(s.parts_dir)
    frames = int((free + 1) * 2**30 / (1280 * 720 * s.part_bytes_per_pixel * 2)) + 1
    huge = {**SPEC, "frames": frames, "width": 1280, "height": 720}
    with pytest.raises(ValueError, match=r"needs about .* GiB for its parts and output"):
        submit(s, huge, "huge.mp4", ["vca-node0"])
    assert jobs(s) == []
    submit(s, {**huge, "frames": 900}, "small.mp4", ["vca-node0"])
    assert len(jobs(s)) == 1


def test_s_per_frame_comes_from_the_cli_and_the_api(s):
    jid = submit(s, SPEC, "a.mp4", ["vca-node0"], s_per_frame=2.5)
    assert DB(s.db_path).job(jid)["spec"]["s_per_frame"] == 2.5
    with pytest.raises(ValueError, match="s_per_frame"):
        submit(s, SPEC, "b.mp4", ["vca-node0"], s_per_frame=-1)
    api = TestClient(build(s, "secret", "worker-secret"))
    api.headers["Authorization"] = "Bearer secret"
    r = api.post("/v1/jobs", json={"spec": SPEC, "out": "c.mp4", "s_per_frame": 0.5})
    assert r.status_code in (200, 201, 202), r.text
    assert DB(s.db_path).job(r.json()["id"])["spec"]["s_per_frame"] == 0.5


def test_a_job_whose_audio_was_not_checked_says_so():
    assert verified_text({"frames": 90}) == "verified: 90 frames, audio: not checked (--verify checks it)"
    assert verified_text({"frames": 90, "offsetMs": 0.0, "driftMs": 0.0}) == \
        "verified: 90 frames, audio offset 0.000 ms, drift 0.000 ms"
