"""The coordinator: the one long-running process on the host that drives jobs kept in SQLite.

A submitted job gets a lease on its nodes (smem), its own queue farm.job.<id>, add_consumer on its
nodes' workers, and one message per chunk. The workers' reports come back through one durable queue;
each is applied to the database (farm.statemachine) and acked after the commit. What a change
decides is written in its transaction and carried out here after the commit, at every tick and at
start-up (README "Crash safety"): attempts to publish (farm.broker_control), outbox rows (revokes, consumer
cancels), nodes to give back (farm.leases), joins to run (farm.join_runner). Only one coordinator runs per
database (a file lock).
"""

from __future__ import annotations

import fcntl
import json
import logging
import threading
import time

import httpx
from kombu import Queue

from farm import tasks
from farm.broker_control import BrokerControl
from farm.config import Settings
from farm.db import DB, FINAL, LIVE
from farm.gc import free_gib
from farm.join_runner import Joins
from farm.leases import LeaseClient, LeaseConflict, LeaseError, LeaseKeeper
from farm.statemachine import StateMachine

log = logging.getLogger("farm.coordinator")


def verified_text(v: dict) -> str:
    frames = "verified: %s frames" % v.get("frames")
    if v.get("offsetMs") is None:
        return frames + ", audio: not checked (--verify checks it)"
    return frames + ", audio offset %.3f ms, drift %.3f ms" % (v["offsetMs"], v.get("driftMs") or 0.0)


def boot_time() -> float:
    """When this host booted (the kernel's btime)."""
    with open("/proc/stat") as f:
        return float(next(line.split()[1] for line in f if line.startswith("btime ")))


class Stopped(Exception):
    """The coordinator was told to stop while it waited for the broker."""


class Coordinator:
    def __init__(self, settings: Settings, *, leases: LeaseClient | None = None, joins: Joins | None = None,
                 fault=None):
        """fault(point): called at each named step of a job's life (`begin:running`, `report:applied`, ...);
        the crash tests pass one that kills the process there (tests/coordinator_main.py)."""
        self.fault = fault or (lambda point: None)
        self.s = settings
        self.db = DB(settings.db_path)
        self._lock = open(str(settings.db_path) + ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit("another coordinator holds %s" % settings.db_path) from None
        self.app = tasks.configure(settings)
        token = settings.smem_token()
        client = leases or (LeaseClient(settings.smem_url, token, timeout=settings.lease_call_timeout_s,
                                        take_timeout=settings.lease_take_timeout_s) if token else None)
        self.no_leases_note = None if client else (
            "no smem configured (smem_url / smem_token_file): using the farm's nodes without leases")
        self.sm = StateMachine(settings, self.db)
        self.broker = BrokerControl(settings, self.app)
        self.leases = LeaseKeeper(settings, self.db, client)
        self.joiner = joins or Joins(settings)
        self.due: dict[tuple[str, str], float] = {}   # (what, job) -> when
        self.up_since = time.time()
        self.reports_q = Queue(settings.reports_queue, tasks.reports_exchange(settings),
                               routing_key=settings.reports_queue)
        self.refused_reports = 0
        self.unapplied: dict[tuple, int] = {}   # a report's failed applies, by (attempt, event, ts)

    # -- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        self.up_since = time.time()
        if self.no_leases_note:
            log.warning(self.no_leases_note)
        self.recover()
        conn = self.app.connection_for_read(heartbeat=self.s.broker_heartbeat)   # a silent broker is a lost one
        last_tick = 0.0

        def stop_waiting():          # kombu calls it while it waits for the broker: a stop ends the wait
            if stop.is_set():
                raise Stopped

        while not stop.is_set():
            try:
                conn.ensure_connection(max_retries=None, interval_max=5, callback=stop_waiting)
                if self.sm.broker_back(time.time()):   # README "Whose fault"
                    self.up_since = time.time()        # the reports of the outage's length were not sent
                with conn.Consumer([self.reports_q], callbacks=[self._on_report], accept=["json"],
                                   prefetch_count=100):
                    while not stop.is_set():
                        try:
                            conn.drain_events(timeout=self.s.poll_interval_s)
                        except TimeoutError:
                            pass
                        conn.heartbeat_check()
                        if time.monotonic() - last_tick >= self.s.poll_interval_s:
                            self.tick()
                            last_tick = time.monotonic()
            except Stopped:
                break
            except conn.recoverable_connection_errors + conn.recoverable_channel_errors as e:
                log.warning("broker connection lost (%s); reconnecting", e)
                self.sm.broker_lost(time.time())
                conn = conn.clone()
        conn.release()
        self.joiner.stop()

    def _on_report(self, body: dict, message) -> None:
        user = message.properties.get("user_id")
        node = body.get("node") if isinstance(body, dict) else None
        if not node or user != self.s.node_user(str(node)):
            self.refused_reports += 1
            log.warning("report refused (%d so far): it says node %r, but the broker user that sent it is %r, not %r",
                        self.refused_reports, node, user, self.s.node_user(str(node)) if node else "-")
            message.ack()
            return
        try:
            self.sm.apply(body)
            self.fault("report:applied")
            if body.get("event") in ("failed", "lost"):      # only a failure ends a job from a report
                job = self.db.job(body.get("job", ""))
                if job and job["state"] in FINAL:
                    self.fault("end:recorded")
        except Exception:   # SQLite busy, a full disk: back to the queue, and applied again later
            seen = (body.get("attempt"), body.get("event"), body.get("ts"))
            self.unapplied[seen] = self.unapplied.get(seen, 0) + 1
            if self.unapplied[seen] >= self.s.report_tries:
                log.exception("report %r not applied %d times (report_tries): dropped", body, self.unapplied.pop(seen))
                message.ack()
                return
            log.exception("report %r not applied; requeued", body)
            time.sleep(self.s.report_retry_s)
            message.requeue()
            return
        self.unapplied.pop((body.get("attempt"), body.get("event"), body.get("ts")), None)
        message.ack()

    def tick(self) -> None:
        now = time.time()
        if self._due("alive", "", 10.0):
            self.sm.alive(now)
        self.apply_outbox()
        self.sm.settle(now)
        self.leases.sweep()
        for jid, outcome in self.joiner.poll():
            job = self.db.job(jid)
            if job and job["state"] == "joining":
                self._joined(job, outcome)
        for row in self.db.rows("SELECT id FROM jobs WHERE state IN ('submitted','running','joining')"
                                " OR (state IN ('done','failed','cancelled') AND nodes_released=0)"):
            job = self.db.job(row["id"])
            try:
                self._tick_job(job, now)
            except Exception:
                log.exception("job %s", job["id"])

    def _tick_job(self, job: dict, now: float) -> None:
        jid, state = job["id"], job["state"]
        if state not in LIVE and not job["nodes_released"]:   # not given back yet (smem was down, say)
            if self.leases.busy(jid, "release") or self._due("release", jid, self.s.lease_retry_s):
                self.release_nodes(job)
        if state in FINAL:
            return
        if job["cancel_requested"] and state in LIVE:
            return self.end(job, "cancelled", "cancelled")
        if state == "joining":
            return self._tick_joining(job)
        if state == "submitted":
            if self._join_if_rendered(job):   # its last chunks ended after the lease was lost: none needed
                return
            if self.leases.waiting(jid) or self._due("begin", jid, self.s.lease_retry_s):
                self.begin(job)
            return
        self._tick_running(job, now)

    def _tick_joining(self, job: dict) -> None:
        jid = job["id"]
        if job["cancel_requested"]:
            self.joiner.cancel(jid)
            return self.sm.finish(job, "cancelled", "cancelled while joining", None)
        if (job.get("join_after") or 0) > time.time():      # a failed join's backoff
            return None
        chunks = self.db.rows("SELECT idx, video, audio FROM chunks WHERE job_id=? ORDER BY idx", (jid,))
        return self.joiner.want(job, chunks)

    def _join_if_rendered(self, job: dict) -> bool:
        """Every chunk done: the job joins, its nodes given back first."""
        jid = job["id"]
        if self.db.one("SELECT count(*) AS n FROM chunks WHERE job_id=? AND state!='done'", (jid,))["n"]:
            return False
        self.sm.joining(jid)
        self.fault("joining:recorded")
        self.release_nodes(self.db.job(jid))
        return True

    def _tick_running(self, job: dict, now: float) -> None:
        jid = job["id"]
        if self._join_if_rendered(job):
            return
        if job.get("paused") and self._due("space", jid, self.s.space_check_s):
            low = [w for w in (self.s.parts_dir, self.s.output_dir) if free_gib(w) < self.s.min_free_gib]
            if not low:
                self.sm.resume(jid, "min_free_gib (%g) free again" % self.s.min_free_gib)
                job = self.db.job(jid)
        self.publish_pending(job)           # what a failed publish left (the broker was away, say)
        for a, why, timed_out in self.sm.stuck(job, now, now - self.up_since):
            self.sm.given_up(job, a, why, timed_out=timed_out)
        self.apply_outbox()
        if self.db.job(jid)["state"] not in LIVE:   # a give-up hit the cap: ended
            return
        if self.leases.busy(jid, "renew") or self._due("renew", jid, self.s.lease_renew_s):   # at once after a
            # restart, then every renew_s; its answer collected at the ticks after
            lost = self.leases.renew(jid)
            if lost:
                self.sm.lease_lost(job, *lost)
                self.apply_outbox()
        if self.db.job(jid)["state"] == "running" and self._due("reconcile", jid, self.s.reconcile_interval_s):
            self.add_consumers(job, reply=False)

    def _due(self, what: str, jid: str, every: float) -> bool:
        now = time.monotonic()
        if self.due.get((what, jid), 0.0) > now:
            return False
        self.due[(what, jid)] = now + every
        return True

    # -- start-up ---------------------------------------------------------------------------------
    def recover(self) -> None:
        """What the last run decided and did not do is done first (the outbox); then jobs no longer
        live give their leases and consumers back; live ones go on."""
        self.sm.started_after_reboot(time.time(), boot_time())
        self.apply_outbox()
        for row in self.db.rows("SELECT id FROM jobs WHERE nodes_released=0 AND (state IN ('done','failed',"
                                "'cancelled','joining') OR (cancel_requested=1 AND state IN ('submitted','running')))"):
            job = self.db.job(row["id"])
            if job["state"] in LIVE:
                self.end(job, "cancelled", "cancelled (while the coordinator was down)")
            else:
                self.db.event(job["id"], "coordinator start: giving back the nodes of a job no longer live")
                self.release_nodes(job)
        self.leases.sweep_wanted = True   # smem's leases for farm jobs that farm.db does not hold: released
        for row in self.db.rows("SELECT id FROM jobs WHERE state='running'"):
            job = self.db.job(row["id"])
            self.db.event(job["id"], "coordinator start: resuming")
            self.publish_pending(job)

    # -- a job's life ----------------------------------------------------------------------------
    def begin(self, job: dict) -> None:
        jid, nodes = job["id"], [n for n in job["nodes"] if n not in self.s.never_lend]
        if self.leases.client:
            try:
                if self.leases.take(jid, nodes) is None:
                    return           # under way (smem drains the nodes' calls first): a next tick collects it
            except LeaseConflict as e:
                return self.db.event(jid, "waiting for nodes: %s" % e)
            except (LeaseError, httpx.HTTPError) as e:
                return self.db.event(jid, "waiting for smem: %s" % e)
        else:
            self.db.event(jid, self.no_leases_note)
        self.broker.declare_queue(jid)
        self.sm.running(jid)
        self.fault("begin:running")
        self.due[("renew", jid)] = time.monotonic() + self.s.lease_renew_s
        self.add_consumers(job, reply=True)
        self.publish_pending(job)

    def publish_pending(self, job: dict) -> None:
        """Attempts recorded but not yet on the broker; one that fails to go is tried again at the next
        tick. A crash between the publish and the mark publishes one twice: harmless, the first `done`
        of a chunk counts and the join is by index. Each goes with the workers' time limits (the cap:
        README "Time limits that learn") and the nodes it should avoid."""
        if job.get("paused"):       # the host's disk is full: nothing goes out until it has room again
            return
        speed = None
        for a in self.db.rows("SELECT a.id, a.idx, a.priority, a.key, c.first, c.last FROM attempts a JOIN chunks c"
                              " ON c.job_id=a.job_id AND c.idx=a.idx WHERE a.job_id=? AND a.published=0"
                              " AND a.state='queued' ORDER BY a.n, a.idx", (job["id"],)):
            kwargs = {"job": job["id"], "index": a["idx"], "first": a["first"], "last": a["last"], "spec": job["spec"],
                      "key": a["key"]}
            avoid = self._avoid(job, a["idx"])
            if avoid:
                # while another node may free up: a chunk's expected render at the job's speed, and then some
                if speed is None:
                    speed = self.sm.job_speed(self.db.c, job)[0]
                kwargs["avoid"] = avoid
                kwargs["avoid_for_s"] = self.s.silent_after_s + 2 * speed * (a["last"] - a["first"] + 1)
            try:
                self.broker.publish(a["id"], job["id"], kwargs, priority=a["priority"],
                                    limits=self.s.worker_limits())
            except Exception as e:
                log.warning("job %s: attempt %s not published (%s: %s); trying again", job["id"], a["id"],
                            type(e).__name__, e)
                return
            self.db.c.execute("UPDATE attempts SET published=1, avoid=? WHERE id=?",
                              (json.dumps(avoid) if avoid else None, a["id"]))

    def _avoid(self, job: dict, idx: int) -> list[str]:
        """Every node charged with a failure of this chunk, while another node of the job, not
        blocklisted, answers a ping; else (no other node left) none: any node may take it."""
        failed = self.sm.failed_nodes(job["id"], idx)
        others = [n for n in self.sm.nodes_for(job) if n not in failed]
        if not failed or not others:
            return []
        return failed if self.broker.any_alive(others) else []

    def apply_outbox(self) -> None:
        """The broker-side steps decided in a transaction: each applied, then marked done. Applying one
        twice does nothing more (a revoke, a cancel_consumer)."""
        for row in self.db.rows("SELECT * FROM outbox WHERE done_at IS NULL ORDER BY id"):
            args = json.loads(row["args"])
            try:
                if row["action"] == "revoke":
                    self.broker.revoke(args["ids"])
                elif row["action"] == "cancel_consumers":
                    self.cancel_consumers(row["job_id"], args["nodes"])
            except Exception as e:
                log.warning("job %s: %s not done yet (%s: %s)", row["job_id"], row["action"], type(e).__name__, e)
                return
            self.db.c.execute("UPDATE outbox SET done_at=? WHERE id=?", (time.time(), row["id"]))

    def add_consumers(self, job: dict, *, reply: bool) -> None:
        nodes = self.sm.nodes_for(job)
        if not nodes:
            return
        with self.db.tx() as c:
            c.executemany("INSERT OR IGNORE INTO consumers(job_id, node) VALUES (?,?)", [(job["id"], n) for n in nodes])
        seen = self.broker.add_consumers(job["id"], nodes, reply=reply)
        if reply:
            silent = sorted(set(nodes) - set(seen))
            self.db.event(job["id"], "consuming on %s%s" % (
                ", ".join(seen) or "no node yet", "; not answering yet: " + ", ".join(silent) if silent else ""))

    def cancel_consumers(self, jid: str, nodes: list[str]) -> None:
        self.broker.cancel_consumers(jid, nodes)
        self.db.c.executemany("DELETE FROM consumers WHERE job_id=? AND node=?", [(jid, n) for n in nodes])

    def release_nodes(self, job: dict) -> None:
        """Consumers cancelled, the job's queue deleted and its renders stopped, then (only then) its
        lease given back: smem must not lend nodes that may still take or render our chunks."""
        jid = job["id"]
        if not self.leases.busy(jid, "release"):   # under way: the broker's side was done before it began
            # every node of the job, not only those recorded: one that missed a cancel gets it again
            nodes = sorted({r["node"] for r in self.db.rows("SELECT node FROM consumers WHERE job_id=?", (jid,))}
                           | set(job["nodes"]) - set(self.s.never_lend))
            try:
                self.cancel_consumers(jid, nodes)
                self.broker.delete_queue(jid)
                ours = {r["id"] for r in self.db.rows("SELECT id FROM attempts WHERE job_id=?", (jid,))}
                left = self.broker.still_running(ours, nodes)
            except Exception as e:
                return self.db.event(jid, "consumers or queue not cleaned up yet (%s: %s); the lease is kept; trying"
                                     " again" % (type(e).__name__, e))
            if left:
                return self.db.event(jid, "%d of its renders still running (%s); the lease is kept until they stop"
                                     % (len(left), ", ".join(left)))
            self.fault("release:consumers")
        try:
            if not self.leases.release_all(jid):
                return              # under way, off the loop: a next tick collects it
        except (LeaseError, httpx.HTTPError) as e:
            return self.db.event(jid, "lease not released yet (smem: %s); trying again" % e)
        self.db.c.execute("UPDATE jobs SET nodes_released=1 WHERE id=?", (jid,))

    def end(self, job: dict, state: str, reason: str) -> None:
        self.sm.end(job, state, reason)
        self.fault("end:recorded")
        self.apply_outbox()
        self.release_nodes(self.db.job(job["id"]))

    # -- the end: join and verify (farm.join_runner: child processes; the loop goes on meanwhile) -------------
    def _joined(self, job: dict, outcome) -> None:
        if isinstance(outcome, str) or "error" in outcome:
            return self._join_failed(job, outcome if isinstance(outcome, str) else outcome["error"])
        v = outcome["verify"]
        if v.get("ok"):
            self.sm.finish(job, "done", verified_text(v), outcome)
        else:
            self.sm.finish(job, "failed", "verification failed: " + "; ".join(v.get("reasons") or ["not ok"]), outcome)

    def _join_failed(self, job: dict, why: str) -> None:
        """Run again after a backoff, join_attempts in all; then the job fails, its parts kept (README
        "Long joins")."""
        jid, failures = job["id"], (job.get("join_failures") or 0) + 1
        log.error("join of %s (attempt %d of %d): %s", jid, failures, self.s.join_attempts, why)
        wait = self.s.join_backoff_s * 2 ** (failures - 1)
        with self.db.tx() as c:
            c.execute("UPDATE jobs SET join_failures=?, join_after=? WHERE id=?", (failures, time.time() + wait, jid))
            if failures < self.s.join_attempts:
                self.db.event(jid, "join attempt %d of %d failed: %s; again in %g s"
                              % (failures, self.s.join_attempts, why, round(wait, 1)), c)
        if failures >= self.s.join_attempts:
            self.sm.finish(job, "failed", "join failed (%d attempts): %s; its parts are kept (keep_failed_parts_h"
                           " %g): `farm join %s` joins them again, `farm gc --job %s` removes them"
                           % (failures, why, self.s.keep_failed_parts_h, jid, jid), None)
