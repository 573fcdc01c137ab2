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
        except Exception:
            log.exception("report %r not applied", body)
        message.ack()

    def tick(self) -> None:
        now = time.time()
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
            self.release_nodes(job)
            with self.db.tx() as c:
                c.execute("UPDATE jobs SET state='joining' WHERE id=?", (jid,))
                self.db.event(jid, "all chunks rendered; nodes given back; joining", c)
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
        """Jobs no longer live give their leases and consumers back; live ones go on."""
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
        """Attempts recorded but not yet on the broker; one that fails to go is tried again at the next
        tick. A crash between the publish and the mark publishes one twice: harmless, the first `done`
        of a chunk counts and the join is by index."""
        q = queue_of(job["id"])
        for a in self.db.rows("SELECT a.id, a.idx, a.priority, a.avoid, c.first, c.last FROM attempts a JOIN chunks c"
                              " ON c.job_id=a.job_id AND c.idx=a.idx WHERE a.job_id=? AND a.published=0"
                              " AND a.state='queued' ORDER BY a.n, a.idx", (job["id"],)):
            kwargs = {"job": job["id"], "index": a["idx"], "first": a["first"], "last": a["last"], "spec": job["spec"]}
            if a["avoid"]:
                kwargs["avoid"] = json.loads(a["avoid"])
            try:
                self.app.send_task("farm.render", task_id=a["id"], queue=q, ignore_result=True,
                                   priority=a["priority"], kwargs=kwargs)
            except Exception as e:
                log.warning("job %s: attempt %s not published (%s: %s); trying again", job["id"], a["id"],
                            type(e).__name__, e)
                return
            self.db.c.execute("UPDATE attempts SET published=1 WHERE id=?", (a["id"],))

    def _watchdog(self, job: dict, now: float) -> None:
        """A started attempt not heard of for silent_after_s is lost (its reports cannot get out, or the
        coordinator's publish of them failed): revoked, and the next attempt goes out. Queued ones wait
        for a free worker however long. The coordinator's own clock, and only once it has been up that
        long: the reports of a coordinator that was down wait in the queue."""
        quiet = self.s.silent_after_s
        if now - self.up_since < quiet:
            return
        for a in self.db.rows("SELECT * FROM attempts WHERE job_id=? AND state='started'"
                              " AND coalesce(heard_at, started_at) < ?", (job["id"], now - quiet)):
            self.app.control.revoke(a["id"], terminate=True, signal="SIGTERM")
            why = "silent for %.0f s (silent_after_s %g): given up, revoked" % (
                now - (a["heard_at"] or a["started_at"]), quiet)
            with self.db.tx() as c:
                follow = self._attempt_failed(c, job, a, {"event": "lost", "ts": now, "error": why})
            if follow:
                follow()

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
        except (LeaseError, LeaseConflict, httpx.HTTPError) as e:
            return self.db.event(job["id"], "lease %s not renewed: %s" % (row["id"], e))
        with self.db.tx() as c:
            if new["id"] != row["id"]:
                c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), row["id"]))
                self._record_lease(job["id"], new, c)
            c.execute("UPDATE leases SET renewed_at=?, expires_at=? WHERE id=?",
                      (time.time(), new.get("expiresAt"), new["id"]))

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
        """Consumers cancelled, the job's queue deleted, its lease given back (the last, whatever failed)."""
        jid, ok = job["id"], True
        try:
            # every node of the job, not only those recorded: one that missed a cancel gets it again
            nodes = {r["node"] for r in self.db.rows("SELECT node FROM consumers WHERE job_id=?", (jid,))}
            self._cancel_consumers(jid, sorted(nodes | set(job["nodes"]) - set(self.s.never_lend)))
            self._delete_queue(jid)
        except Exception as e:
            ok = False
            self.db.event(jid, "consumers or queue not cleaned up yet (%s: %s); trying again" % (type(e).__name__, e))
        finally:
            try:
                for row in self.db.rows("SELECT id FROM leases WHERE job_id=? AND released_at IS NULL", (jid,)):
                    self._release_lease(row["id"], jid)
            except (LeaseError, httpx.HTTPError) as e:
                ok = False
                self.db.event(jid, "lease not released yet (smem: %s); trying again" % e)
        if ok:
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

    def end(self, job: dict, state: str, reason: str) -> None:
        jid = job["id"]
        try:
            pending = [a["id"] for a in self.db.rows(
                "SELECT id FROM attempts WHERE job_id=? AND state IN ('queued','started')", (jid,))]
            if pending:    # stop the renders in progress; the queue goes with release_nodes
                self.app.control.revoke(pending, terminate=True, signal="SIGTERM")
        finally:
            with self.db.tx() as c:
                c.execute("UPDATE jobs SET state=?, reason=?, finished_at=? WHERE id=?",
                          (state, reason, time.time(), jid))
                c.execute("UPDATE attempts SET state='revoked' WHERE job_id=? AND state IN ('queued','started')",
                          (jid,))
                self.db.event(jid, "%s: %s" % (state, reason), c)
            self.release_nodes(job)

    # -- reports from the workers -----------------------------------------------------------------
    def apply(self, r: dict) -> None:
        job = self.db.job(r.get("job", ""))
        a = self.db.one("SELECT * FROM attempts WHERE id=?", (r.get("attempt", ""),))
        if job is None or a is None or job["state"] != "running":
            return
        ev, ts, jid, idx = r["event"], r.get("ts", time.time()), job["id"], a["idx"]
        follow = None
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
                follow = self._attempt_failed(c, job, a, r)
        if follow:
            follow()

    def _attempt_failed(self, c, job: dict, a: dict, r: dict):
        jid, idx = job["id"], a["idx"]
        ev = r["event"]
        node = a["node"] if ev == "lost" else r["node"]   # lost: the node that started it, not the one that saw it
        why = r.get("error") or "lost: its worker died or hung (re-delivered by the broker)"
        c.execute("UPDATE attempts SET state=?, finished_at=?, error=?, node=coalesce(node, ?) WHERE id=?",
                  (ev, r.get("ts"), why, node, a["id"]))
        chunk = dict(c.execute("SELECT * FROM chunks WHERE job_id=? AND idx=?", (jid, idx)).fetchone())
        if chunk["state"] == "done":
            return None
        self.db.event(jid, "chunk %d attempt %d on %s: %s" % (idx, a["n"], node or "?", why), c)
        actions = []
        if node:
            c.execute("INSERT OR IGNORE INTO node_failures(job_id, node, idx, attempt_id, reason, at)"
                      " VALUES (?,?,?,?,?,?)", (jid, node, idx, a["id"], why, time.time()))
            fails = c.execute("SELECT count(DISTINCT idx) FROM node_failures WHERE job_id=? AND node=?",
                              (jid, node)).fetchone()[0]
            if fails >= self.s.blocklist_after and c.execute("INSERT OR IGNORE INTO blocklist(job_id, node, at)"
                                                              " VALUES (?,?,?)", (jid, node, time.time())).rowcount:
                self.db.event(jid, "%s blocklisted for this job: %d chunks failed there" % (node, fails), c)
                actions.append(lambda: self._cancel_consumers(jid, [node]))
                blocked = {r[0] for r in c.execute("SELECT node FROM blocklist WHERE job_id=?", (jid,))}
                if not set(job["nodes"]) - blocked:
                    actions.append(lambda: self.end(job, "failed", "every node of the job is blocklisted"))
        pending = c.execute("SELECT count(*) FROM attempts WHERE job_id=? AND idx=? AND state IN ('queued','started')",
                            (jid, idx)).fetchone()[0]
        if pending:
            pass                                         # another copy of it is under way
        elif chunk["attempts"] >= self.s.attempts:
            tried = c.execute("SELECT n, node, error FROM attempts WHERE job_id=? AND idx=? ORDER BY n",
                              (jid, idx)).fetchall()
            reason = "chunk %d (frames %d-%d) failed %d attempts (the cap): %s" % (
                idx, chunk["first"], chunk["last"], len(tried),
                "; ".join("#%d on %s: %s" % (t[0], t[1] or "?", t[2]) for t in tried))
            c.execute("UPDATE chunks SET state='failed', reason=? WHERE job_id=? AND idx=?", (reason, jid, idx))
            actions.append(lambda: self.end(job, "failed", reason))
        else:
            aid = self._new_attempt(c, jid, idx, LOST_PRIORITY if ev == "lost" else 0)
            actions.append(lambda: self._avoid(job, aid, node))
            actions.append(lambda: self._publish_pending(job))

        def follow():
            for act in actions:
                if self.db.job(jid)["state"] in LIVE:
                    act()
        return follow

    def _avoid(self, job: dict, aid: str, node: str | None) -> None:
        """The retry's message carries avoid: [node] while another node of the job, not blocklisted,
        answers a ping; else (no other node left) any node may take it, the failed one included."""
        others = [n for n in self._nodes_for(job) if n != node]
        if not node or not others:
            return
        try:
            alive = self.app.control.ping(destination=[worker_name(n) for n in others],
                                          timeout=self.s.control_timeout_s, limit=1)
        except Exception as e:
            log.warning("ping of %s: %s", others, e)
            return
        if alive:
            self.db.c.execute("UPDATE attempts SET avoid=? WHERE id=?", (json.dumps([node]), aid))

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
        spec, frames, ref, kw = job["spec"], job["frames"], Path(self.s.work_dir) / "verify" / job["id"], {}
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
            self._finish(job, "done", "verified: %s frames, audio offset %s ms, drift %s ms" % (
                v.get("frames"), v.get("offsetMs"), v.get("driftMs")), result)
        else:
            self._finish(job, "failed", "verification failed: " + "; ".join(v.get("reasons") or ["not ok"]), result)

    def _finish(self, job: dict, state: str, reason: str, result: dict | None) -> None:
        timings = {**(job.get("timings") or {}), **((result or {}).get("timings") or {})}
        with self.db.tx() as c:
            c.execute("UPDATE jobs SET state=?, reason=?, result=?, finished_at=?, timings=? WHERE id=?",
                      (state, reason, json.dumps(result, default=str) if result else None, time.time(),
                       json.dumps(timings) if timings else None, job["id"]))
            self.db.event(job["id"], "%s: %s" % (state, reason), c)
