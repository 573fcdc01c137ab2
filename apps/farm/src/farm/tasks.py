"""The Celery app and the render task.

No result backend: every delivery of a chunk reports to the coordinator through one durable queue
(settings.reports_queue) — started, progress, then done / failed — and a delivery that RabbitMQ hands
out again (its worker died or hung: the message comes back `redelivered`) is not rendered but reported
`lost`. So each attempt is one message the coordinator published and counted in its SQLite file; the
coordinator alone decides whether to publish another (attempts cap) and the count survives a kill -9
of anything, the coordinator included (reports wait in the queue, persistent, acked after the commit).

The executables are the worker's: its settings.render's node, browser, node_modules and concurrency
replace the job spec's. With host_url the worker shares no filesystem with the host: it fetches the
bundle by hash and uploads its parts (farm.transport).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from amqp.exceptions import NotFound as NOT_FOUND
from celery import Celery
from celery.exceptions import Reject, SoftTimeLimitExceeded
from kombu import Connection, Exchange, Queue

from farm import render as media
from farm import transport
from farm.config import Settings, worker_spec

app = Celery("farm")
log = logging.getLogger(__name__)
here = SimpleNamespace(settings=Settings(), node=socket.gethostname(), host=None, user=None,   # set by configure()
                       frozen_at=None, tick_at=None)

RETRY = {"max_retries": 5, "interval_start": 0.2, "interval_step": 0.5, "interval_max": 3}
QUEUE_ARGS = {"x-max-priority": 9}


def queue_of(job_id: str) -> Queue:
    name = "farm.job." + job_id
    return Queue(name, Exchange(name, "direct"), routing_key=name,    # as add_consumer declares it
                 queue_arguments=QUEUE_ARGS)


def reports_exchange(s: Settings) -> Exchange:
    """The workers report through this direct exchange (bound to the reports queue by the coordinator),
    so that a node's broker user needs no write on the default exchange, which reaches every queue."""
    return Exchange(s.reports_queue, "direct", durable=True)


def configure(s: Settings, node_name: str | None = None) -> Celery:
    here.settings = s
    here.user = Connection(s.broker_url).userid      # what the broker validates each report's user_id against
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
    """One report, with the AMQP user_id property: RabbitMQ refuses a publish whose user_id is not the
    connection's user, so the coordinator can trust it to say which node sent the report. Not declared
    here: the coordinator declares the exchange and the queue (a node's user may not)."""
    body = {"event": event, "ts": time.time(), "node": here.node, **fields}
    with app.producer_pool.acquire(block=True) as producer:
        producer.publish(body, exchange=reports_exchange(here.settings), routing_key=here.settings.reports_queue,
                         serializer="json", delivery_mode=2, user_id=here.user, retry=True, retry_policy=RETRY)


def _ticker(stop: threading.Event, t0: float, ids: dict, where: dict) -> None:
    """Progress as the render makes it: its phase, and in the render phase the frames the renderer
    says it has rendered and the bytes of its parts in the work directory (the coordinator abandons a
    render when neither advances)."""
    while not stop.wait(here.settings.progress_interval_s):
        phase = where.get("phase")
        frames = grown = None
        if phase == "render":
            frames = media.frames_done(where.get("progress"))
            grown = media.written(where["workdir"], ids["index"])
        try:
            report("progress", elapsed=time.time() - t0, phase=phase, frames=frames, written=grown, **ids)
        except Exception:   # a missed progress report only ages the chunk in `farm status`
            pass


def _host() -> transport.Host | None:
    s = here.settings
    if s.host_url and here.host is None:    # made in the pool child, which uses it
        here.host = transport.Host(s.host_url, s.worker_token(), s.cache_dir, keep=s.bundle_cache_keep)
    return here.host if s.host_url else None


def _put_back(request, kwargs: dict) -> bool:
    """A copy to the job's queue, through the job's own exchange (a node's broker user may not write
    to the default one) and not declared: a job that ended meanwhile has neither, and the copy goes
    nowhere. Not Reject(requeue=True): the message would come back `redelivered`, which the next
    worker takes for a lost one. The copy keeps the time limits the coordinator gave the chunk.

    False when the broker did not take the copy (it refused it): this delivery is then the chunk's
    only one. A connection lost after the broker took the copy also reads False; the chunk is then
    rendered twice under one attempt id, and the coordinator keeps the first `done`."""
    q = queue_of(kwargs["job"])
    hard, soft = request.timelimit or (None, None)
    try:
        app.send_task("farm.render", task_id=request.id, kwargs={**kwargs, "held": kwargs.get("held", 0) + 1},
                      exchange=q.exchange.name, routing_key=q.routing_key, declare=[], ignore_result=True,
                      priority=request.delivery_info.get("priority") or 0, time_limit=hard, soft_time_limit=soft)
    except NOT_FOUND:                   # the job's exchange is gone with the job
        pass
    except SoftTimeLimitExceeded:
        raise
    except Exception as e:
        log.warning("chunk %s of job %s not put back (%s: %s): rendered here", kwargs["index"], kwargs["job"],
                    type(e).__name__, e)
        return False
    return True


def _report_interrupted(ids: dict) -> None:
    """From the worker's main process, which lost its broker connection: until the broker takes it
    (the connection is down now), within interrupted_report_s."""
    deadline = time.monotonic() + here.settings.interrupted_report_s
    while True:
        try:
            return report("interrupted", **ids)
        except Exception:
            if time.monotonic() > deadline:
                return
            time.sleep(1.0)


# A 1 s tick this late: the process was stopped (docker pause, SIGSTOP). Shorter than the broker's
# own limit (two missed heartbeats, 12 s at broker_heartbeat 6), longer than a busy machine's delay.
FROZEN_AFTER_S = 8.0
FROZEN_MEMORY_S = 300.0  # a freeze this recent explains a lost connection: the node's own fault


def _watch_freezes() -> None:
    here.tick_at = last = time.monotonic()
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        if now - last > FROZEN_AFTER_S:    # CLOCK_MONOTONIC runs on while the process is frozen
            here.frozen_at = now
        here.tick_at = last = now


def was_frozen() -> bool:
    """Frozen lately: the watcher saw a late tick, or has not ticked for FROZEN_AFTER_S (the process was
    continued just now, and this thread runs before the watcher's: both orders happen)."""
    now = time.monotonic()
    recent = here.frozen_at is not None and now - here.frozen_at < FROZEN_MEMORY_S
    return recent or (here.tick_at is not None and now - here.tick_at > FROZEN_AFTER_S)


def watch_freezes() -> None:
    """In the worker's main process: notes when the process itself was frozen, so that a connection it
    lost while frozen is not reported as the link's fault."""
    threading.Thread(target=_watch_freezes, name="farm-freeze-watch", daemon=True).start()


class RenderTask(app.Task):
    def on_retry(self, exc, task_id, args, kwargs, einfo):
        """Celery calls this in the worker's main process when it cancels a running task because its
        broker connection was lost (worker_cancel_long_running_tasks_on_connection_loss): the node tells
        the coordinator, so that the broker's re-delivery is not charged to it (README "Whose fault")."""
        if einfo is None and kwargs and "cancelled by Celery" in str(exc) and not was_frozen():
            ids = {"job": kwargs.get("job"), "index": kwargs.get("index"), "attempt": task_id, "key": kwargs.get("key")}
            threading.Thread(target=_report_interrupted, args=(ids,), daemon=True).start()


@app.task(name="farm.render", bind=True, acks_late=True, reject_on_worker_lost=True, ignore_result=True,
          base=RenderTask)
def render(self, job: str, index: int, *, first: int, last: int, spec: dict, avoid=None, held: int = 0,
           key: str | None = None, avoid_for_s: float | None = None) -> None:
    ids = {"job": job, "index": index, "attempt": self.request.id, "key": key}
    s = here.settings
    if self.request.delivery_info.get("redelivered"):
        report("lost", **ids)
        time.sleep(s.lost_hold_s)
        return
    # A retry avoids the node that failed it, while no other node has taken it for silent_after_s. Back
    # in the queue first, then the hold: another worker that frees up meanwhile finds it there. When no
    # copy went, it is rendered here: acking this delivery would leave the attempt queued with no
    # message, which nothing gives up.
    if here.node in (avoid or ()) and held * s.avoid_hold_s < (avoid_for_s or s.silent_after_s) and _put_back(
            self.request, {"job": job, "index": index, "first": first, "last": last, "spec": spec,
                           "avoid": avoid, "held": held, "key": key, "avoid_for_s": avoid_for_s}):
        time.sleep(s.avoid_hold_s)
        return
    try:
        report("started", first=first, last=last, **ids)
    except Exception as e:
        # Unreported, the attempt would stay queued with no message behind it, its job running (and its
        # lease renewed) for ever. Back to the queue, re-delivered: the next worker reports it lost.
        log.warning("chunk %s of job %s: `started` could not be reported (%s: %s): returned to the queue",
                    index, job, type(e).__name__, e)
        raise Reject(str(e), requeue=True) from e
    t0, stop, timings, where = time.time(), threading.Event(), {}, {"phase": "fetch"}
    ticker = threading.Thread(target=_ticker, args=(stop, t0, ids, where), daemon=True)
    ticker.start()
    try:
        out = _render(job, index, first, last, worker_spec(spec, s), timings=timings, where=where, ids=ids)
    except SoftTimeLimitExceeded:
        stop.set()
        report("failed", error="too slow: took longer than the workers' time limit, %.0f s (chunk_limit_cap_s)" % (
                   (self.request.timelimit or (None, None))[1] or 0), timed_out=True, elapsed=time.time() - t0,
               timings=timings, **ids)
        return
    except Exception as e:
        stop.set()
        report("failed", error=("%s: %s" % (type(e).__name__, e))[:2000], elapsed=time.time() - t0,
               timings=timings, **ids)
        time.sleep(s.failure_backoff_s)
        return
    stop.set()
    report("done", frames=out.get("frames"), seconds=out.get("seconds", time.time() - t0),
           elapsed=time.time() - t0, video=out["video"], audio=out["audio"], timings=timings, **ids)


def _render(job: str, index: int, first: int, last: int, spec: dict, *, timings: dict, where: dict,
            ids: dict) -> dict:
    """render_chunk's result, its parts where the host reads them: video and audio relative to the
    host's parts_dir (the host mounts the share maybe elsewhere, or the parts were uploaded there)."""
    s, host = here.settings, _host()
    t = time.monotonic()
    if host and spec.get("bundleHash"):
        spec = {**spec, "bundle": str(host.bundle(spec["bundleHash"]))}
    timings["fetch_s"] = round(time.monotonic() - t, 3)
    parts = Path(s.cache_dir) / "parts" if host else Path(s.parts_dir)
    workdir = parts / job
    workdir.mkdir(parents=True, exist_ok=True)
    t = time.monotonic()
    progress = media.progress_path(Path(s.cache_dir) / "progress", index, "%s.%s" % (job, secrets.token_hex(4)))
    progress.parent.mkdir(parents=True, exist_ok=True)
    where.update(workdir=workdir, progress=progress, phase="render")
    out = media.render_chunk(spec, index, first, last, workdir, progress=progress)
    where["phase"] = "upload" if host else "done"
    timings["render_s"] = round(time.monotonic() - t, 3)
    files = {k: Path(out[k]) for k in ("video", "audio")}
    if host:
        t = time.monotonic()
        try:
            for f in files.values():
                host.upload(job, f, attempt=ids["attempt"], key=ids["key"])
        finally:                    # uploaded or not, the node keeps no parts
            for f in files.values():
                f.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                workdir.rmdir()
        timings["upload_s"] = round(time.monotonic() - t, 3)
        return {**out, **{k: "%s/%s" % (job, f.name) for k, f in files.items()}}
    return {**out, **{k: str(f.resolve().relative_to(parts.resolve())) for k, f in files.items()}}
