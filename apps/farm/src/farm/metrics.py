"""The farm in Prometheus text (GET /metrics on the API, its metrics token): read from the database at
each scrape, so the API process holds no counts of its own and a restart loses nothing.

Every figure is what the database holds now; `farm gc` removes finished jobs and their rows, so
the totals over jobs are gauges, not counters."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from farm.db import DB

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
JOB_STATES = ("submitted", "running", "joining", "done", "failed", "cancelled")
CHUNK_STATES = ("queued", "done", "failed")   # a chunk rendering now is an attempt started
ATTEMPT_STATES = ("queued", "started", "done", "failed", "lost", "interrupted", "revoked")
# An attempt that ended this way and was followed by another of its chunk: a re-queue, by its cause.
REQUEUE_CAUSES = ("failed", "lost", "interrupted")


def _by(db: DB, sql: str, keys: tuple[str, ...]) -> dict[str, float]:
    got = {str(k): v for k, v in db.c.execute(sql).fetchall()}
    return dict.fromkeys(keys, 0) | got


class _Farm:
    def __init__(self, db: DB) -> None:
        self.db = db

    def gauge(self, name: str, doc: str, label: str, values: dict) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=[label])
        for k, v in sorted(values.items()):
            g.add_metric([k], v)
        return g

    def collect(self):
        db, now = self.db, time.time()
        yield self.gauge("farm_jobs", "Jobs by state", "state",
                         _by(db, "SELECT state, count(*) FROM jobs GROUP BY state", JOB_STATES))
        yield self.gauge("farm_chunks", "Chunks by state", "state",
                         _by(db, "SELECT state, count(*) FROM chunks GROUP BY state", CHUNK_STATES))
        yield self.gauge("farm_attempts", "Chunk attempts (broker deliveries) by state", "state",
                         _by(db, "SELECT state, count(*) FROM attempts GROUP BY state", ATTEMPT_STATES))
        yield self.gauge("farm_requeues", "Attempts that ended without the chunk and were followed by another, "
                         "by how they ended", "cause",
                         _by(db, "SELECT a.state, count(*) FROM attempts a WHERE a.state IN ('failed','lost',"
                             "'interrupted') AND EXISTS (SELECT 1 FROM attempts b WHERE b.job_id=a.job_id AND"
                             " b.idx=a.idx AND b.n > a.n) GROUP BY a.state", REQUEUE_CAUSES))
        yield self.gauge("farm_node_failures", "Attempts charged to a node (its fault)", "node",
                         _by(db, "SELECT node, count(*) FROM node_failures GROUP BY node", ()))
        yield self.gauge("farm_blocklisted_jobs", "Live jobs that no longer send chunks to the node", "node",
                         _by(db, "SELECT b.node, count(*) FROM blocklist b JOIN jobs j ON j.id=b.job_id"
                             " WHERE j.state IN ('submitted','running') GROUP BY b.node", ()))
        frames = db.c.execute("SELECT coalesce(sum(last - first + 1), 0) FROM chunks WHERE state='done'").fetchone()[0]
        yield GaugeMetricFamily("farm_frames_rendered", "Frames in done chunks (of the jobs the database holds)",
                                value=frames)
        # A running job's last sign of life: a chunk done, or a worker's report of an attempt.
        progress = GaugeMetricFamily("farm_job_last_progress_age_seconds",
                                     "Seconds since a running job's last chunk finished or attempt reported",
                                     labels=["job_id"])   # "job" is the scrape's own label
        for r in db.rows("SELECT j.id, max(coalesce(j.started_at, j.created_at),"
                         " coalesce((SELECT max(done_at) FROM chunks WHERE job_id=j.id), 0),"
                         " coalesce((SELECT max(heard_at) FROM attempts WHERE job_id=j.id), 0)) AS at"
                         " FROM jobs j WHERE j.state='running'"):
            progress.add_metric([r["id"]], max(now - r["at"], 0.0))
        yield progress


def registry(db: DB) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Farm(db))
    return reg


def render(reg: CollectorRegistry) -> bytes:
    return generate_latest(reg)
