"""A job's state machine: every change of a job, a chunk or an attempt, each in one SQLite transaction
with the decisions it makes (README "Crash safety"). Nothing here talks to the broker or smem: what
must happen there is written as rows (attempts to publish, outbox rows, nodes to give back) that the
coordinator carries out after the commit, at every tick and at start-up.

Whose fault a lost attempt is: README "Whose fault"."""

from __future__ import annotations

import hmac
import json
import secrets
import statistics
import time
from pathlib import Path

from farm.config import Settings
from farm.db import DB, LIVE

# A chunk whose worker was lost jumps the queue: the job waits for it, and that node cannot take it
# again. One that failed goes to the back, so a broken node meets other chunks and is blocklisted.
LOST_PRIORITY = 9
LOST = "lost: its worker died or hung (re-delivered by the broker)"


class StateMachine:
    def __init__(self, s: Settings, db: DB):
        self.s, self.db = s, db
        self.outage_since: float | None = None         # the coordinator's broker connection is down since

    # -- the broker's outages, as the coordinator sees them (kept in the database) -------------------------
    def broker_lost(self, at: float) -> None:
        if self.outage_since is None:
            self.outage_since = at

    def broker_back(self, at: float) -> bool:
        if self.outage_since is None:
            return False
        self.outage(self.outage_since, at, "the broker was away (the coordinator's own connection was lost)")
        self.outage_since = None
        return True

    def outage(self, lost: float, back: float, why: str) -> None:
        with self.db.tx() as c:
            c.execute("INSERT INTO outages(lost, back, why) VALUES (?,?,?)", (lost, back, why))
            c.execute("DELETE FROM outages WHERE back < ?", (back - 7 * 86400,))

    def alive(self, now: float) -> None:
        """The coordinator's tick, kept: after a host reboot, the time it went down."""
        self.db.c.execute("INSERT OR REPLACE INTO meta(key, value) VALUES ('coordinator_alive_at', ?)", (str(now),))

    def started_after_reboot(self, now: float, booted_at: float) -> None:
        """At the coordinator's start: if the host booted since its last tick, the broker restarted with
        it, and what the nodes were rendering then comes back re-delivered: the host's outage."""
        row = self.db.one("SELECT value FROM meta WHERE key='coordinator_alive_at'")
        if row and float(row["value"]) < booted_at:
            self.outage(float(row["value"]), now, "the host rebooted (the broker with it)")

    def _excuse(self, a: dict, now: float) -> str | None:
        """Why a re-delivered attempt is nobody's fault, or None (not known yet)."""
        seen = self.db.rows("SELECT lost, back, why FROM outages ORDER BY back")
        for o in seen + ([{"lost": self.outage_since, "back": now, "why": "the broker is away"}]
                         if self.outage_since else []):
            if (a["started_at"] or 0) <= o["back"] and now - o["back"] <= self.s.outage_grace_s:
                return "%s: down %s, back %s" % (o["why"], time.strftime("%H:%M:%S", time.localtime(o["lost"])),
                                                 time.strftime("%H:%M:%S", time.localtime(o["back"])))
        return None

    # -- a job's life -------------------------------------------------------------------------------------
    def new_attempt(self, c, jid: str, idx: int, priority: int = 0) -> str:
        n = c.execute("UPDATE chunks SET attempts=attempts+1 WHERE job_id=? AND idx=? RETURNING attempts",
                      (jid, idx)).fetchone()[0]
        aid = "%s.%d.%d" % (jid, idx, n)
        c.execute("INSERT INTO attempts(id, job_id, idx, n, priority, created_at, key) VALUES (?,?,?,?,?,?,?)",
                  (aid, jid, idx, n, priority, time.time(), secrets.token_urlsafe(18)))
        return aid

    def running(self, jid: str) -> None:
        """Leased and queued: each chunk's first attempt recorded, to be published."""
        with self.db.tx() as c:
            for ch in c.execute("SELECT idx FROM chunks WHERE job_id=? AND attempts=0", (jid,)).fetchall():
                self.new_attempt(c, jid, ch[0])
            c.execute("UPDATE jobs SET state='running', started_at=? WHERE id=?", (time.time(), jid))

    def joining(self, jid: str) -> None:
        with self.db.tx() as c:
            c.execute("UPDATE jobs SET state='joining' WHERE id=?", (jid,))
            self.db.event(jid, "all chunks rendered; giving the nodes back; joining", c)

    def end_tx(self, c, job: dict, state: str, reason: str) -> None:
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
        if pending:        # stop the renders in progress; the queue goes with the nodes
            self.outbox(c, jid, "revoke", {"ids": pending})
        self.db.event(jid, "%s: %s" % (state, reason), c)

    def end(self, job: dict, state: str, reason: str) -> None:
        with self.db.tx() as c:
            self.end_tx(c, job, state, reason)

    def finish(self, job: dict, state: str, reason: str, result: dict | None) -> None:
        """The join's outcome (done, failed, or cancelled while joining)."""
        timings = {**(job.get("timings") or {}), **((result or {}).get("timings") or {})}
        with self.db.tx() as c:
            c.execute("UPDATE jobs SET state=?, reason=?, result=?, finished_at=?, timings=? WHERE id=?",
                      (state, reason, json.dumps(result, default=str) if result else None, time.time(),
                       json.dumps(timings) if timings else None, job["id"]))
            self.db.event(job["id"], "%s: %s" % (state, reason), c)

    def lease_lost(self, job: dict, lease_id: str, why: str) -> None:
        """The job may no longer use its nodes: no new chunks for them (consumers cancelled), the chunks
        they render stopped and re-queued (not charged), and the job waits for a lease again (state
        submitted: the coordinator's begin takes one and brings the consumers back)."""
        jid = job["id"]
        with self.db.tx() as c:
            started = [dict(r) for r in c.execute("SELECT * FROM attempts WHERE job_id=? AND state='started'", (jid,))]
            c.execute("UPDATE leases SET released_at=? WHERE id=?", (time.time(), lease_id))
            c.execute("UPDATE jobs SET state='submitted' WHERE id=?", (jid,))
            self.outbox(c, jid, "cancel_consumers", {"nodes": [n for n in job["nodes"] if n not in self.s.never_lend]})
            self.db.event(jid, "lease %s lost: %s; its nodes stop, %d chunks re-queued, waiting for a lease again"
                          % (lease_id, why, len(started)), c)
            self._stop_and_requeue(c, job, started, "lease lost: " + why)

    def _stop_and_requeue(self, c, job: dict, attempts: list[dict], why: str) -> None:
        """Attempts on nodes the job may no longer use: each interrupted (not charged), its render
        stopped (the revoke in the outbox), its chunk re-queued."""
        if not attempts:
            return
        now = time.time()
        c.executemany("UPDATE attempts SET state='interrupted', charged=0, error=?, finished_at=? WHERE id=?",
                      [(why, now, a["id"]) for a in attempts])
        self.outbox(c, job["id"], "revoke", {"ids": [a["id"] for a in attempts]})
        for a in attempts:
            self.decide_chunk(c, job, a["idx"], LOST_PRIORITY)

    def pause_tx(self, c, jid: str, why: str) -> None:
        """No chunk of the job is published until resume(): the host's disk is full (README "The host's
        faults are the host's")."""
        if c.execute("UPDATE jobs SET paused=? WHERE id=? AND paused IS NULL", (why, jid)).rowcount:
            self.db.event(jid, "paused: %s; it goes on once min_free_gib is free again" % why, c)

    def resume(self, jid: str, free: str) -> None:
        with self.db.tx() as c:
            if c.execute("UPDATE jobs SET paused=NULL WHERE id=? AND paused IS NOT NULL", (jid,)).rowcount:
                self.db.event(jid, "resumed: %s" % free, c)

    def outbox(self, c, jid: str, action: str, args: dict) -> None:
        c.execute("INSERT INTO outbox(job_id, action, args, created_at) VALUES (?,?,?,?)",
                  (jid, action, json.dumps(args), time.time()))

    # -- reports from the workers ------------------------------------------------------------------------
    def apply(self, r: dict) -> None:
        job = self.db.job(r.get("job", ""))
        a = self.db.one("SELECT * FROM attempts WHERE id=?", (r.get("attempt", ""),))
        # submitted too: a job that lost its lease still hears what its nodes did before they stopped
        if job is None or a is None or job["state"] not in LIVE:
            return
        if why := self.not_its_own(a, r):
            with self.db.tx() as c:
                self.db.event(job["id"], "a %s report of chunk %d attempt %d from %s refused: %s"
                              % (r.get("event"), a["idx"], a["n"], r.get("node"), why), c)
            return
        if r.get("event") == "interrupted":
            return self._interrupted(job, a, r)
        return self._apply(job, a, r)

    def _apply(self, job: dict, a: dict, r: dict) -> None:
        ev, ts, jid, idx = r["event"], r.get("ts", time.time()), job["id"], a["idx"]
        if ev == "done" and (bad := self._bad_parts(jid, idx, r)):
            r, ev = {**r, "event": "failed", "error": bad}, "failed"
        with self.db.tx() as c:
            heard = time.time()
            if ev == "started" and a["state"] == "queued":
                c.execute("UPDATE attempts SET state='started', node=?, started_at=?, last_report_at=?, heard_at=?"
                          " WHERE id=?", (r["node"], ts, ts, heard, a["id"]))
                if job["state"] == "submitted":
                    self._started_without_lease(c, job, a, r["node"])
            elif ev == "progress" and a["state"] == "started":
                phase, size, frames = r.get("phase"), r.get("written"), r.get("frames")
                grew = phase == "render" and (a["phase"] != "render" or (size or 0) > (a["written"] or 0)
                                              or (frames or 0) > (a["frames_done"] or 0))
                c.execute("UPDATE attempts SET last_report_at=?, heard_at=?, elapsed=?, phase=?,"
                          " written=coalesce(?, written), frames_done=coalesce(?, frames_done),"
                          " grew_at=CASE WHEN ? THEN ? ELSE grew_at END WHERE id=?",
                          (ts, heard, r.get("elapsed"), phase, size, frames, grew, heard, a["id"]))
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
                if n:
                    self._drop_spares(c, jid, idx)
                    self._charge_too_slow(c, job, idx, r["node"])
                else:
                    self.db.event(jid, "chunk %d rendered again by %s: ignored, the first one counts"
                                  % (idx, r["node"]), c)
            elif ev in ("failed", "lost") and a["state"] in ("queued", "started"):
                self.attempt_failed(c, job, a, r)

    @staticmethod
    def not_its_own(a: dict, r: dict) -> str | None:
        """Why a report cannot be the attempt's own, or None. It must carry the attempt's key (in its
        message only: the node that took it), and once started it is the starting node's; `lost` comes
        from whichever node the broker handed the message to again, with the same key."""
        if a["key"] and not hmac.compare_digest(str(r.get("key") or ""), a["key"]):
            return "without the attempt's key"
        if r.get("event") not in ("started", "lost") and a["node"] and r.get("node") != a["node"]:
            return "the attempt is %s's" % a["node"]
        return None

    def _drop_spares(self, c, jid: str, idx: int) -> None:
        """The chunk is done: a re-run still queued for it (its render was given up, or stopped when the
        lease was lost, and ended after all) is not needed; a published one is revoked."""
        published = [row[0] for row in c.execute(
            "UPDATE attempts SET state='revoked', error=? WHERE job_id=? AND idx=? AND state='queued'"
            " RETURNING id, published", ("not needed: an earlier attempt rendered the chunk", jid, idx)).fetchall()
            if row[1]]
        if published:
            self.outbox(c, jid, "revoke", {"ids": published})

    def _charge_too_slow(self, c, job: dict, idx: int, node: str) -> None:
        """Another node rendered the chunk: the nodes it was too slow on are charged now."""
        for t in c.execute("SELECT * FROM attempts WHERE job_id=? AND idx=? AND timed_out=1 AND charged=0"
                           " AND node!=?", (job["id"], idx, node)).fetchall():
            c.execute("UPDATE attempts SET charged=1 WHERE id=?", (t["id"],))
            self.db.event(job["id"], "chunk %d attempt %d: %s rendered it in time, so %s was too slow: charged"
                          % (idx, t["n"], node, t["node"]), c)
            self._charge(c, job, dict(t), t["error"])

    def job_speed(self, c, job: dict) -> tuple[float, str]:
        """The job's seconds per frame on one node, and where the figure comes from: the median over its
        rendered chunks (render seconds / frames) and its renders in progress (elapsed / frames rendered,
        once past speed_sample_frames), else the estimate (the spec's s_per_frame, or the renderer's)."""
        jid, least = job["id"], self.s.speed_sample_frames
        done = [r[0] / r[1] for r in c.execute(
            "SELECT seconds, last - first + 1 FROM chunks WHERE job_id=? AND state='done' AND seconds > 0", (jid,))]
        running = [r[0] / r[1] for r in c.execute(
            "SELECT elapsed, frames_done FROM attempts WHERE job_id=? AND state='started' AND phase='render'"
            " AND frames_done >= ? AND elapsed > 0", (jid, least))]
        if done or running:
            return statistics.median(done + running), "measured on %d chunks, %d rendering" % (len(done), len(running))
        return self.s.s_per_frame(job["spec"]), "estimated"

    def _started_without_lease(self, c, job: dict, a: dict, node: str) -> None:
        """A node took a chunk as the job lost its lease, before its consumer was cancelled: its render
        is stopped and the chunk re-queued (not charged). Left queued, the chunk would wait forever: its
        message is gone from the queue, and the render's own reports would be dropped."""
        why = "lease lost: %s started it after the job had lost its lease" % node
        self.db.event(job["id"], "chunk %d attempt %d: %s; stopped, re-queued" % (a["idx"], a["n"], why), c)
        self._stop_and_requeue(c, job, [a], why)

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

    def _interrupted(self, job: dict, a: dict, r: dict) -> None:
        """The attempt's own worker says it lost its broker connection while rendering it (and stopped
        the render): not its fault. Re-run at once if the broker has not re-delivered it yet."""
        if r["node"] != a["node"] or a["state"] not in ("started", "lost") or a["charged"] is not None:
            return
        why = "interrupted: %s lost its broker connection mid-render" % r["node"]
        if r.get("host_full"):
            why = "interrupted: the host had no room for its parts (%s)" % (r.get("error") or "disk full")[:300]
        with self.db.tx() as c:
            if r.get("host_full"):
                self.pause_tx(c, job["id"], why)
            c.execute("UPDATE attempts SET state=CASE state WHEN 'started' THEN 'interrupted' ELSE state END,"
                      " charged=0, error=?, finished_at=coalesce(finished_at, ?) WHERE id=?",
                      (why, r.get("ts"), a["id"]))
            self.db.event(job["id"], "chunk %d attempt %d: %s; not charged" % (a["idx"], a["n"], why), c)
            self.decide_chunk(c, job, a["idx"], LOST_PRIORITY)

    def given_up(self, job: dict, a: dict, why: str, *, timed_out: bool = False) -> None:
        """The watchdog gave the attempt up (silent, or its render stalled: the node's fault; or too slow:
        README "Time limits that learn"); the revoke goes through the outbox."""
        with self.db.tx() as c:
            self.outbox(c, job["id"], "revoke", {"ids": [a["id"]]})
            self.attempt_failed(c, job, a, {"event": "lost", "ts": time.time(), "error": why, "silent": True,
                                            "timed_out": timed_out})

    def attempt_failed(self, c, job: dict, a: dict, r: dict) -> None:
        """Records a failed or lost attempt and, in the same transaction, what follows from it (a
        charge, a retry, the chunk's or the job's end)."""
        jid, idx, ev, now = job["id"], a["idx"], r["event"], time.time()
        node = a["node"] if ev == "lost" else r["node"]   # lost: the node that started it, not the one that saw it
        why = r.get("error") or LOST
        timed_out = bool(r.get("timed_out"))
        if timed_out:       # charged once another node renders it; too slow on two nodes: the job's own fault
            charged, excuse = 0, None
        elif ev == "failed" or r.get("silent") or not node:
            charged, excuse = (1 if node else 0), None
        else:
            excuse = self._excuse(a, now)
            charged = 0 if excuse else None                 # None: waits excuse_wait_s for its node's word
        c.execute("UPDATE attempts SET state=?, finished_at=?, error=?, node=coalesce(node, ?), charged=?, lost_at=?,"
                  " timed_out=? WHERE id=?", (ev, r.get("ts"), why + ("; not charged: " + excuse if excuse else ""),
                                              node, charged, now, int(timed_out), a["id"]))
        chunk = dict(c.execute("SELECT * FROM chunks WHERE job_id=? AND idx=?", (jid, idx)).fetchone())
        if chunk["state"] == "done":
            return
        self.db.event(jid, "chunk %d attempt %d on %s: %s%s" % (
            idx, a["n"], node or "?", why, "; not charged: " + excuse if excuse else
            "; charged to the node" if charged else
            "; charged only if another node renders it in time" if timed_out else
            "; waiting for the node's word before charging it"), c)
        if charged:
            self._charge(c, job, {**a, "node": node}, why)
        self.decide_chunk(c, job, idx, LOST_PRIORITY if ev == "lost" else 0)

    def _charge(self, c, job: dict, a: dict, why: str) -> None:
        jid, node = job["id"], a["node"]
        c.execute("INSERT OR IGNORE INTO node_failures(job_id, node, idx, attempt_id, reason, at)"
                  " VALUES (?,?,?,?,?,?)", (jid, node, a["idx"], a["id"], why, time.time()))
        fails = c.execute("SELECT count(DISTINCT idx) FROM node_failures WHERE job_id=? AND node=?",
                          (jid, node)).fetchone()[0]
        if fails >= self.s.blocklist_after and c.execute("INSERT OR IGNORE INTO blocklist(job_id, node, at)"
                                                          " VALUES (?,?,?)", (jid, node, time.time())).rowcount:
            self.db.event(jid, "%s blocklisted for this job: %d chunks failed there" % (node, fails), c)
            self.outbox(c, jid, "cancel_consumers", {"nodes": [node]})
            blocked = {r[0] for r in c.execute("SELECT node FROM blocklist WHERE job_id=?", (jid,))}
            if not set(job["nodes"]) - blocked:
                self.end_tx(c, job, "failed", "every node of the job is blocklisted")

    def decide_chunk(self, c, job: dict, idx: int, priority: int = 0) -> None:
        """A chunk not done with no attempt under way: a retry, the chunk's end (and the job's), or a
        wait for undecided charges. Idempotent: settle() runs it again after a charge is decided."""
        jid = job["id"]
        if c.execute("SELECT state FROM jobs WHERE id=?", (jid,)).fetchone()[0] not in LIVE:
            return
        chunk = dict(c.execute("SELECT * FROM chunks WHERE job_id=? AND idx=?", (jid, idx)).fetchone())
        tried = [dict(t) for t in c.execute("SELECT n, node, state, error, charged, timed_out FROM attempts"
                                            " WHERE job_id=? AND idx=? ORDER BY n", (jid, idx))]
        if chunk["state"] != "queued" or any(t["state"] in ("queued", "started") for t in tried):
            return
        charged = sum(1 for t in tried if t["charged"] == 1)
        undecided = sum(1 for t in tried if t["charged"] is None and t["state"] == "lost")
        too_slow = sorted({t["node"] for t in tried if t["timed_out"] and t["node"]})
        reason = None
        if len(too_slow) >= 2:
            speed, source = self.job_speed(c, job)
            reason = ("chunk %d (frames %d-%d, %d frames) was too slow on %s: this job renders at %.3f s a frame"
                      " (%s), so the chunk's limit is %.0f s (chunk_limit_floor_s + chunk_limit_factor x its"
                      " frames x that, at most chunk_limit_cap_s %g); the composition is the slow part, no node is"
                      " charged. Give the job a larger s_per_frame, or raise chunk_limit_cap_s" % (
                          idx, chunk["first"], chunk["last"], chunk["last"] - chunk["first"] + 1,
                          " and ".join(too_slow), speed, source,
                          self.s.time_limit_s(chunk["last"] - chunk["first"] + 1, speed), self.s.chunk_limit_cap_s))
        elif charged >= self.s.attempts:
            reason = "chunk %d (frames %d-%d) failed %d attempts (the cap)" % (
                idx, chunk["first"], chunk["last"], charged)
        elif len(tried) >= self.s.attempts + self.s.excused_attempts:
            reason = "chunk %d (frames %d-%d) was re-run %d times (attempts + excused_attempts)" % (
                idx, chunk["first"], chunk["last"], len(tried))
        elif charged + undecided >= self.s.attempts:
            return          # the cap, if the losses are charged: decided when they are (settle)
        if reason:
            reason += ": " + "; ".join("#%d on %s: %s" % (t["n"], t["node"] or "?", t["error"]) for t in tried)
            c.execute("UPDATE chunks SET state='failed', reason=? WHERE job_id=? AND idx=?", (reason, jid, idx))
            self.end_tx(c, job, "failed", reason)
        else:
            self.new_attempt(c, jid, idx, priority)

    def settle(self, now: float) -> None:
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
                self.decide_chunk(c, job, a["idx"], LOST_PRIORITY)

    # -- what the coordinator asks ------------------------------------------------------------------------
    def nodes_for(self, job: dict) -> list[str]:
        """The job's nodes that may take its chunks: not blocklisted, not never-lent."""
        blocked = {r["node"] for r in self.db.rows("SELECT node FROM blocklist WHERE job_id=?", (job["id"],))}
        return [n for n in job["nodes"] if n not in blocked and n not in self.s.never_lend]

    def failed_nodes(self, jid: str, idx: int) -> list[str]:
        """The nodes charged with a failure of this chunk."""
        return sorted({r["node"] for r in self.db.rows(
            "SELECT node FROM attempts WHERE job_id=? AND idx=? AND (charged=1 OR timed_out=1) AND node IS NOT NULL",
            (jid, idx))})

    def stuck(self, job: dict, now: float, up_for: float) -> list[tuple[dict, str, bool]]:
        """Started attempts to give up, why, and whether as too slow: not heard of for silent_after_s (its
        reports cannot get out), in the render phase with neither a frame rendered nor a byte written
        for stall_after_s (a hung render), or rendering for longer than the job's measured speed allows
        (time_limit_s). Each check only once the coordinator has been up and connected that long (the
        clocks are its own, and the reports of a coordinator that was away wait in the queue). Queued
        ones wait however long."""
        quiet, stall, out = self.s.silent_after_s, self.s.stall_after_s, []
        started = self.db.rows("SELECT a.*, c.first, c.last FROM attempts a JOIN chunks c ON c.job_id=a.job_id"
                               " AND c.idx=a.idx WHERE a.job_id=? AND a.state='started'", (job["id"],))
        speed = None
        for a in started:
            heard = a["heard_at"] or a["started_at"]
            frames = a["last"] - a["first"] + 1
            if up_for >= quiet and heard < now - quiet:
                out.append((a, "silent for %.0f s (silent_after_s %g): given up, revoked" % (now - heard, quiet),
                            False))
                continue
            if a["phase"] == "render" and a["elapsed"]:
                if speed is None:               # a read: no write lock for it
                    speed = self.job_speed(self.db.c, job)
                limit = self.s.time_limit_s(frames, speed[0])
                if a["elapsed"] > limit:
                    out.append((a, "too slow: %.0f s for %d of %d frames, where this job renders at %.3f s a frame"
                                   " (%s): limit %.0f s; given up, revoked" % (
                                       a["elapsed"], a["frames_done"] or 0, frames, speed[0], speed[1], limit), True))
                    continue
            if up_for >= stall and a["phase"] == "render" and a["grew_at"] and a["grew_at"] < now - stall:
                out.append((a, "its render made no progress for %.0f s (stall_after_s %g; %d of %d frames"
                               " rendered, %d bytes of parts): a hung render, given up, revoked"
                               % (now - a["grew_at"], stall, a["frames_done"] or 0, frames, a["written"] or 0),
                           False))
        return out
