"""The coordinator's own decisions without a broker: a report it can never apply, the avoid window of
a retry, and outages kept across its restarts (issue 39, point 7)."""

from __future__ import annotations

import time

import pytest

from farm.config import Settings
from farm.coordinator import Coordinator
from farm.db import DB
from farm.statemachine import StateMachine


class Message:
    def __init__(self, node):
        self.properties = {"user_id": "farm-" + node}
        self.acked = self.requeued = 0

    def ack(self):
        self.acked += 1

    def requeue(self):
        self.requeued += 1


class Broker:
    def __init__(self):
        self.published = []

    def publish(self, attempt_id, jid, kwargs, *, priority, limits):
        self.published.append(kwargs)

    def any_alive(self, nodes):
        return bool(nodes)


@pytest.fixture
def coordinator(tmp_path):
    s = Settings(db_path=str(tmp_path / "farm.db"), parts_dir=str(tmp_path / "parts"), report_retry_s=0.0,
                 report_tries=4)
    c = Coordinator(s)
    c.broker = Broker()
    yield c
    c.db.c.close()


def a_job(c, chunks=2):
    jid = c.db.submit({"renderer": "testsrc", "fps": 10, "frames": 10 * chunks}, "out.mp4", ["n0", "n1"],
                      [(i, 10 * i, 10 * i + 9) for i in range(chunks)], frames=10 * chunks, fps=10.0)
    c.sm.running(jid)
    return jid


def test_a_report_that_can_never_be_applied_is_dropped_after_report_tries(coordinator, monkeypatch):
    def broken(r):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(coordinator.sm, "apply", broken)
    body = {"event": "done", "job": "j", "attempt": "j.0.1", "node": "n0", "ts": 1.0}
    m = Message("n0")
    for _ in range(3):
        coordinator._on_report(body, m)
    assert (m.requeued, m.acked) == (3, 0)
    coordinator._on_report(body, m)
    assert (m.requeued, m.acked) == (3, 1) and coordinator.unapplied == {}


def test_a_retry_avoids_its_failed_node_for_the_chunks_expected_render_not_90_s(coordinator):
    c = coordinator
    jid = a_job(c)
    key = c.db.one("SELECT key FROM attempts WHERE job_id=? AND idx=0", (jid,))["key"]
    a = c.db.one("SELECT id FROM attempts WHERE job_id=? AND idx=0", (jid,))["id"]
    c.sm.apply({"event": "started", "job": jid, "attempt": a, "node": "n0", "ts": time.time(), "key": key})
    c.db.c.execute("UPDATE chunks SET state='done', seconds=300 WHERE job_id=? AND idx=1", (jid,))   # 30 s a frame
    c.sm.apply({"event": "failed", "job": jid, "attempt": a, "node": "n0", "ts": time.time(), "key": key,
                "error": "broken"})
    c.publish_pending(c.db.job(jid))
    retry = c.broker.published[-1]
    assert retry["avoid"] == ["n0"] and retry["index"] == 0
    assert retry["avoid_for_s"] == c.s.silent_after_s + 2 * 30.0 * 10
    assert retry["key"] == c.db.one("SELECT key FROM attempts WHERE job_id=? AND idx=0 AND n=2", (jid,))["key"]


def test_outages_outlive_the_coordinator_and_a_host_reboot_is_one(tmp_path):
    s = Settings(db_path=str(tmp_path / "farm.db"), parts_dir=str(tmp_path / "parts"))
    db = DB(s.db_path)
    sm = StateMachine(s, db)
    t0 = time.time()
    sm.alive(t0 - 900)                                   # the last tick before the host went down
    again = StateMachine(s, DB(s.db_path))               # the coordinator after the reboot
    again.started_after_reboot(t0, booted_at=t0 - 60)
    attempt = {"started_at": t0 - 1000}
    assert "the host rebooted" in again._excuse(attempt, t0 + 5)
    assert again._excuse(attempt, t0 + s.outage_grace_s + 5) is None      # only within outage_grace_s of it
    assert again._excuse({"started_at": t0 + 1}, t0 + 5) is None            # started after it: no excuse
    again.alive(t0 + 5)                                  # it ticks
    later = StateMachine(s, DB(s.db_path))
    later.started_after_reboot(t0 + 10, booted_at=t0 - 60)   # a coordinator restart without a reboot: no outage
    assert len(db.rows("SELECT * FROM outages")) == 1


def test_a_second_job_cannot_write_a_live_jobs_output(tmp_path):
    from farm.jobs import submit  # noqa: PLC0415
    s = Settings(db_path=str(tmp_path / "farm.db"), parts_dir=str(tmp_path / "parts"),
                 output_dir=str(tmp_path / "out"))
    spec = {"renderer": "testsrc", "width": 64, "height": 36, "fps": 30, "frames": 60}
    first = submit(s, spec, "x.mp4", ["n0"])
    with pytest.raises(ValueError, match="job %s \\(submitted\\) writes .*x.mp4 already" % first):
        submit(s, spec, "x.mp4", ["n0"])
    DB(s.db_path).c.execute("UPDATE jobs SET state='done' WHERE id=?", (first,))
    submit(s, spec, "x.mp4", ["n0"])                      # a finished job's output may be rendered again
