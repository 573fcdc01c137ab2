"""kill -9 the collector mid-write, again and again: the database stays whole."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

APP_SRC = Path(__file__).resolve().parent.parent / "src"
NODES = 6


def metrics_server():
    """Six nodes' worth of exposition text, with counters that keep moving."""
    count = {"n": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            count["n"] += 1
            lines = ['vcamon_temperature_celsius{sensor="Core %d"} %d' % (c, 40 + (count["n"] + c) % 50)
                     for c in range(4)]
            lines += ["vcamon_package_power_watts %d" % (20 + count["n"] % 20),
                      'vcamon_power_limit_watts{constraint="long_term"} 35.0',
                      'vcamon_throttle_events_total{scope="core",id="0:1"} %d' % (count["n"] // 7)]
            body = ("\n".join(lines) + "\n").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stored_rows(db):
    if not db.exists():
        return 0
    con = sqlite3.connect(str(db), timeout=30)
    try:
        return con.execute("SELECT count(*) FROM scrapes").fetchone()[0]
    except sqlite3.OperationalError:     # the collector has not made its tables yet
        return 0
    finally:
        con.close()


def wait_for_new_rows(db, before, proc, seconds=120):
    """Until the collector has stored rows beyond `before`: a busy machine makes this slower, never wrong."""
    deadline = time.monotonic() + seconds
    while stored_rows(db) <= before:
        assert proc.poll() is None, "the collector exited with %s" % proc.returncode
        assert time.monotonic() < deadline, "the collector stored nothing in %d s" % seconds
        time.sleep(0.05)


def test_collector_survives_kill_9_mid_write(tmp_path):
    server = metrics_server()
    url = "http://127.0.0.1:%d/metrics" % server.server_address[1]
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"node": "vca-node%d" % i, "url": url} for i in range(NODES)]))
    db = tmp_path / "vcamon.db"
    env = dict(os.environ, PYTHONPATH=str(APP_SRC))
    cmd = [sys.executable, "-m", "vcamon", "collector", "--db", str(db), "--targets", str(targets),
           "--interval", "0.02", "--listen", ""]
    rng = random.Random(9)
    wal_left = 0
    for _ in range(6):
        before = stored_rows(db)
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_new_rows(db, before, proc)        # it is writing, however long its start took
        time.sleep(rng.random() * 0.3)             # then somewhere in its stream of write transactions
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wal = Path(str(db) + "-wal")
        wal_left += wal.exists() and wal.stat().st_size > 0   # killed with un-checkpointed writes
    server.shutdown()

    con = sqlite3.connect(str(db))
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rounds = con.execute("SELECT ts, count(*) FROM scrapes GROUP BY ts").fetchall()
    assert len(rounds) >= 3                        # rounds within one second share a timestamp
    assert {n for _, n in rounds} == {NODES}       # each round is all six nodes or none
    # Every stored sample belongs to a stored round.
    assert con.execute("SELECT count(*) FROM samples WHERE ts NOT IN (SELECT ts FROM scrapes)").fetchone()[0] == 0
    assert wal_left == 6
    # And a collector starts on it again.
    before = stored_rows(db)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for_new_rows(db, before, proc)
    proc.terminate()
    proc.wait()


def test_sigusr1_starts_a_round_now_and_fleet_waits_for_it(tmp_path):
    """The fleet report's way to a fresh page: SIGUSR1, then `vcamon fleet --newer-than` that moment."""
    server = metrics_server()
    url = "http://127.0.0.1:%d/metrics" % server.server_address[1]
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"node": "vca-node0", "url": url}]))
    config = tmp_path / "fleet.json"
    config.write_text(json.dumps({"services": [{"job": "smem", "node": "vca-host", "url": url}]}))
    db = tmp_path / "vcamon.db"
    env = dict(os.environ, PYTHONPATH=str(APP_SRC))
    fleet_cmd = [sys.executable, "-m", "vcamon", "fleet", "--db", str(db), "--json"]
    proc = subprocess.Popen([sys.executable, "-m", "vcamon", "collector", "--db", str(db), "--targets",
                             str(targets), "--fleet", str(config), "--interval", "3600", "--listen", ""], env=env)
    try:
        wait_for_new_rows(db, 0, proc)
        # the first round, at the start (the next would be in an hour); its fleet part comes last
        first = json.loads(subprocess.check_output([*fleet_cmd, "--newer-than", "0", "--wait", "120"],
                                                   env=env))["scraped_at"]
        asked = first + 1
        while time.time() < asked:              # a round that began at `asked` is one the signal started
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        out = subprocess.run([*fleet_cmd, "--newer-than", str(asked), "--wait", "120"], env=env,
                             capture_output=True, text=True, check=True)
        assert out.stderr == ""
        assert json.loads(out.stdout)["scraped_at"] >= asked
        # Nothing asks for another: the wait ends at its bound and says the page is older.
        out = subprocess.run([*fleet_cmd, "--newer-than", str(int(time.time()) + 5), "--wait", "0.5"], env=env,
                             capture_output=True, text=True, check=True)
        assert "no collector round since" in out.stderr
        assert json.loads(out.stdout)["scraped_at"] >= asked
    finally:
        proc.kill()
        proc.wait()
        server.shutdown()
