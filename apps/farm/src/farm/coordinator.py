"""The coordinator: the one long-running process on the host that drives jobs kept in SQLite.

A submitted job gets a lease on its nodes (smem), its own queue farm.job.<id>, add_consumer on its
nodes' workers, and one message per chunk. The workers' reports come back through one durable queue;
each is applied to the database and acked after the commit. A failed or lost attempt counts against
the node that started it (blocklist) and the chunk (attempts cap); under the cap the chunk is
published again as a new attempt, around the node that failed it while another node of the job
answers; an attempt silent for silent_after_s is given up the same way (revoked). When every chunk is
done the nodes are given back, then the parts are joined and verified. Only one coordinator runs per
database (a file lock).
"""

from __future__ import annotations

import fcntl
import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
from kombu import Queue

from farm import join as media_join
from farm import render as media_render
from farm import tasks
from farm import verify as media_verify
from farm.config import Settings
from farm.db import DB, FINAL, LIVE
from farm.leases import LeaseClient, LeaseConflict, LeaseError
from farm.tasks import QUEUE_ARGS, queue_of

log = logging.getLogger("farm.coordinator")
HOLDER = "farm job "
# A chunk whose worker was lost jumps the queue: the job waits for it, and that node cannot take it
# again. One that failed goes to the back, so a broken node meets other chunks and is blocklisted.
LOST_PRIORITY = 9


def verified_text(v: dict) -> str:
    frames = "verified: %s frames" % v.get("frames")
    if v.get("offsetMs") is None:
        return frames + ", audio: not checked (--verify checks it)"
    return frames + ", audio offset %.3f ms, drift %.3f ms" % (v["offsetMs"], v.get("driftMs") or 0.0)


def worker_name(node: str) -> str:
    return "farm@" + node


class Coordinator:
    def __init__(self, settings: Settings, *, leases: LeaseClient | None = None):
        self.s = settings
        self.db = DB(settings.db_path)
        self._lock = open(str(settings.db_path) + ".lock", "w")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit("another coordinator holds %s" % settings.db_path) from None
        self.app = tasks.configure(settings)
        token = settings.smem_token()
        self.leases = leases or (LeaseClient(settings.smem_url, token) if token else None)
        self.no_leases_note = None if self.leases else (
            "no smem configured (smem_url / smem_token_file): using the farm's nodes without leases")
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="farm-join")
        self.joins: dict[str, Future] = {}
        self.due: dict[tuple[str, str], float] = {}   # (what, job) -> when
        self.up_since = time.time()
        self.reports_q = Queue(settings.reports_queue, tasks.reports_exchange(settings),
                               routing_key=settings.reports_queue)
        self.refused_reports = 0
        self.outage_since: float | None = None         # the coordinator's own broker connection is down since
        self.outages: list[tuple[float, float]] = []   # (lost, back) of each outage it saw

    def fault(self, point: str) -> None:
        """A named step of a job's life; the tests' wrapper (tests/coordinator_main.py) kills the process
        here. Nothing in production."""

    # -- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        stop = stop or threading.Event()
        self.up_since = time.time()
        if self.no_leases_note:
            log.warning(self.no_leases_note)
        self.recover()
        conn = self.app.connection_for_read()
        last_tick = 0.0
        while not stop.is_set():
            try:
                conn.ensure_connection(max_retries=None, interval_max=5)
                if self.outage_since is not None:     # the broker is back: README "Whose fault"
                    self.outages.append((self.outage_since, time.time()))
                    self.outage_since = None
                    self.up_since = time.time()       # the reports of the outage's length were not sent
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
            except conn.recoverable_connection_errors + conn.recoverable_channel_errors as e:
                log.warning("broker connection lost (%s); reconnecting", e)
                if self.outage_since is None:
                    self.outage_since = time.time()
                conn = conn.clone()
        conn.release()
        self.pool.shutdown(wait=True)

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
            self.apply(body)
            self.fault("report:applied")
        except Exception:   # SQLite busy, a full disk: back to the queue, and applied again later
            log.exception("report %r not applied; requeued", body)
            time.sleep(self.s.report_retry_s)
            message.requeue()
            return
        message.ack()

    def tick(self) -> None:
        now = time.time()
        self.apply_outbox()
        self._settle(now)
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
            if self._due("release", jid, self.s.lease_retry_s):
                self.release_nodes(job)
        if state in FINAL:
            return
        if job["cancel_requested"] and state in LIVE:
            return self.end(job, "cancelled", "cancelled")
        if state == "joining":
            fut = self.joins.get(jid)
            if fut is None:
                chunks = self.db.rows("SELECT idx, video, audio FROM chunks WHERE job_id=? ORDER BY idx", (jid,))
                self.joins[jid] = self.pool.submit(self._join, job, chunks)
            elif fut.done():
                self._joined(job, fut)
            return
        if state == "submitted":
            if self._due("begin", jid, self.s.lease_retry_s):
                self.begin(job)
            return
        self._tick_running(job, now)

    def _tick_running(self, job: dict, now: float) -> None:
        jid = job["id"]
        left = self.db.one("SELECT count(*) AS n FROM chunks WHERE job_id=? AND state!='done'", (jid,))["n"]
        if left == 0:
            with self.db.tx() as c:
                c.execute("UPDATE jobs SET state='joining' WHERE id=?", (jid,))
                self.db.event(jid, "all chunks rendered; giving the nodes back; joining", c)
            self.fault("joining:recorded")
            self.release_nodes(self.db.job(jid))
            return
        self._publish_pending(job)          # what a failed publish left (the broker was away, say)
        self._watchdog(job, now)
        if self.db.job(jid)["state"] not in LIVE:   # the watchdog's retry hit the cap: ended
            return
        if self._due("renew", jid, self.s.lease_renew_s):   # at once after a restart, then every renew_s
            self.renew(job)
        if self._due("reconcile", jid, self.s.reconcile_interval_s):
            self._add_consumers(job, reply=False)

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
        self.apply_outbox()
        for row in self.db.rows("SELECT id FROM jobs WHERE nodes_released=0 AND (state IN ('done','failed',"
                                "'cancelled','joining') OR (cancel_requested=1 AND state IN ('submitted','running')))"):
            job = self.db.job(row["id"])
            if job["state"] in LIVE:
                self.end(job, "cancelled", "cancelled (while the coordinator was down)")
            else:
                self.db.event(job["id"], "coordinator start: giving back the nodes of a job no longer live")
                self.release_nodes(job)
        if self.leases:
            self._release_orphan_leases()
        for row in self.db.rows("SELECT id FROM jobs WHERE state='running'"):
            job = self.db.job(row["id"])
            self.db.event(job["id"], "coordinator start: resuming")
            self._publish_pending(job)

    def _release_orphan_leases(self) -> None:
        """A lease smem holds for a farm job that is not live here (taken just before a crash, say)."""
        try:
            live = self.leases.live()
        except (LeaseError, httpx.HTTPError) as e:
            log.warning("smem leases not listed: %s", e)
            return
        for lease in live:
            if not lease.get("holder", "").startswith(HOLDER):
                continue
            jid = lease["holder"][len(HOLDER):]
            job = self.db.job(jid)
            known = self.db.one("SELECT 1 AS x FROM leases WHERE id=? AND released_at IS NULL", (lease["id"],))
            if job is None or job["state"] not in LIVE or not known:
                log.info("releasing orphan lease %s of %s", lease["id"], lease["holder"])
                self._release_lease(lease["id"], jid)

    # -- a job's life ----------------------------------------------------------------------------
    def begin(self, job: dict) -> None:
        jid, nodes = job["id"], [n for n in job["nodes"] if n not in self.s.never_lend]
        for row in self.db.rows("SELECT id FROM leases WHERE job_id=? AND released_at IS NULL", (jid,)):
            self._release_lease(row["id"], jid)          # ours, from a start cut short
        if self.leases:
            try:
                lease = self.leases.take(nodes, HOLDER + jid, self.s.lease_ttl_s)
            except LeaseConflict as e:
                return self.db.event(jid, "waiting for nodes: %s" % e)
            except (LeaseError, httpx.HTTPError) as e:
                return self.db.event(jid, "waiting for smem: %s" % e)
            self._record_lease(jid, lease)
        else:
            self.db.event(jid, self.no_leases_note)
        q = queue_of(jid)
        with self.app.connection_for_write() as conn:
            q(conn.default_channel).declare()
        with self.db.tx() as c:
            for ch in self.db.rows("SELECT idx FROM chunks WHERE job_id=? AND attempts=0", (jid,)):
                self._new_attempt(c, jid, ch["idx"])
            c.execute("UPDATE jobs SET state='running', started_at=? WHERE id=?", (time.time(), jid))
        self.fault("begin:running")
        self.due[("renew", jid)] = time.monotonic() + self.s.lease_renew_s
        self._add_consumers(job, reply=True)
        self._publish_pending(job)

    def _new_attempt(self, c, jid: str, idx: int, priority: int = 0) -> str:
        n = c.execute("UPDATE chunks SET attempts=attempts+1 WHERE job_id=? AND idx=? RETURNING attempts",
                      (jid, idx)).fetchone()[0]
        aid = "%s.%d.%d" % (jid, idx, n)
        c.execute("INSERT INTO attempts(id, job_id, idx, n, priority, created_at) VALUES (?,?,?,?,?,?)",
                  (aid, jid, idx, n, priority, time.time()))
        return aid

    def _publish_pending(self, job: dict) -> None:
        """Attempts recorded but not yet on the broker (the outbox of retries); one that fails to go is
        tried again at the next tick. A crash between the publish and the mark publishes one twice:
        harmless, the first `done` of a chunk counts and the join is by index. Each goes with its time
        limits (from its frames: README "Long jobs") and the nodes it should avoid."""
        q = queue_of(job["id"])
        for a in self.db.rows("SELECT a.id, a.idx, a.priority, c.first, c.last FROM attempts a JOIN chunks c"
                              " ON c.job_id=a.job_id AND c.idx=a.idx WHERE a.job_id=? AND a.published=0"
                              " AND a.state='queued' ORDER BY a.n, a.idx", (job["id"],)):
            kwargs = {"job": job["id"], "index": a["idx"], "first": a["first"], "last": a["last"], "spec": job["spec"]}
            avoid = self._avoid(job, a["idx"])
            if avoid:
                kwargs["avoid"] = avoid
            soft, hard = self.s.chunk_limits(job["spec"], a["last"] - a["first"] + 1)
            try:
                self.app.send_task("farm.render", task_id=a["id"], queue=q, ignore_result=True,
                                   priority=a["priority"], kwargs=kwargs, soft_time_limit=soft, time_limit=hard)
            except Exception as e:
                log.warning("job %s: attempt %s not published (%s: %s); trying again", job["id"], a["id"],
                            type(e).__name__, e)
                return
            self.db.c.execute("UPDATE attempts SET published=1, avoid=? WHERE id=?",
                              (json.dumps(avoid) if avoid else None, a["id"]))

    def _avoid(self, job: dict, idx: int) -> list[str]:
        """Every node that failed this chunk (its own fault), while another node of the job, not
        blocklisted, answers a ping; else (no other node left) none: any node may take it."""
        failed = sorted({r["node"] for r in self.db.rows(
            "SELECT node FROM attempts WHERE job_id=? AND idx=? AND charged=1 AND node IS NOT NULL", (job["id"], idx))})
        others = [n for n in self._nodes_for(job) if n not in failed]
        if not failed or not others:
            return []
        try:
            alive = self.app.control.ping(destination=[worker_name(n) for n in others],
                                          timeout=self.s.control_timeout_s, limit=1)
        except Exception as e:
            log.warning("ping of %s: %s", others, e)
            return []
        return failed if alive else []

    def _watchdog(self, job: dict, now: float) -> None:
        """A started attempt not heard of for silent_after_s is lost (its reports cannot get out, or the
        coordinator's publish of them failed): revoked, and charged to its node. Queued ones wait for a
        free worker however long. The coordinator's own clock, and only once it has been up (and
        connected) that long: the reports of a coordinator that was down wait in the queue."""
        quiet = self.s.silent_after_s
        if now - self.up_since < quiet:
            return
        for a in self.db.rows("SELECT * FROM attempts WHERE job_id=? AND state='started'"
                              " AND coalesce(heard_at, started_at) < ?", (job["id"], now - quiet)):
            self.app.control.revoke(a["id"], terminate=True, signal="SIGTERM")
            why = "silent for %.0f s (silent_after_s %g): given up, revoked" % (
                now - (a["heard_at"] or a["started_at"]), quiet)
            with self.db.tx() as c:
                self._attempt_failed(c, job, a, {"event": "lost", "ts": now, "error": why, "silent": True})

    def _excuse(self, a: dict, r: dict, now: float) -> str | None:
        """Why a re-delivered attempt is nobody's fault, or None (not known yet)."""
        for lost, back in self.outages + ([(self.outage_since, now)] if self.outage_since else []):
            if (a["started_at"] or 0) <= back and now - back <= self.s.outage_grace_s:
                return "the broker was away (the coordinator's own connection was lost %s, back %s)" % (
                    time.strftime("%H:%M:%S", time.localtime(lost)), time.strftime("%H:%M:%S", time.localtime(back)))
        return None

    def _attempt_failed(self, c, job: dict, a: dict, r: dict) -> None:
        """Records a failed or lost attempt and, in the same transaction, what follows from it (a
        charge, a retry, the chunk's or the job's end). Whose fault: README "Whose fault"."""
        jid, idx, ev, now = job["id"], a["idx"], r["event"], time.time()
        node = a["node"] if ev == "lost" else r["node"]   # lost: the node that started it, not the one that saw it
        why = r.get("error") or "lost: its worker died or hung (re-delivered by the broker)"
        if ev == "failed" or r.get("silent") or not node:
            charged, excuse = (1 if node else 0), None
        else:
            excuse = self._excuse(a, r, now)
            charged = 0 if excuse else None                 # None: waits excuse_wait_s for its node's word
        c.execute("UPDATE attempts SET state=?, finished_at=?, error=?, node=coalesce(node, ?), charged=?, lost_at=?"
                  " WHERE id=?", (ev, r.get("ts"), why + ("; not charged: " + excuse if excuse else ""), node,
                                  charged, now, a["id"]))
        chunk = dict(c.execute("SELECT * FROM chunks WHERE job_id=? AND idx=?", (jid, idx)).fetchone())
        if chunk["state"] == "done":
            return
        self.db.event(jid, "chunk %d attempt %d on %s: %s%s" % (
            idx, a["n"], node or "?", why, "; not charged: " + excuse if excuse else
            "; charged to the node" if charged else "; waiting for the node's word before charging it"), c)
        if charged:
            self._charge(c, job, {**a, "node": node}, why)
        self._decide_chunk(c, job, idx, LOST_PRIORITY if ev == "lost" else 0)

    def _charge(self, c, job: dict, a: dict, why: str) -> None:
        jid, node = job["id"], a["node"]
        c.execute("INSERT OR IGNORE INTO node_failures(job_id, node, idx, attempt_id, reason, at)"
                  " VALUES (?,?,?,?,?,?)", (jid, node, a["idx"], a["id"], why, time.time()))
        fails = c.execute("SELECT count(DISTINCT idx) FROM node_failures WHERE job_id=? AND node=?",
                          (jid, node)).fetchone()[0]
        if fails >= self.s.blocklist_after and c.execute("INSERT OR IGNORE INTO blocklist(job_id, node, at)"
                                                          " VALUES (?,?,?)", (jid, node, time.time())).rowcount:
            self.db.event(jid, "%s blocklisted for this job: %d chunks failed there" % (node, fails), c)
            self._outbox(c, jid, "cancel_consumers", {"nodes": [node]})
            blocked = {r[0] for r in c.execute("SELECT node FROM blocklist WHERE job_id=?", (jid,))}
            if not set(job["nodes"]) - blocked:
                self._end_tx(c, job, "failed", "every node of the job is blocklisted")

    def _decide_chunk(self, c, job: dict, idx: int, priority: int = 0) -> None:
        """A chunk not done with no attempt under way: a retry, the chunk's end (and the job's), or a
        wait for undecided charges. Idempotent: the tick runs it again after a charge is settled."""
        jid = job["id"]
        if c.execute("SELECT state FROM jobs WHERE id=?", (jid,)).fetchone()[0] not in LIVE:
            return
        chunk = dict(c.execute("SELECT * FROM chunks WHERE job_id=? AND idx=?", (jid, idx)).fetchone())
        tried = [dict(t) for t in c.execute("SELECT n, node, state, error, charged FROM attempts WHERE job_id=?"
                                            " AND idx=? ORDER BY n", (jid, idx))]
        if chunk["state"] != "queued" or any(t["state"] in ("queued", "started") for t in tried):
            return
        charged = sum(1 for t in tried if t["charged"] == 1)
        undecided = sum(1 for t in tried if t["charged"] is None and t["state"] == "lost")
        reason = None
        if charged >= self.s.attempts:
            reason = "chunk %d (frames %d-%d) failed %d attempts (the cap)" % (
                idx, chunk["first"], chunk["last"], charged)
        elif len(tried) >= self.s.attempts + self.s.excused_attempts:
            reason = "chunk %d (frames %d-%d) was re-run %d times (attempts + excused_attempts)" % (
                idx, chunk["first"], chunk["last"], len(tried))
        elif charged + undecided >= self.s.attempts:
            return          # the cap, if the losses are charged: decided when they are (_settle)
        if reason:
            reason += ": " + "; ".join("#%d on %s: %s" % (t["n"], t["node"] or "?", t["error"]) for t in tried)
            c.execute("UPDATE chunks SET state='failed', reason=? WHERE job_id=? AND idx=?", (reason, jid, idx))
            self._end_tx(c, job, "failed", reason)
        else:
            self._new_attempt(c, jid, idx, priority)

    def _settle(self, now: float) -> None:
        """Losses still undecided after excuse_wait_s are the node's fault: charged, and their chunks
        decided (also in a job that has ended since: the charge is the node's record)."""
        for a in self.db.rows("SELECT * FROM attempts WHERE state='lost' AND charged IS NULL AND lost_at < ?",
                              (now - self.s.excuse_wait_s,)):
            job = self.db.job(a["job_id"])
            with self.db.tx() as c:
                c.execute("UPDATE attempts SET charged=1 WHERE id=?", (a["id"],))
                self.db.event(a["job_id"], "chunk %d attempt %d: no word from %s in %g s (excuse_wait_s): charged"
                              % (a["idx"], a["n"], a["node"], self.s.excuse_wait_s), c)
                self._charge(c, job, a, a["error"])
                self._decide_chunk(c, job, a["idx"], LOST_PRIORITY)

    def _interrupted(self, job: dict, a: dict, r: dict) -> None:
        """The attempt's own worker says it lost its broker connection while rendering it (and stopped
        the render): not its fault. Re-run at once if the broker has not re-delivered it yet."""
        if r["node"] != a["node"] or a["state"] not in ("started", "lost") or a["charged"] is not None:
            return
        why = "interrupted: %s lost its broker connection mid-render" % r["node"]
        with self.db.tx() as c:
            c.execute("UPDATE attempts SET state=CASE state WHEN 'started' THEN 'interrupted' ELSE state END,"
                      " charged=0, error=?, finished_at=coalesce(finished_at, ?) WHERE id=?",
                      (why, r.get("ts"), a["id"]))
            self.db.event(job["id"], "chunk %d attempt %d: %s; not charged" % (a["idx"], a["n"], why), c)
            self._decide_chunk(c, job, a["idx"], LOST_PRIORITY)

    def _outbox(self, c, jid: str, action: str, args: dict) -> None:
        c.execute("INSERT INTO outbox(job_id, action, args, created_at) VALUES (?,?,?,?)",
                  (jid, action, json.dumps(args), time.time()))

    def apply_outbox(self) -> None:
        """The broker-side steps decided in a transaction: each applied, then marked done. Applying one
        twice does nothing more (a revoke, a cancel_consumer)."""
        for row in self.db.rows("SELECT * FROM outbox WHERE done_at IS NULL ORDER BY id"):
            args = json.loads(row["args"])
            try:
                if row["action"] == "revoke":
                    self.app.control.revoke(args["ids"], terminate=True, signal="SIGTERM")
                elif row["action"] == "cancel_consumers":
                    self._cancel_consumers(row["job_id"], args["nodes"])
            except Exception as e:
                log.warning("job %s: %s not done yet (%s: %s)", row["job_id"], row["action"], type(e).__name__, e)
                return
            self.db.c.execute("UPDATE outbox SET done_at=? WHERE id=?", (time.time(), row["id"]))

    def _nodes_for(self, job: dict) -> list[str]:
        blocked = {r["node"] for r in self.db.rows("SELECT node FROM blocklist WHERE job_id=?", (job["id"],))}
        return [n for n in job["nodes"] if n not in blocked and n not in self.s.never_lend]

    def _add_consumers(self, job: dict, *, reply: bool) -> None:
        nodes = self._nodes_for(job)
        if not nodes:
            return
        q = queue_of(job["id"]).name
        with self.db.tx() as c:
            c.executemany("INSERT OR IGNORE INTO consumers(job_id, node) VALUES (?,?)", [(job["id"], n) for n in nodes])
        answers = self.app.control.add_consumer(q, exchange=q, exchange_type="direct", routing_key=q,
                                                options={"queue_arguments": QUEUE_ARGS},
                                                destination=[worker_name(n) for n in nodes], reply=reply,
                                                timeout=self.s.control_timeout_s)
        if reply:
            seen = sorted(name.split("@", 1)[1] for a in answers or [] for name in a)
            silent = sorted(set(nodes) - set(seen))
            self.db.event(job["id"], "consuming on %s%s" % (
                ", ".join(seen) or "no node yet", "; not answering yet: " + ", ".join(silent) if silent else ""))

    def _cancel_consumers(self, jid: str, nodes: list[str]) -> None:
        if nodes:
            self.app.control.cancel_consumer(queue_of(jid).name, destination=[worker_name(n) for n in nodes],
                                             reply=True, timeout=self.s.control_timeout_s)
        self.db.c.executemany("DELETE FROM consumers WHERE job_id=? AND node=?", [(jid, n) for n in nodes])

    def renew(self, job: dict) -> None:
        if not self.leases:
            return
        row = self.db.one("SELECT * FROM leases WHERE job_id=? AND released_at IS NULL ORDER BY taken_at DESC",
                          (job["id"],))
        if row is None:
            return
        lease = {"id": row["id"], "nodes": json.loads(row["nodes"])}
        try:
            new = self.leases.renew(lease, HOLDER + job["id"], self.s.lease_ttl_s)
        except LeaseConflict as e:      # it had expired, and smem lent the nodes to another since
            return self._lease_lost(job, row, "its nodes are leased to another now (%s)" % e)
        except (LeaseError, httpx.HTTPError) as e:
            self.db.event(job["id"], "lease %s not renewed: %s" % (row["id"], e))
            if time.time() > (row["renewed_at"] or row["taken_at"]) + self.s.lease_ttl_s - self.s.lease_renew_s:
                self._lease_lost(job, row, "not renewed before it runs out (%s)" % e)
            return
        with self.db.tx() as c:
            if new["id"] != row["id"]:
                c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), row["id"]))
                self._record_lease(job["id"], new, c)
            c.execute("UPDATE leases SET renewed_at=?, expires_at=? WHERE id=?",
                      (time.time(), new.get("expiresAt"), new["id"]))

    def _lease_lost(self, job: dict, row: dict, why: str) -> None:
        """The job may no longer use its nodes: at once no new chunks for them (consumers cancelled),
        the chunks they render stopped and re-queued (not charged), and the job waits for a lease again
        (state submitted: begin() takes one and brings the consumers back)."""
        jid = job["id"]
        with self.db.tx() as c:
            started = [dict(r) for r in c.execute("SELECT * FROM attempts WHERE job_id=? AND state='started'", (jid,))]
            c.execute("UPDATE attempts SET state='interrupted', charged=0, error=?, finished_at=? WHERE job_id=?"
                      " AND state='started'", ("lease lost: " + why, time.time(), jid))
            c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), row["id"]))
            c.execute("UPDATE jobs SET state='submitted' WHERE id=?", (jid,))
            self._outbox(c, jid, "cancel_consumers", {"nodes": [n for n in job["nodes"] if n not in self.s.never_lend]})
            if started:
                self._outbox(c, jid, "revoke", {"ids": [a["id"] for a in started]})
            self.db.event(jid, "lease %s lost: %s; its nodes stop, %d chunks re-queued, waiting for a lease again"
                          % (row["id"], why, len(started)), c)
            for a in started:
                self._decide_chunk(c, job, a["idx"], LOST_PRIORITY)
        self.apply_outbox()

    def _record_lease(self, jid: str, lease: dict, c=None) -> None:
        (c or self.db.c).execute("INSERT INTO leases(id, job_id, nodes, taken_at, expires_at) VALUES (?,?,?,?,?)",
                                 (lease["id"], jid, json.dumps(lease["nodes"]), time.time(), lease.get("expiresAt")))
        if c is None:
            self.db.event(jid, "lease %s on %s until %s" % (lease["id"], ", ".join(lease["nodes"]),
                                                            lease.get("expiresAt")))

    def _release_lease(self, lease_id: str, jid: str) -> None:
        released = self.leases.release(lease_id) if self.leases else False
        self.db.c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), lease_id))
        self.db.event(jid, "lease %s %s" % (lease_id, "released" if released else "was no longer live"))

    def release_nodes(self, job: dict) -> None:
        """Consumers cancelled and the job's queue deleted, then (only then) its lease given back."""
        jid = job["id"]
        try:
            # every node of the job, not only those recorded: one that missed a cancel gets it again
            nodes = {r["node"] for r in self.db.rows("SELECT node FROM consumers WHERE job_id=?", (jid,))}
            self._cancel_consumers(jid, sorted(nodes | set(job["nodes"]) - set(self.s.never_lend)))
            self._delete_queue(jid)
        except Exception as e:   # the lease stays: smem must not lend nodes that may still take our chunks
            return self.db.event(jid, "consumers or queue not cleaned up yet (%s: %s); the lease is kept; trying"
                                 " again" % (type(e).__name__, e))
        self.fault("release:consumers")
        try:
            for row in self.db.rows("SELECT id FROM leases WHERE job_id=? AND released_at IS NULL", (jid,)):
                self._release_lease(row["id"], jid)
        except (LeaseError, httpx.HTTPError) as e:
            return self.db.event(jid, "lease not released yet (smem: %s); trying again" % e)
        self.db.c.execute("UPDATE jobs SET nodes_released=1 WHERE id=?", (jid,))

    def _delete_queue(self, jid: str) -> None:
        """Once no worker consumes it. A worker answers cancel_consumer before it acts on it; a queue
        deleted under its consumer makes the worker reconnect, and it declares the queue again."""
        q, deadline = queue_of(jid), time.monotonic() + self.s.control_timeout_s
        while True:
            try:
                with self.app.connection_for_write() as conn:
                    q(conn.default_channel).delete(if_unused=True)
                    q.exchange(conn.default_channel).delete()
                return
            except Exception:     # PRECONDITION_FAILED while a consumer is left
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _end_tx(self, c, job: dict, state: str, reason: str) -> None:
        """The job's end, in the caller's transaction: its state, its attempts revoked (the revoke itself
        in the outbox), and its nodes left to give back (nodes_released=0: the tick and the start-up
        release them). Nothing of it waits for code that runs after the commit."""
        jid = job["id"]
        if c.execute("SELECT state FROM jobs WHERE id=?", (jid,)).fetchone()[0] not in LIVE:
            return
        pending = [r[0] for r in c.execute("SELECT id FROM attempts WHERE job_id=? AND state IN ('queued','started')",
                                           (jid,))]
        c.execute("UPDATE jobs SET state=?, reason=?, finished_at=? WHERE id=?", (state, reason, time.time(), jid))
        c.execute("UPDATE attempts SET state='revoked' WHERE job_id=? AND state IN ('queued','started')", (jid,))
        if pending:        # stop the renders in progress; the queue goes with release_nodes
            self._outbox(c, jid, "revoke", {"ids": pending})
        self.db.event(jid, "%s: %s" % (state, reason), c)

    def end(self, job: dict, state: str, reason: str) -> None:
        with self.db.tx() as c:
            self._end_tx(c, job, state, reason)
        self.fault("end:recorded")
        self.apply_outbox()
        self.release_nodes(self.db.job(job["id"]))

    # -- reports from the workers -----------------------------------------------------------------
    def apply(self, r: dict) -> None:
        job = self.db.job(r.get("job", ""))
        a = self.db.one("SELECT * FROM attempts WHERE id=?", (r.get("attempt", ""),))
        if job is None or a is None or job["state"] != "running":
            return
        if r.get("event") == "interrupted":
            return self._interrupted(job, a, r)
        ev, ts, jid, idx = r["event"], r.get("ts", time.time()), job["id"], a["idx"]
        if ev == "done" and (bad := self._bad_parts(jid, idx, r)):
            r, ev = {**r, "event": "failed", "error": bad}, "failed"
        with self.db.tx() as c:
            heard = time.time()
            if ev == "started" and a["state"] == "queued":
                c.execute("UPDATE attempts SET state='started', node=?, started_at=?, last_report_at=?, heard_at=?"
                          " WHERE id=?", (r["node"], ts, ts, heard, a["id"]))
            elif ev == "progress" and a["state"] == "started":
                c.execute("UPDATE attempts SET last_report_at=?, heard_at=?, elapsed=? WHERE id=?",
                          (ts, heard, r.get("elapsed"), a["id"]))
            elif ev == "done":
                if a["state"] in ("queued", "started"):
                    c.execute("UPDATE attempts SET state='done', finished_at=?, elapsed=? WHERE id=?",
                              (ts, r.get("elapsed"), a["id"]))
                else:   # a hung node came back and finished what was given up on
                    self.db.event(jid, "chunk %d attempt %d on %s finished after it was %s"
                                  % (idx, a["n"], r["node"], a["state"]), c)
                n = c.execute("UPDATE chunks SET state='done', node=?, video=?, audio=?, seconds=?, done_at=?,"
                              " timings=? WHERE job_id=? AND idx=? AND state!='done'",
                              (r["node"], r["video"], r["audio"], r.get("seconds"), ts,
                               json.dumps(r["timings"]) if r.get("timings") else None, jid, idx)).rowcount
                if not n:
                    self.db.event(jid, "chunk %d rendered again by %s: ignored, the first one counts"
                                  % (idx, r["node"]), c)
            elif ev in ("failed", "lost") and a["state"] in ("queued", "started"):
                self._attempt_failed(c, job, a, r)
        if self.db.job(jid)["state"] not in LIVE:
            self.fault("end:recorded")

    def _bad_parts(self, jid: str, idx: int, r: dict) -> str | None:
        """Why a done report's parts are not this chunk's files in parts_dir/<job>/ (they become ffmpeg's
        inputs, read with -safe 0), or None."""
        folder = (Path(self.s.parts_dir) / jid).resolve()
        for key, ext in (("video", ".ts"), ("audio", ".wav")):
            name = r.get(key)
            want = "part-%05d%s" % (idx, ext)
            if not isinstance(name, str) or (Path(self.s.parts_dir) / name).resolve() != folder / want:
                return "bad report: its %s is %r, not %s/%s" % (key, name, jid, want)
        return None

    # -- the end: join and verify (a thread: the loop goes on meanwhile) -----------------------------------
    def _join(self, job: dict, chunks: list[dict]) -> dict:
        assert [c["idx"] for c in chunks] == list(range(len(chunks)))
        parts = Path(self.s.parts_dir)
        out = Path(job["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        joined = media_join.join([parts / c["video"] for c in chunks], [parts / c["audio"] for c in chunks],
                                 out, fps=job["fps"])
        t1 = time.monotonic()
        spec = tasks.worker_spec(job["spec"], self.s)     # the host's own executables, never the job's
        frames, ref, kw = job["frames"], Path(self.s.work_dir) / "verify" / job["id"], {}
        if job["verify"] or spec.get("renderer") == "testsrc":   # testsrc's reference tone costs nothing
            ref.mkdir(parents=True, exist_ok=True)
            kw["reference_audio"] = media_render.reference_audio(spec, frames, ref / "reference.wav")
        if job["verify"]:   # a single-node reference of sampled frames (the middle ones), compared by PSNR
            n = min(frames, self.s.min_chunk)
            first = (frames - n) // 2
            sample = media_render.render_chunk(spec, 0, first, first + n - 1, ref)
            kw.update(reference_video=Path(sample["video"]), reference_first=first)
        checked = media_verify.verify(out, frames=frames, fps=job["fps"], **kw)
        timings = {"join_s": round(t1 - t0, 3), "verify_s": round(time.monotonic() - t1, 3)}
        return {"join": joined, "verify": checked, "timings": timings}

    def _joined(self, job: dict, fut: Future) -> None:
        del self.joins[job["id"]]
        try:
            result = fut.result()
        except Exception as e:
            log.exception("join of %s", job["id"])
            return self._finish(job, "failed", "join failed: %s: %s" % (type(e).__name__, e), None)
        v = result["verify"]
        if v.get("ok"):
            self._finish(job, "done", verified_text(v), result)
        else:
            self._finish(job, "failed", "verification failed: " + "; ".join(v.get("reasons") or ["not ok"]), result)

    def _finish(self, job: dict, state: str, reason: str, result: dict | None) -> None:
        timings = {**(job.get("timings") or {}), **((result or {}).get("timings") or {})}
        with self.db.tx() as c:
            c.execute("UPDATE jobs SET state=?, reason=?, result=?, finished_at=?, timings=? WHERE id=?",
                      (state, reason, json.dumps(result, default=str) if result else None, time.time(),
                       json.dumps(timings) if timings else None, job["id"]))
            self.db.event(job["id"], "%s: %s" % (state, reason), c)
