"""Joins that finish (issue 39, point 4): a failed join is run again after a backoff, join_attempts in
all; a join that runs past its timeout (from the job's length) is killed, its process group too, and
counts as a failed attempt; a failed job's parts are kept (keep_failed_parts_h) and `farm join JOB`
joins them again; `farm gc --job JOB` removes them.

The coordinator here is the real one, driven by its tick() with no broker and no smem: a job whose
chunks are rendered (real testsrc parts) and whose nodes are given back needs neither. Its joins run
through tests/join_faults.py, passed in as the join's command."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
from _engine import processes_naming, wait_for

from farm.cli import main
from farm.config import load
from farm.coordinator import Coordinator
from farm.db import DB
from farm.gc import Pruner
from farm.join_runner import Joins
from farm.render import render_chunk
from mediatools import require

FAULTS = Path(__file__).resolve().parent / "join_faults.py"
FRAMES, FPS, CHUNKS = 60, 30, 3


@pytest.fixture(autouse=True)
def tools():
    require("ffmpeg", "ffprobe")


def settings(tmp_path, **over):
    values = {"db_path": str(tmp_path / "farm.db"), "output_dir": str(tmp_path / "out"),
              "work_dir": str(tmp_path / "work"), "parts_dir": str(tmp_path / "parts"),
              "poll_interval_s": 0.1, "join_backoff_s": 0.2, **over}
    (tmp_path / "farm.toml").write_text("".join("%s = %s\n" % (k, json.dumps(v)) for k, v in values.items()))
    return load(tmp_path / "farm.toml")


def rendered_job(s, *, rendered: int = CHUNKS) -> str:
    """A job whose first `rendered` chunks are rendered (real parts in parts_dir/<job>/) and whose nodes
    are given back: joining once all are, else failed (as a chunk at its cap leaves it)."""
    db = DB(s.db_path)
    size = FRAMES // CHUNKS
    chunks = [(i, i * size, (i + 1) * size - 1) for i in range(CHUNKS)]
    spec = {"renderer": "testsrc", "width": 160, "height": 90, "fps": FPS, "frames": FRAMES}
    jid = db.submit(spec, str(Path(s.output_dir) / "job.mp4"), ["vca-node0"], chunks, frames=FRAMES, fps=FPS)
    for i, first, last in chunks[:rendered]:
        out = render_chunk(spec, i, first, last, Path(s.parts_dir) / jid)
        db.c.execute("UPDATE chunks SET state='done', video=?, audio=? WHERE job_id=? AND idx=?",
                     ("%s/%s" % (jid, Path(out["video"]).name), "%s/%s" % (jid, Path(out["audio"]).name), jid, i))
    db.c.execute("UPDATE jobs SET state=?, nodes_released=1, finished_at=? WHERE id=?",
                 ("joining", None, jid) if rendered == CHUNKS else ("failed", time.time(), jid))
    return jid


def coordinator(s, *join_fault) -> Coordinator:
    return Coordinator(s, joins=Joins(s, argv=[sys.executable, str(FAULTS), *join_fault]))


def run_until_ended(coord: Coordinator, jid: str, timeout: float = 120) -> dict:
    def ended():
        coord.tick()
        job = coord.db.job(jid)
        return job if job["state"] in ("done", "failed", "cancelled") else None
    try:
        return wait_for("job %s to end" % jid, ended, timeout, every=0.1,
                        why=lambda: [e["text"] for e in coord.db.view(jid)["events"]])
    finally:
        coord.joiner.stop()


def events(s, jid: str) -> list[dict]:
    return DB(s.db_path).view(jid)["events"]


def test_a_join_that_fails_once_is_run_again_and_the_job_is_done(tmp_path):
    s = settings(tmp_path, join_attempts=3)
    jid = rendered_job(s)
    job = run_until_ended(coordinator(s, "fail-once", str(tmp_path / "failed-once")), jid)
    assert job["state"] == "done", (job["reason"], events(s, jid))
    assert job["result"]["verify"]["ok"] and job["result"]["join"]["parts"] == CHUNKS
    assert job["join_failures"] == 1 and (tmp_path / "failed-once").exists()
    retried = [e["text"] for e in events(s, jid) if e["text"].startswith("join attempt")]
    assert retried == ["join attempt 1 of 3 failed: the join's process ended (exit 3) without a result; again in 0.2 s"]


def test_a_join_failing_every_attempt_fails_the_job_after_backoffs_and_keeps_its_parts(tmp_path):
    s = settings(tmp_path, join_attempts=3, join_backoff_s=0.5)
    broken = tmp_path / "broken"
    broken.write_text("")
    jid = rendered_job(s)
    job = run_until_ended(coordinator(s, "fail-while", str(broken)), jid)
    assert job["state"] == "failed" and job["join_failures"] == 3
    assert job["reason"].startswith("join failed (3 attempts): the join's process ended (exit 3)")
    assert "farm join %s" % jid in job["reason"] and "farm gc --job %s" % jid in job["reason"]
    tries = [e for e in events(s, jid) if e["text"].startswith("join attempt")]
    assert [e["text"].split(":")[0] for e in tries] == ["join attempt 1 of 3 failed", "join attempt 2 of 3 failed"]
    # the backoff doubles: 0.5 s before the second attempt, 1 s before the third (lower bounds only)
    end = next(e["at"] for e in events(s, jid) if e["text"].startswith("failed: join failed"))
    assert tries[1]["at"] - tries[0]["at"] >= 0.5 and end - tries[1]["at"] >= 1.0
    assert len(list((Path(s.parts_dir) / jid).glob("part-*"))) == 2 * CHUNKS


def test_a_hung_join_is_killed_at_its_timeout_with_its_process_group(tmp_path):
    # the timeout: 2 s + 1 x the job's 2 s (60 frames at 30 fps)
    s = settings(tmp_path, join_attempts=2, join_timeout_floor_s=2.0, join_timeout_factor=1.0)
    jid = rendered_job(s)
    marker = str(tmp_path / "hung-join-child")
    coord = coordinator(s, "hang", marker)
    began = time.time()
    job = run_until_ended(coord, jid, timeout=60)
    assert job["state"] == "failed", job["reason"]
    assert job["reason"].startswith("join failed (2 attempts): it ran past its timeout (4 s: join_timeout_floor_s")
    first = next(e for e in events(s, jid) if e["text"].startswith("join attempt 1 of 2 failed: it ran past"))
    assert first["at"] - began >= 4.0                       # not killed before its timeout
    wait_for("the join's child (its ffmpeg, say) to go with it", lambda: not processes_naming(marker), 10)
    assert coord.joiner.running == {}


def test_farm_join_joins_a_failed_jobs_kept_parts_again(tmp_path, capsys):
    s = settings(tmp_path, join_attempts=1)
    broken = tmp_path / "broken"
    broken.write_text("")
    jid = rendered_job(s)
    coord = coordinator(s, "fail-while", str(broken))
    assert run_until_ended(coord, jid)["state"] == "failed"
    broken.unlink()                                        # whatever broke the join is mended
    assert main(["--config", str(tmp_path / "farm.toml"), "join", jid]) == 0
    assert "joining again" in capsys.readouterr().out
    job = DB(s.db_path).job(jid)
    assert job["state"] == "joining" and job["reason"] is None and job["join_failures"] == 0
    job = run_until_ended(coord, jid)
    assert job["state"] == "done" and job["result"]["verify"]["ok"], job["reason"]
    assert "joining again (farm join)" in [e["text"] for e in events(s, jid)]


def farm_join(tmp_path, jid: str, capsys) -> tuple[int, str]:
    code = main(["--config", str(tmp_path / "farm.toml"), "join", jid])
    return code, capsys.readouterr().err


def test_farm_join_refuses_what_it_cannot_join_and_says_why(tmp_path, capsys):
    s = settings(tmp_path)
    assert farm_join(tmp_path, "nosuch00", capsys) == (2, "farm join: no job nosuch00\n")
    joining = rendered_job(s)
    code, err = farm_join(tmp_path, joining, capsys)
    assert code == 2 and "is joining: only a failed job is joined again" in err
    unrendered = rendered_job(s, rendered=2)
    code, err = farm_join(tmp_path, unrendered, capsys)
    assert code == 2 and "before all its chunks were rendered (not rendered: 2)" in err
    DB(s.db_path).c.execute("UPDATE jobs SET state='failed' WHERE id=?", (joining,))
    assert main(["--config", str(tmp_path / "farm.toml"), "gc", "--job", joining]) == 0
    assert "farm gc --job %s (failed)" % joining in capsys.readouterr().out
    assert not (Path(s.parts_dir) / joining).exists()
    code, err = farm_join(tmp_path, joining, capsys)
    assert code == 2 and "6 of its parts are gone" in err and "submit it again" in err
    assert DB(s.db_path).job(joining)["state"] == "failed"


def test_farm_gc_job_refuses_a_job_in_use(tmp_path, capsys):
    s = settings(tmp_path)
    jid = rendered_job(s)                                  # joining: its parts are being read
    assert main(["--config", str(tmp_path / "farm.toml"), "gc", "--job", jid]) == 2
    assert "is joining: its parts are in use" in capsys.readouterr().err
    assert len(list((Path(s.parts_dir) / jid).glob("part-*"))) == 2 * CHUNKS


def test_a_failed_jobs_parts_are_kept_for_keep_failed_parts_h(tmp_path):
    s = settings(tmp_path, keep_parts_h=48.0, keep_failed_parts_h=720.0, min_free_gib=0.0)
    db = DB(s.db_path)
    ages = {"failed-recent": ("failed", 100), "failed-old": ("failed", 721), "done-old": ("done", 49),
            "cancelled-old": ("cancelled", 49)}
    ids = {}
    for name, (state, hours) in ages.items():
        jid = db.submit({"renderer": "testsrc"}, "x.mp4", ["vca-node0"], [(0, 0, 9)], frames=10, fps=30)
        db.c.execute("UPDATE jobs SET state=?, finished_at=? WHERE id=?", (state, time.time() - hours * 3600, jid))
        (Path(s.parts_dir) / jid).mkdir(parents=True)
        (Path(s.parts_dir) / jid / "part-00000.ts").write_bytes(b"x")
        ids[name] = jid
    Pruner(s).run()
    kept = {name for name, jid in ids.items() if (Path(s.parts_dir) / jid).exists()}
    assert kept == {"failed-recent"}


def test_below_the_floor_a_failed_jobs_parts_go_last(tmp_path):
    s = settings(tmp_path, min_free_gib=10.0)
    db = DB(s.db_path)
    ids = []
    for state, hours in (("failed", 10), ("done", 5)):          # the failed job ended first
        jid = db.submit({"renderer": "testsrc"}, "x.mp4", ["vca-node0"], [(0, 0, 9)], frames=10, fps=30)
        db.c.execute("UPDATE jobs SET state=?, finished_at=? WHERE id=?", (state, time.time() - hours * 3600, jid))
        (Path(s.parts_dir) / jid).mkdir(parents=True)
        ids.append(jid)
    frees = iter([1, 1, 20, 20])         # below the floor until one job's parts are gone
    Pruner(s, free_gib=lambda where: next(frees)).run()
    assert (Path(s.parts_dir) / ids[0]).exists() and not (Path(s.parts_dir) / ids[1]).exists()

