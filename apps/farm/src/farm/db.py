"""Job state in one SQLite file on the host: the coordinator writes it, the CLI and API read it and
submit / cancel through it. WAL, so readers never wait for the coordinator."""

from __future__ import annotations

import json
import secrets
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path

LIVE = ("submitted", "running")          # states a job can still render in
FINAL = ("done", "failed", "cancelled")
CANCELLABLE = (*LIVE, "joining")

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
  id TEXT PRIMARY KEY, state TEXT NOT NULL, spec TEXT NOT NULL, out TEXT NOT NULL, nodes TEXT NOT NULL,
  frames INTEGER NOT NULL, fps REAL NOT NULL, verify INTEGER NOT NULL DEFAULT 0,
  cancel_requested INTEGER NOT NULL DEFAULT 0, reason TEXT, result TEXT,
  created_at REAL NOT NULL, started_at REAL, finished_at REAL, nodes_released INTEGER NOT NULL DEFAULT 0,
  timings TEXT);
CREATE TABLE IF NOT EXISTS chunks (
  job_id TEXT NOT NULL, idx INTEGER NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
  state TEXT NOT NULL DEFAULT 'queued', attempts INTEGER NOT NULL DEFAULT 0,
  node TEXT, video TEXT, audio TEXT, seconds REAL, reason TEXT, done_at REAL, timings TEXT,
  PRIMARY KEY (job_id, idx));
-- One row per message published for a chunk; its id is the Celery task id.
CREATE TABLE IF NOT EXISTS attempts (
  id TEXT PRIMARY KEY, job_id TEXT NOT NULL, idx INTEGER NOT NULL, n INTEGER NOT NULL,
  state TEXT NOT NULL DEFAULT 'queued', published INTEGER NOT NULL DEFAULT 0, priority INTEGER NOT NULL DEFAULT 0,
  node TEXT, avoid TEXT,
  created_at REAL NOT NULL, started_at REAL, last_report_at REAL, elapsed REAL, finished_at REAL, error TEXT,
  heard_at REAL);
CREATE TABLE IF NOT EXISTS node_failures (
  job_id TEXT NOT NULL, node TEXT NOT NULL, idx INTEGER NOT NULL, attempt_id TEXT NOT NULL, reason TEXT,
  at REAL NOT NULL, PRIMARY KEY (attempt_id));
CREATE TABLE IF NOT EXISTS blocklist (
  job_id TEXT NOT NULL, node TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (job_id, node));
CREATE TABLE IF NOT EXISTS consumers (
  job_id TEXT NOT NULL, node TEXT NOT NULL, PRIMARY KEY (job_id, node));
CREATE TABLE IF NOT EXISTS leases (
  id TEXT PRIMARY KEY, job_id TEXT NOT NULL, nodes TEXT NOT NULL, taken_at REAL NOT NULL,
  expires_at TEXT, renewed_at REAL, released_at REAL);
CREATE TABLE IF NOT EXISTS events (
  job_id TEXT NOT NULL, at REAL NOT NULL, text TEXT NOT NULL);
-- The coordinator's next steps toward the broker, written in the transaction that decided them and
-- applied (idempotently) after it, at every tick and at start-up: README "Crash safety".
CREATE TABLE IF NOT EXISTS outbox (
  id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, action TEXT NOT NULL, args TEXT NOT NULL,
  created_at REAL NOT NULL, done_at REAL);
-- The broker's outages the coordinator saw (README "Whose fault"), kept across its restarts, and when it
-- last ticked (coordinator_alive_at: a host reboot since then restarted the broker too).
CREATE TABLE IF NOT EXISTS outages (lost REAL NOT NULL, back REAL NOT NULL, why TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS attempts_chunk ON attempts(job_id, idx);
CREATE INDEX IF NOT EXISTS attempts_state ON attempts(state);     -- the tick's undecided losses, of every job
CREATE INDEX IF NOT EXISTS events_job ON events(job_id, at);
"""
# Columns added since the first slice: a database it made gets them at the next open.
# attempts.heard_at is the coordinator's clock (the watchdog's), last_report_at the worker's.
ADDED = [("jobs", "timings", "TEXT"), ("chunks", "timings", "TEXT"), ("attempts", "avoid", "TEXT"),
         ("attempts", "heard_at", "REAL"), ("attempts", "charged", "INTEGER"), ("attempts", "lost_at", "REAL"),
         ("attempts", "phase", "TEXT"), ("attempts", "written", "INTEGER"), ("attempts", "grew_at", "REAL"),
         ("attempts", "frames_done", "INTEGER"), ("attempts", "timed_out", "INTEGER"), ("jobs", "paused", "TEXT"),
         ("attempts", "key", "TEXT"), ("jobs", "join_failures", "INTEGER"), ("jobs", "join_after", "REAL")]
# jobs.join_failures: the join attempts that failed since the job began joining (or since `farm join JOB`);
# join_after (time.time()) the next attempt's earliest start (README "Long joins")
# attempts.key: a secret that goes out in the attempt's message alone: only the node that took it can report
# on it or upload its parts (README "Reports belong to an attempt")
# jobs.paused: why the job publishes no chunk now (the host's disk is full); cleared when space is back
# attempts.timed_out: given up as too slow for the job's measured speed (or the workers' cap). Charged to its
# node only once another node renders the chunk; a chunk too slow on two nodes fails the job instead.
# attempts.frames_done: the frames its renderer says it has rendered; written: the bytes of its parts in
# the work directory; grew_at (the coordinator's clock) when either last advanced, or when the render
# phase began: a render with neither for stall_after_s is abandoned
# attempts.charged: 1 the node's fault (it counts against the chunk's attempts and the node), 0 not (a broker
# fault), NULL not decided yet (a loss waiting for its excuse; README "Whose fault")
TIMINGS = ("bundle_s", "fetch_s", "render_s", "upload_s", "join_s", "verify_s")


class DB:
    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.c = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
        self.c.row_factory = sqlite3.Row
        self.c.execute("PRAGMA busy_timeout=30000")
        for _ in range(300):   # switching to WAL does not wait on the busy timeout: another process may be creating it
            try:
                if self.c.execute("PRAGMA journal_mode").fetchone()[0] == "wal" or \
                        self.c.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal":
                    break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.1)
        self.c.executescript(SCHEMA)
        for table, column, kind in ADDED:
            if column not in {r[1] for r in self.c.execute("PRAGMA table_info(%s)" % table)}:
                try:
                    self.c.execute("ALTER TABLE %s ADD COLUMN %s %s" % (table, column, kind))
                except sqlite3.OperationalError:   # another process added it just now
                    pass

    @contextmanager
    def tx(self):
        self.c.execute("BEGIN IMMEDIATE")
        try:
            yield self.c
        except BaseException:
            self.c.execute("ROLLBACK")
            raise
        self.c.execute("COMMIT")

    def rows(self, sql: str, args=()) -> list[dict]:
        return [dict(r) for r in self.c.execute(sql, args)]

    def one(self, sql: str, args=()) -> dict | None:
        r = self.c.execute(sql, args).fetchone()
        return dict(r) if r else None

    def event(self, job_id: str, text: str, c=None) -> None:
        (c or self.c).execute("INSERT INTO events(job_id, at, text) VALUES (?,?,?)", (job_id, time.time(), text))

    def job(self, job_id: str) -> dict | None:
        j = self.one("SELECT * FROM jobs WHERE id=?", (job_id,))
        if j:
            for k in ("spec", "nodes", "result", "timings"):
                j[k] = json.loads(j[k]) if j[k] else None
        return j

    # -- what the CLI / API do --------------------------------------------------------------
    def submit(self, spec: dict, out: str, nodes: list[str], chunks: list[tuple[int, int, int]], *,
               frames: int, fps: float, verify: bool = False, timings: dict | None = None) -> str:
        job_id = secrets.token_hex(4)
        with self.tx() as c:
            c.execute("INSERT INTO jobs(id, state, spec, out, nodes, frames, fps, verify, created_at, timings)"
                      " VALUES (?,?,?,?,?,?,?,?,?,?)",
                      (job_id, "submitted", json.dumps(spec), str(out), json.dumps(nodes), frames, fps, int(verify),
                       time.time(), json.dumps(timings) if timings else None))
            c.executemany("INSERT INTO chunks(job_id, idx, first, last) VALUES (?,?,?,?)",
                          [(job_id, i, a, b) for i, a, b in chunks])
            self.event(job_id, "submitted: %d frames in %d chunks on %s" % (frames, len(chunks), ", ".join(nodes)), c)
        return job_id

    def request_cancel(self, job_id: str) -> bool:
        """Marks a live or joining job for cancelling (the coordinator does it, now or at its next start)."""
        with self.tx() as c:
            n = c.execute("UPDATE jobs SET cancel_requested=1 WHERE id=? AND state IN (%s)"
                          % ",".join("?" * len(CANCELLABLE)), (job_id, *CANCELLABLE)).rowcount
            if n:
                self.event(job_id, "cancel requested", c)
        return bool(n)

    def request_join(self, job_id: str, parts_dir: str | Path) -> str | None:
        """A failed job whose parts are all kept goes back to joining (the coordinator joins it, with its
        join_attempts again); else why not."""
        job = self.job(job_id)
        if job is None:
            return "no job %s" % job_id
        if job["state"] != "failed":
            return "job %s is %s: only a failed job is joined again" % (job_id, job["state"])
        chunks = self.rows("SELECT idx, state, video, audio FROM chunks WHERE job_id=? ORDER BY idx", (job_id,))
        unrendered = [c["idx"] for c in chunks if c["state"] != "done" or not c["video"] or not c["audio"]]
        if unrendered:
            return "job %s failed before all its chunks were rendered (not rendered: %s): submit it again" % (
                job_id, ", ".join(map(str, unrendered[:10])) + (" ..." if len(unrendered) > 10 else ""))
        missing = [str(Path(parts_dir) / c[k]) for c in chunks for k in ("video", "audio")
                   if not (Path(parts_dir) / c[k]).is_file()]
        if missing:
            return "job %s: %d of its parts are gone (%s%s), pruned by farm gc: submit it again" % (
                job_id, len(missing), missing[0], " ..." if len(missing) > 1 else "")
        with self.tx() as c:
            n = c.execute("UPDATE jobs SET state='joining', reason=NULL, finished_at=NULL, join_failures=0,"
                          " join_after=NULL, cancel_requested=0 WHERE id=? AND state='failed'", (job_id,)).rowcount
            if n:
                self.event(job_id, "joining again (farm join)", c)
        return None if n else "job %s changed meanwhile: try again" % job_id

    def view(self, job_id: str, stale_after_s: float = 30.0) -> dict | None:
        """Everything `farm status` shows."""
        job = self.job(job_id)
        if job is None:
            return None
        now = time.time()
        chunks = self.rows("SELECT * FROM chunks WHERE job_id=? ORDER BY idx", (job_id,))
        live = {a["idx"]: a for a in self.rows(
            "SELECT * FROM attempts WHERE job_id=? AND state='started' ORDER BY n", (job_id,))}
        mean = self.one("SELECT avg(seconds * 1.0 / (last - first + 1)) AS s FROM chunks"
                        " WHERE job_id=? AND state='done' AND seconds > 0", (job_id,))["s"]
        done_frames = 0.0
        for ch in chunks:
            ch["timings"] = json.loads(ch["timings"]) if ch["timings"] else None
            size = ch["last"] - ch["first"] + 1
            a = live.get(ch["idx"]) if ch["state"] != "done" else None
            ch["frames"], ch["fraction"], ch["age"] = size, 0.0, None
            if ch["state"] == "done":
                ch["fraction"] = 1.0
            elif a:
                ch["node"], ch["age"] = a["node"], now - (a["last_report_at"] or a["started_at"])
                ch["state"] = "stale" if ch["age"] > stale_after_s else "rendering"
                if a["frames_done"]:                      # what its renderer says
                    ch["fraction"] = min(0.99, a["frames_done"] / size)
                elif mean and ch["state"] == "rendering":   # an estimate from the chunks already done
                    ch["fraction"] = min(0.95, (a["elapsed"] or 0.0) / (mean * size))
            done_frames += ch["fraction"] * size
        failures = self.rows("SELECT node, count(*) AS n FROM node_failures WHERE job_id=? GROUP BY node", (job_id,))
        return {
            "job": job, "chunks": chunks, "doneFrames": done_frames,
            "retries": self.one("SELECT count(*) AS n FROM attempts WHERE job_id=? AND n > 1", (job_id,))["n"],
            "nodesInUse": sorted({a["node"] for a in live.values() if a["node"]}),
            "failures": {r["node"]: r["n"] for r in failures},
            "blocklist": [r["node"] for r in self.rows("SELECT node FROM blocklist WHERE job_id=?", (job_id,))],
            "leases": self.rows("SELECT * FROM leases WHERE job_id=? ORDER BY taken_at", (job_id,)),
            "events": self.rows("SELECT at, text FROM events WHERE job_id=? ORDER BY at, rowid", (job_id,)),
            "timings": timings(job, chunks),
        }


def timings(job: dict, chunks: list[dict]) -> dict:
    """Where a job's time went, in seconds: bundle (at submit), fetch / render / upload summed over
    the chunks (node-seconds, the first done of each), join and verify (the host)."""
    out = dict(job.get("timings") or {})
    for k in ("fetch_s", "render_s", "upload_s"):
        got = [c["timings"][k] for c in chunks if c.get("timings") and c["timings"].get(k) is not None]
        if got:
            out[k] = round(sum(got), 3)
    return {k: out[k] for k in TIMINGS if k in out}
