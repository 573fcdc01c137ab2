"""Leases against a real HAProxy (Debian's haproxy, its admin socket): a lease drains its nodes' LLM
workers, its end returns them, an expired lease is noticed, a restarted smem still returns what it
drained, and a worker drained by hand or a node with no worker is left alone. A leased worker put back
into service behind smem's back (a restarted HAProxy that lost its server states, a benchmark's clean-up)
is drained again on the next pass: smem reads HAProxy's state, not only its own table."""

from __future__ import annotations

import csv
import shutil
import subprocess
import time

import pytest

from conftest import lane_settings
from smem import haproxy
from smem.lanes import Lanes
from smem.leases import Leases
from smem.service import open_db

# The lanes' URLs are never called here: only HAProxy's state is looked at.
LANES = ({"i0": {"embed": "http://127.0.0.1:9/"}, "i1": {"embed": "http://127.0.0.1:9/"}},
         {"b0": {"embed": "http://127.0.0.1:9/"}})


CONFIG = """
global
    stats socket {sock} mode 600 level admin
defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
backend llm_workers
    server i0 127.0.0.1:9
    server i1 127.0.0.1:9
"""  # b0 runs no worker


class HAProxy:
    """Debian's haproxy on an admin socket in tmp_path; restart() is a new process with no saved state."""

    def __init__(self, tmp_path):
        self.sock = tmp_path / "admin.sock"
        self.cfg = tmp_path / "haproxy.cfg"
        self.cfg.write_text(CONFIG.format(sock=self.sock))
        self.p = None
        self.start()

    def start(self):
        self.p = subprocess.Popen([shutil.which("haproxy") or "haproxy", "-db", "-f", str(self.cfg)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while not self.sock.exists():
            assert self.p.poll() is None, self.p.stderr.read().decode()
            assert time.monotonic() < deadline, "haproxy never opened its admin socket"
            time.sleep(0.05)

    def stop(self):
        self.p.terminate()
        self.p.wait(timeout=30)
        self.sock.unlink(missing_ok=True)

    def restart(self):
        self.stop()
        self.start()


@pytest.fixture
def haproxy_process(tmp_path):
    h = HAProxy(tmp_path)
    yield h
    h.stop()


@pytest.fixture
def proxy(haproxy_process):
    return str(haproxy_process.sock)


def states(sock: str) -> dict:
    rows = csv.DictReader(haproxy.command(sock, "show stat").lstrip("# ").splitlines())
    return {r["svname"]: r["status"] for r in rows if r["pxname"] == "llm_workers" and r["svname"] != "BACKEND"}


def smem(tmp_path, sock):
    settings = lane_settings(*LANES, haproxy_socket=sock)
    db = open_db(str(tmp_path / "smem.db"), settings)
    leases = Leases(db, Lanes(settings))
    drain = haproxy.WorkerDrain(db, sock, settings.haproxy_backend, leases.live_nodes)
    leases.on_change = drain.reconcile
    return leases, drain, db


def test_a_lease_drains_its_nodes_workers_and_its_release_returns_them(tmp_path, proxy):
    leases, _, db = smem(tmp_path, proxy)
    assert states(proxy) == {"i0": "no check", "i1": "no check"}
    lease = leases.create(["i0", "b0"], "render", 60)
    assert states(proxy) == {"i0": "DRAIN", "i1": "no check"}     # b0 has no worker: nothing to drain
    assert {r["node"] for r in db.rows("SELECT node FROM worker_drains")} == {"i0"}
    leases.release(lease["id"])
    assert states(proxy) == {"i0": "no check", "i1": "no check"}
    assert db.rows("SELECT node FROM worker_drains") == []


def test_an_expired_lease_is_noticed_and_a_restart_still_returns_what_smem_drained(tmp_path, proxy):
    leases, _, _ = smem(tmp_path, proxy)
    leases.create(["i1"], "render", 1.0)
    assert states(proxy)["i1"] == "DRAIN"
    time.sleep(1.2)
    # smem restarted after the lease expired: the new process returns the worker on its first pass.
    _, drain2, _ = smem(tmp_path, proxy)
    drain2.reconcile()
    assert states(proxy)["i1"] == "no check"


def test_a_worker_drained_by_hand_stays_drained(tmp_path, proxy):
    leases, _, _ = smem(tmp_path, proxy)
    assert haproxy.command(proxy, "set server llm_workers/i1 state drain") == ""   # an operator's
    lease = leases.create(["i0"], "render", 60)
    leases.release(lease["id"])
    assert states(proxy) == {"i0": "no check", "i1": "DRAIN"}


def test_haproxy_down_loses_nothing_and_the_next_pass_catches_up(tmp_path, proxy):
    settings = lane_settings(*LANES, haproxy_socket=str(tmp_path / "nowhere.sock"))
    db = open_db(str(tmp_path / "smem.db"), settings)
    leases = Leases(db, Lanes(settings))
    gone = haproxy.WorkerDrain(db, settings.haproxy_socket, "llm_workers", leases.live_nodes)
    leases.on_change = gone.reconcile
    leases.create(["i0"], "render", 60)            # the socket is missing: logged, the lease stands
    assert db.rows("SELECT node FROM worker_drains") == [] and leases.live_nodes() == {"i0"}
    haproxy.WorkerDrain(db, proxy, "llm_workers", leases.live_nodes).reconcile()
    assert states(proxy)["i0"] == "DRAIN"


def test_the_syncer_returns_a_worker_when_its_lease_expires(tmp_path, proxy):
    leases, drain, _ = smem(tmp_path, proxy)
    leases.create(["i0"], "render", 1.0)
    assert states(proxy)["i0"] == "DRAIN"
    syncer = haproxy.Syncer(drain, 0.1)
    syncer.start()
    try:
        deadline = time.monotonic() + 30
        while states(proxy)["i0"] == "DRAIN":
            assert time.monotonic() < deadline, "the expired lease's worker was never returned"
            time.sleep(0.1)
    finally:
        syncer.stop()
        syncer.join(timeout=10)
    assert states(proxy)["i0"] == "no check"


def test_a_leased_worker_back_in_service_after_a_restart_is_drained_again(tmp_path, haproxy_process):
    sock = str(haproxy_process.sock)
    leases, drain, db = smem(tmp_path, sock)
    lease = leases.create(["i0"], "render", 60)
    assert states(sock)["i0"] == "DRAIN"
    haproxy_process.restart()            # no server state kept: every server starts ready
    assert states(sock)["i0"] == "no check"
    drain.reconcile()                    # the syncer's next pass
    assert states(sock)["i0"] == "DRAIN"
    assert {r["node"] for r in db.rows("SELECT node FROM worker_drains")} == {"i0"}
    leases.release(lease["id"])          # and it is still smem's to return
    assert states(sock)["i0"] == "no check"


def test_a_leased_worker_set_ready_behind_smems_back_is_drained_again(tmp_path, proxy):
    leases, drain, _ = smem(tmp_path, proxy)
    leases.create(["i1"], "render", 60)
    assert haproxy.command(proxy, "set server llm_workers/i1 state ready") == ""   # a benchmark's clean-up
    drain.reconcile()
    assert states(proxy)["i1"] == "DRAIN"


def test_a_worker_an_operator_drained_before_the_lease_stays_drained_after_it(tmp_path, proxy):
    leases, _, db = smem(tmp_path, proxy)
    assert haproxy.command(proxy, "set server llm_workers/i0 state maint") == ""
    lease = leases.create(["i0"], "render", 60)
    assert db.rows("SELECT node FROM worker_drains") == []      # not smem's drain: never smem's to return
    leases.release(lease["id"])
    assert states(proxy)["i0"] == "MAINT"


def test_a_backend_haproxy_does_not_have_is_logged_and_nothing_recorded(tmp_path, proxy, caplog):
    settings = lane_settings(*LANES, haproxy_socket=proxy)
    db = open_db(str(tmp_path / "smem.db"), settings)
    leases = Leases(db, Lanes(settings))
    wrong = haproxy.WorkerDrain(db, proxy, "no_such_backend", leases.live_nodes)
    leases.on_change = wrong.reconcile
    leases.create(["i0"], "render", 60)
    assert db.rows("SELECT node FROM worker_drains") == []
    assert "Can't find backend" in caplog.text
