"""The CLI and settings without a broker: node 2 is never lent, unknown settings are refused,
submit records the planned chunks, cancel and status of unknown or finished jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(APP / "src"))

from farm.config import load  # noqa: E402
from farm.db import DB  # noqa: E402


def farm(tmp_path, *args):
    cfg = tmp_path / "farm.toml"
    if not cfg.exists():
        cfg.write_text('db_path = "%s"\noutput_dir = "%s"\n' % (tmp_path / "farm.db", tmp_path / "out"))
    return subprocess.run([sys.executable, "-m", "farm", "--config", str(cfg), *args], capture_output=True,
                          text=True, env={"PYTHONPATH": str(APP / "src"), "PATH": "/usr/bin:/bin"}, check=False)


def spec(tmp_path, frames=300):
    p = tmp_path / "spec.json"
    p.write_text(json.dumps({"renderer": "testsrc", "width": 320, "height": 180, "fps": 30, "frames": frames}))
    return str(p)


def test_a_node_the_config_holds_back_is_never_lent(tmp_path):
    s = load(None, never_lend=["vca-node2"])
    assert "vca-node2" not in s.lendable and "vca-node3" not in s.lendable
    cfg = tmp_path / "farm.toml"
    cfg.write_text('db_path = "%s"\noutput_dir = "%s"\nnever_lend = ["vca-node2"]\n' % (tmp_path / "farm.db",
                                                                                      tmp_path / "out"))
    r = farm(tmp_path, "submit", "--spec", spec(tmp_path), "--out", "x.mp4", "--nodes", "vca-node0", "vca-node2")
    assert r.returncode != 0 and "vca-node2 is never lent" in r.stderr


def test_unknown_settings_are_refused(tmp_path):
    (tmp_path / "bad.toml").write_text("atempts = 3\n")
    with pytest.raises(ValueError, match="unknown key atempts"):
        load(tmp_path / "bad.toml")


def test_submit_records_the_planned_job_and_cancel_needs_a_live_one(tmp_path):
    r = farm(tmp_path, "submit", "--spec", spec(tmp_path), "--out", "x.mp4", "--detach")
    assert r.returncode == 0, r.stderr
    job_id = r.stdout.strip()
    job = DB(tmp_path / "farm.db").view(job_id)
    assert job["job"]["state"] == "submitted" and job["job"]["out"] == str(tmp_path / "out" / "x.mp4")
    assert job["job"]["nodes"] == ["vca-node0", "vca-node1", "vca-node4", "vca-node5"]
    assert [(c["first"], c["last"]) for c in job["chunks"]][:2] == [(0, 29), (30, 59)]   # 10 chunks of 30
    r = farm(tmp_path, "status", job_id)
    assert r.returncode == 0 and "submitted" in r.stdout and "0 / 300 frames" in r.stdout
    r = farm(tmp_path, "cancel", job_id, "--wait", "0")
    assert r.returncode == 0 and "when it runs" in r.stdout          # no coordinator here
    assert farm(tmp_path, "status", "nosuchjob").returncode == 2
    assert farm(tmp_path, "cancel", "nosuchjob").returncode == 2


def test_the_app_holds_no_node_back_of_its_own_and_unknown_nodes_are_refused(tmp_path):
    assert load(None).never_lend == []          # the inventory's choice (farm_never_lend), never the code's
    r = farm(tmp_path, "submit", "--spec", spec(tmp_path), "--out", "x.mp4", "--nodes", "vca-node9", "--detach")
    assert r.returncode != 0 and "vca-node9: not in farm_nodes" in r.stderr


@pytest.mark.parametrize("args, message", [
    (["--spec", "/nonexistent/spec.json"], "No such file"),
    (["--project", "/nonexistent", "--composition", "Hello"], "is not a Remotion project"),
])
def test_bad_submit_input_is_a_clear_error_and_records_nothing(tmp_path, args, message):
    r = farm(tmp_path, "submit", *args, "--out", "x.mp4", "--detach")
    assert r.returncode != 0 and message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "farm.db").exists() or DB(str(tmp_path / "farm.db")).rows("SELECT id FROM jobs") == []


def test_bad_props_json_is_a_clear_error(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "package.json").write_text("{}")
    r = farm(tmp_path, "submit", "--project", str(project), "--composition", "Hello", "--props", "{not json",
             "--out", "x.mp4", "--detach")
    assert r.returncode != 0 and "bad input" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_job_from_a_project_records_its_bundle_time(tmp_path, monkeypatch, capsys):
    from farm import cli, remotion  # noqa: PLC0415 (in-process: job_spec stands in for a Remotion bundle)

    def job_spec(project, composition, props, settings):
        time.sleep(0.2)
        return {"renderer": "remotion", "frames": 90, "fps": 30, "composition": composition, "props": props}
    monkeypatch.setattr(remotion, "job_spec", job_spec)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "package.json").write_text("{}")
    farm(tmp_path, "status")          # writes the config
    assert cli.main(["--config", str(tmp_path / "farm.toml"), "submit", "--project", str(tmp_path / "p"),
                     "--composition", "Hello", "--out", "x.mp4", "--detach"]) == 0
    v = DB(tmp_path / "farm.db").view(capsys.readouterr().out.strip())
    assert 0.2 <= v["job"]["timings"]["bundle_s"] < 5 and v["timings"] == {"bundle_s": v["job"]["timings"]["bundle_s"]}
    r = farm(tmp_path, "status", v["job"]["id"])
    assert "timings" in r.stdout and "bundle 0." in r.stdout, r.stdout


def test_a_cancel_that_comes_too_late_says_so(tmp_path):
    """Cancel requested while the last chunk's report was on its way: the job joins and ends done."""
    r = farm(tmp_path, "submit", "--spec", spec(tmp_path), "--out", "x.mp4", "--detach")
    job_id = r.stdout.strip()
    db = DB(tmp_path / "farm.db")
    db.c.execute("UPDATE jobs SET state='running' WHERE id=?", (job_id,))

    def coordinator():           # what the coordinator does meanwhile: joining, then done, once the cancel is in
        deadline = time.monotonic() + 60          # (a fixed sleep raced the CLI's start on a busy machine)
        while not db.c.execute("SELECT cancel_requested FROM jobs WHERE id=?", (job_id,)).fetchone()[0]:
            assert time.monotonic() < deadline, "the cancel never reached the database"
            time.sleep(0.05)
        db.c.execute("UPDATE jobs SET state='done', reason='verified', nodes_released=1 WHERE id=?", (job_id,))
    t = threading.Thread(target=coordinator)
    t.start()
    r = farm(tmp_path, "cancel", job_id, "--wait", "20")
    t.join()
    assert r.returncode == 1 and "ended done before the cancel took: verified" in r.stdout, (r.stdout, r.stderr)


def test_a_coordinator_waiting_for_its_broker_stops_on_sigterm(tmp_path):
    """systemctl stop while the broker is away: the coordinator leaves its wait, not after TimeoutStopSec."""
    import signal  # noqa: PLC0415
    import socket  # noqa: PLC0415

    with socket.socket() as s:          # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "farm.toml"
    cfg.write_text('db_path = "%s"\nbroker_url = "amqp://guest:guest@127.0.0.1:%d//"\n' % (tmp_path / "farm.db", port))
    p = subprocess.Popen([sys.executable, "-m", "farm", "--config", str(cfg), "coordinator"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={"PYTHONPATH": str(APP / "src"), "PATH": "/usr/bin:/bin"})
    try:
        # its first word comes from run(), after its SIGTERM handler is in place (on a busy machine the
        # imports alone can take longer than any fixed sleep)
        assert "no smem configured" in p.stdout.readline()
        time.sleep(1)                    # in its reconnect loop by now
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
    finally:
        p.kill()


def test_celery_stays_out_of_the_processes_that_run_no_task():
    """The CLI's submit and status, the API and the join's child load no Celery (issue 39, point 8)."""
    code = "import sys, farm.cli, farm.api, farm.join_runner, farm.jobs; print(sorted(m for m in sys.modules if" \
           " m.split('.')[0] in ('celery', 'kombu', 'billiard')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={"PYTHONPATH": str(APP / "src"), "PATH": "/usr/bin:/bin"})
    assert r.stdout.strip() == "[]", r.stdout
