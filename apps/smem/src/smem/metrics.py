"""smem in Prometheus text (GET /metrics, a token with the metrics scope): the queue, the workers, the
lanes and the leases read at scrape time; search and ingest latency and degraded answers counted as
they happen. One registry per service (tests build several)."""

from __future__ import annotations

import time
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from smem import __version__
from smem.db import parse_time

disable_created_metrics()   # no *_created series: a restart shows as counters starting again, as usual
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DOCUMENT_STATUSES = ("queued", "extracting", "indexing", "done", "failed")
JOB_STATES = ("queued", "running", "done", "failed")
SEARCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
INGEST_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)


def degraded_cause(entry: str) -> str:
    """A search answer's `degraded` entry as a bounded label: embedder, reranker, or node_down."""
    return entry if entry in ("embedder", "reranker") else "node_down"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.search_seconds = Histogram("smem_search_duration_seconds", "Search answer time, by mode", ["mode"],
                                        buckets=SEARCH_BUCKETS, registry=self.registry)
        self.ingest_seconds = Histogram("smem_ingest_duration_seconds", "A document's time from queued to done",
                                        buckets=INGEST_BUCKETS, registry=self.registry)
        self.degraded = Counter("smem_degraded_answers", "Search answers served degraded, by cause", ["cause"],
                                registry=self.registry)
        for cause in ("embedder", "reranker", "node_down"):
            self.degraded.labels(cause)
        self.ops = None

    def bind(self, ops) -> None:
        """The live state (queue, workers, lanes, leases) comes from ops at each scrape."""
        self.ops = ops
        self.registry.register(_State(ops))

    def searched(self, mode: str, seconds: float, degraded: list[str]) -> None:
        self.search_seconds.labels(mode).observe(seconds)
        for cause in {degraded_cause(d) for d in degraded}:
            self.degraded.labels(cause).inc()

    def job_done(self, job: dict) -> None:
        """A worker finished a document's job: its time from queued to done."""
        created = self.ops.db.scalar("SELECT created_at FROM documents WHERE id=?", (job["document_id"],))
        if created:
            self.ingest_seconds.observe(max(time.time() - _epoch(created), 0.0))

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _epoch(stored: str) -> float:
    return datetime.fromisoformat(parse_time(stored).replace("Z", "+00:00")).timestamp()


def _counts(db, name: str, doc: str, table: str, column: str, *, keys: tuple[str, ...]) -> GaugeMetricFamily:
    """Rows of table by column, every known value present (0 when none)."""
    # One count per known value, each an index range (a GROUP BY would read every row of the table).
    got = {k: db.scalar("SELECT count(*) FROM %s WHERE %s = ?" % (table, column), (k,)) for k in keys}
    g = GaugeMetricFamily(name, doc, labels=[column])
    for value, n in sorted(got.items()):
        g.add_metric([value], n)
    return g


class _State:
    def __init__(self, ops) -> None:
        self.ops = ops

    def collect(self):
        ops, db = self.ops, self.ops.db
        info = GaugeMetricFamily("smem_info", "smem's version, schema and embedder", labels=["version", "schema",
                                                                                           "embedder"])
        info.add_metric([__version__, str(db.version), ops.embedder.name], 1)
        yield info

        yield _counts(db, "smem_documents", "Documents by status", "documents", "status", keys=DOCUMENT_STATUSES)
        yield _counts(db, "smem_jobs", "Ingest jobs by state", "jobs", "state", keys=JOB_STATES)

        health = ops.health()
        q = health["queue"] or {}
        yield GaugeMetricFamily("smem_queue_oldest_due_age_seconds",
                                "How long the oldest due queued job has waited (0: none is due)",
                                value=q.get("oldestDueAgeS") or 0)
        yield GaugeMetricFamily("smem_queue_last_progress_age_seconds", "Seconds since any job last moved (0: no job)",
                                value=q.get("lastProgressAgeS") or 0)
        yield GaugeMetricFamily("smem_healthy", "1 when /healthz answers 200", value=int(health["ok"]))
        up = GaugeMetricFamily("smem_worker_up", "1 while an ingest worker's thread lives", labels=["worker"])
        errors = GaugeMetricFamily("smem_worker_database_errors", "A worker's database errors in a row",
                                   labels=["worker"])
        restarts = CounterMetricFamily("smem_worker_restarts", "Times the supervisor restarted a worker",
                                       labels=["worker"])
        for w in health["workers"]:
            up.add_metric([w["name"]], int(w["alive"]))
            errors.add_metric([w["name"]], w["databaseErrors"])
            restarts.add_metric([w["name"]], w["restarts"])
        yield up
        yield errors
        yield restarts

        node_up = GaugeMetricFamily("smem_lane_node_up", "1 unless the lane marked the node's model down",
                                    labels=["lane", "node", "model"])
        leased = GaugeMetricFamily("smem_lane_node_leased", "1 while the node is lent out (a lease)",
                                   labels=["lane", "node"])
        inflight = GaugeMetricFamily("smem_lane_node_calls_in_flight", "Calls given to the node, waiting or running",
                                     labels=["lane", "node"])
        for lane, v in sorted((ops.lanes.report() if ops.lanes else {}).items()):
            for node, n in sorted(v["nodes"].items()):
                for model, m in sorted(n["models"].items()):
                    node_up.add_metric([lane, node, model], int(m["downUntil"] is None))
                leased.add_metric([lane, node], int(n["leasedBy"] is not None))
                inflight.add_metric([lane, node], n["inFlight"])
        yield node_up
        yield leased
        yield inflight
        yield GaugeMetricFamily("smem_leases", "Live leases", value=len(ops.leases.live()) if ops.leases else 0)
