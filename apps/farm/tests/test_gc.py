"""Retention (farm gc): what ended jobs left is pruned by age and by the free-space floor; live jobs'
files, recent ones and every output stay."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from farm.cli import main
from farm.config import load
from farm.db import DB
from farm.gc import Pruner

HOUR = 3600


@pytest.fixture
def s(tmp_path):
    return load(None, db_path=str(tmp_path / "farm.db"), output_dir=str(tmp_path / "out"),
                work_dir=str(tmp_path / "work"), parts_dir=str(tmp_path / "parts"), min_free_gib=0.0)


def job(s, state: str, ended_h_ago: float | None, bundle: str | None = None) -> str:
    db = DB(s.db_path)
    jid = db.submit({"renderer": "testsrc", "frames": 10, "fps": 30, **({"bundleHash": bundle} if bundle else {})},
                    str(Path(s.output_dir) / "x.mp4"), ["vca-node0"], [(0, 0, 9)], frames=10, fps=30)
    finished = None if ended_h_ago is None else time.time() - ended_h_ago * HOUR
    db.c.execute("UPDATE jobs SET state=?, finished_at=? WHERE id=?", (state, finished, jid))
    for root in (Path(s.parts_dir), Path(s.work_dir) / "verify"):
        (root / jid).mkdir(parents=True)
        (root / jid / "part-00000.ts").write_bytes(b"x" * 1000)
    return jid


def aged(path: Path, hours: float, *, folder: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        path.mkdir() if folder else path.write_bytes(b"t")
    t = time.time() - hours * HOUR
    os.utime(path, (t, t))
    return path


def test_parts_of_jobs_ended_long_ago_go_and_the_rest_stays(s):
    old, recent, live = job(s, "done", 49), job(s, "failed", 1), job(s, "running", None)
    (Path(s.output_dir)).mkdir(parents=True, exist_ok=True)
    output = Path(s.output_dir) / "x.mp4"
    output.write_bytes(b"the owner's")
    aged(output, 1000)
    orphan = aged(Path(s.parts_dir) / "deadbeef", 7, folder=True)               # a job the database does not know
    fresh_orphan = aged(Path(s.parts_dir) / "cafef00d", 1, folder=True)
    done = Pruner(s).run()
    gone = {r["path"] for r in done["removed"]}
    for root in (s.parts_dir, Path(s.work_dir) / "verify"):
        assert str(Path(root) / old) in gone and not (Path(root) / old).exists()
        assert (Path(root) / recent).exists() and (Path(root) / live).exists()
    assert not orphan.exists() and fresh_orphan.exists()
    assert output.read_bytes() == b"the owner's"
    assert done["bytes"] >= 2000


def test_temporaries_go_once_older_than_temp_max_age(s):
    jid = job(s, "running", None)
    half = aged(Path(s.parts_dir) / jid / ".part-00001.123-ab.ts", 7)
    rendering = aged(Path(s.parts_dir) / jid / ".part-00002.124-cd.ts", 0.1)
    killed_join = aged(Path(s.output_dir) / ".x.mp4.abc123", 7, folder=True)
    (killed_join / "videos.txt").write_text("file 'part-00000.ts'\n")
    (killed_join / "audio.wav").write_bytes(b"w" * 100)
    owners = aged(Path(s.output_dir) / ".thumbnails", 7, folder=True)          # not the farm's: kept
    os.utime(killed_join, (time.time() - 7 * HOUR,) * 2)
    staged = aged(Path(s.work_dir) / "bundles" / ".new-42", 7, folder=True)
    Pruner(s).run()
    assert not half.exists() and not killed_join.exists() and not staged.exists() and owners.exists()
    assert rendering.exists() and (Path(s.parts_dir) / jid / "part-00000.ts").exists()


def test_bundles_no_job_used_lately_go(s):
    for name in ("aaa", "bbb", "ccc"):
        aged(Path(s.work_dir) / "bundles" / name, 200, folder=True)
        aged(Path(s.work_dir) / "bundle-tars" / (name + ".tar"), 200)
    running = job(s, "running", None, bundle="aaa")           # in use, by a job begun long ago
    DB(s.db_path).c.execute("UPDATE jobs SET created_at=? WHERE id=?", (time.time() - 300 * HOUR, running))
    job(s, "done", 24, bundle="bbb")                 # used within keep_bundles_h
    Pruner(s).run()
    bundles = Path(s.work_dir) / "bundles"
    assert sorted(p.name for p in bundles.iterdir()) == ["aaa", "bbb"]
    assert not (Path(s.work_dir) / "bundle-tars" / "ccc.tar").exists()


def test_below_the_free_space_floor_the_oldest_ended_jobs_go_first(s):
    s.min_free_gib = 10
    first, second, live = job(s, "done", 10), job(s, "done", 5), job(s, "running", None)
    frees = iter([1, 1, 20, 20])        # below the floor until one job's parts are gone

    Pruner(s, free_gib=lambda where: next(frees)).run()
    assert not (Path(s.parts_dir) / first).exists()
    assert (Path(s.parts_dir) / second).exists() and (Path(s.parts_dir) / live).exists()


def test_dry_run_removes_nothing_and_the_cli_says_what_would_go(s, tmp_path, capsys):
    old = job(s, "done", 100)
    config = tmp_path / "farm.toml"
    config.write_text("".join("%s = %s\n" % (k, json.dumps(getattr(s, k)))
                              for k in ("db_path", "output_dir", "work_dir", "parts_dir", "min_free_gib")))
    assert main(["--config", str(config), "gc", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would remove %s" % (Path(s.parts_dir) / old) in out and (Path(s.parts_dir) / old).exists()
    assert main(["--config", str(config), "gc"]) == 0
    assert "freed 2 paths" in capsys.readouterr().out and not (Path(s.parts_dir) / old).exists()


def test_the_records_of_jobs_ended_long_ago_go_and_the_rest_stay(s):
    """The database and the join logs do not grow for ever (issue 39): a job's rows go keep_records_h
    after its end, outbox rows a day after they were carried out; a dry run only counts them."""
    s.keep_records_h = 100
    old, recent, live = job(s, "done", 101), job(s, "failed", 99), job(s, "running", None)
    db = DB(s.db_path)
    db.c.execute("INSERT INTO outbox(job_id, action, args, created_at, done_at) VALUES (?,?,?,?,?)",
                 (live, "revoke", "{}", time.time() - 2 * 86400, time.time() - 2 * 86400))
    db.c.execute("INSERT INTO outbox(job_id, action, args, created_at, done_at) VALUES (?,?,?,?,NULL)",
                 (live, "revoke", "{}", time.time() - 2 * 86400))
    logs = [aged(Path(s.work_dir) / "joins" / (j + ".log"), 1) for j in (old, recent)]
    counted = Pruner(s, dry_run=True).run()["records"]
    assert counted["jobs"] == 1 and counted["chunks"] == 1 and counted["events"] >= 1
    assert counted["outbox carried out"] == 1 and db.job(old) is not None
    Pruner(s).run()
    assert db.job(old) is None and db.job(recent) and db.job(live)
    assert db.rows("SELECT * FROM chunks WHERE job_id=?", (old,)) == []
    assert db.rows("SELECT * FROM events WHERE job_id=?", (old,)) == []
    assert [r["done_at"] for r in db.rows("SELECT done_at FROM outbox")] == [None]      # only the pending one
    assert not logs[0].exists() and logs[1].exists()
