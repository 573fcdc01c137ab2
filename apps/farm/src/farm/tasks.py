"""The Celery app and the render task.

No result backend: every delivery of a chunk reports to the coordinator through one durable queue
(settings.reports_queue) — started, progress, then done / failed — and a delivery that RabbitMQ hands
out again (its worker died or hung: the message comes back `redelivered`) is not rendered but reported
`lost`. So each attempt is one message the coordinator published and counted in its SQLite file; the
coordinator alone decides whether to publish another (attempts cap) and the count survives a kill -9
of anything, the coordinator included (reports wait in the queue, persistent, acked after the commit).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from celery import Celery
from kombu import Queue

from farm import render as media
from farm.config import Settings

app = Celery("farm")
here = SimpleNamespace(settings=Settings(), node=socket.gethostname())   # set by configure()

RETRY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 3}


def configure(s: Settings, node_name: str | None = None) -> Celery:
    here.settings = s
    if node_name:
        here.node = node_name
    app.conf.update(
        broker_url=s.broker_url,
        broker_heartbeat=s.broker_heartbeat,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,           # a node's worker waits for the broker
        broker_transport_options={"confirm_publish": True},   # a report or chunk is on the broker when publish returns
        task_serializer="json", accept_content=["json"], result_serializer="json",
        result_backend=None, task_ignore_result=True,
        task_acks_late=True,                           # ack after the render: a dead worker's chunk goes back
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,                  # with -c 1: a worker holds only the chunk it renders
        worker_cancel_long_running_tasks_on_connection_loss=True,   # its chunk went to another node already
        worker_hijack_root_logger=False,
        task_create_missing_queues=True,
    )
    return app


def report(event: str, **fields) -> None:
    body = {"event": event, "ts": time.time(), "node": here.node, **fields}
    q = Queue(here.settings.reports_queue, routing_key=here.settings.reports_queue)
    with app.producer_pool.acquire(block=True) as producer:
        producer.publish(body, exchange="", routing_key=q.name, serializer="json", delivery_mode=2,
                         declare=[q], retry=True, retry_policy=RETRY)


def _ticker(stop: threading.Event, t0: float, ids: dict) -> None:
    while not stop.wait(here.settings.progress_interval_s):
        try:
            report("progress", elapsed=time.time() - t0, **ids)
        except Exception:   # a missed progress report only ages the chunk in `farm status`
            pass


@app.task(name="farm.render", bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True)
def render(self, job: str, index: int, *, first: int, last: int, spec: dict) -> None:
    ids = {"job": job, "index": index, "attempt": self.request.id}
    if self.request.delivery_info.get("redelivered"):
        report("lost", **ids)
        time.sleep(here.settings.lost_hold_s)
        return
    report("started", first=first, last=last, **ids)
    t0, stop = time.time(), threading.Event()
    ticker = threading.Thread(target=_ticker, args=(stop, t0, ids), daemon=True)
    ticker.start()
    parts = Path(here.settings.parts_dir)
    workdir = parts / job
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        out = media.render_chunk(spec, index, first, last, workdir)
    except Exception as e:
        stop.set()
        report("failed", error=("%s: %s" % (type(e).__name__, e))[:2000], elapsed=time.time() - t0, **ids)
        time.sleep(here.settings.failure_backoff_s)
        return
    stop.set()
    # Paths relative to parts_dir: the host mounts the same share, maybe elsewhere.
    rel = {k: str(Path(out[k]).resolve().relative_to(parts.resolve())) for k in ("video", "audio")}
    report("done", frames=out.get("frames"), seconds=out.get("seconds", time.time() - t0),
           elapsed=time.time() - t0, **rel, **ids)
