"""Ingest workers that never stop silently, and the supervisor that restarts one that dies anyway.

A worker's own database errors (a full disk, an I/O error, a lock held too long) are retried with
backoff, the job it held put back in the queue without spending an attempt. /healthz reads
`Supervisor.health()`: each worker's liveness and the queue's oldest due job."""

from __future__ import annotations

import logging
import threading
import time

from smem.ingest import Pipeline

log = logging.getLogger("smem.workers")


class Worker(threading.Thread):
    def __init__(self, pipeline: Pipeline, name: str, on_done=None):
        super().__init__(name=name, daemon=True)
        self.pipeline, self.on_done = pipeline, on_done   # on_done(job): a document's job reached done
        self.stopping = threading.Event()
        self.beat = time.monotonic()      # the loop's last turn
        self.failures = 0                 # database errors in a row (0: the last turn went well)
        self.last_error: str | None = None
        self.held: dict | None = None     # the job this worker could not put back yet

    def _turn(self) -> None:
        if self.held is not None:
            self.pipeline.queue.release(self.held)
            self.held = None
        job = self.pipeline.claim(self.name)
        if job is None:
            self.failures = 0
            self.pipeline.wake.wait(self.pipeline.settings.poll_interval_s)
            self.pipeline.wake.clear()
            return
        self.held = job
        self.pipeline.run_job(job)
        self.held = None
        self.failures = 0
        if job["stage"] == "done" and self.on_done:
            self.on_done(job)

    def run(self) -> None:
        s = self.pipeline.settings
        while not self.stopping.is_set():
            self.beat = time.monotonic()
            try:
                self._turn()
            except Exception as e:   # the database failed outside the stages' own handling
                self.failures += 1
                self.last_error = "%s: %s" % (type(e).__name__, e)
                wait = min(s.retry_backoff_s * 2 ** min(self.failures, 10), s.db_retry_max_s)
                log.error("%s: database error %d in a row, retrying in %.1f s: %s", self.name, self.failures,
                          wait, self.last_error)
                self.stopping.wait(max(wait, 0.05))
        self.beat = time.monotonic()

    def stop(self) -> None:
        self.stopping.set()
        self.pipeline.wake.set()


class Supervisor(threading.Thread):
    """Starts the workers, restarts any that died (its jobs back to the queue first), stops them."""

    def __init__(self, pipeline: Pipeline, count: int, check_s: float = 1.0, on_done=None):
        super().__init__(name="smem-supervisor", daemon=True)
        self.pipeline, self.check_s, self.on_done = pipeline, check_s, on_done
        self.workers = [Worker(pipeline, "worker-%d" % i, on_done) for i in range(count)]
        self.restarts = dict.fromkeys((w.name for w in self.workers), 0)
        self.stopping = threading.Event()

    def start(self) -> None:
        for w in self.workers:
            w.start()
        super().start()

    def run(self) -> None:
        while not self.stopping.wait(self.check_s):
            for i, w in enumerate(self.workers):
                if w.is_alive() or self.stopping.is_set():
                    continue
                try:
                    n = self.pipeline.queue.requeue_orphans(w.name)
                except Exception as e:   # the database is failing too: try again at the next check
                    log.error("%s died; its jobs cannot be put back yet: %s", w.name, e)
                    continue
                log.error("%s died (its %d job(s) back in the queue); restarting it", w.name, n)
                fresh = Worker(self.pipeline, w.name, self.on_done)
                fresh.start()
                self.workers[i] = fresh
                self.restarts[w.name] += 1

    def stop(self, timeout: float = 30) -> None:
        self.stopping.set()
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(timeout=timeout)
        self.join(timeout=timeout)

    def health(self, stuck_after_s: float) -> dict:
        """{ok, workers: [...], queue: {...}, problems: [...]}; not ok when a worker is dead, failing on
        the database, or the queue stuck past stuck_after_s."""
        t = time.monotonic()
        problems, workers = [], []
        for w in self.workers:
            alive = w.is_alive()
            workers.append({"name": w.name, "alive": alive, "lastTurnAgeS": round(t - w.beat, 1),
                            "databaseErrors": w.failures, "lastError": w.last_error,
                            "restarts": self.restarts[w.name]})
            if not alive:
                problems.append("%s is dead" % w.name)
            elif w.failures:
                problems.append("%s: the database fails (%d in a row): %s" % (w.name, w.failures, w.last_error))
        try:
            queue = self.pipeline.queue.stats()
        except Exception as e:
            queue = None
            problems.append("the queue cannot be read: %s: %s" % (type(e).__name__, e))
        # A long backlog that moves is not stuck: stuck is a due job waiting past the bound while no job
        # has moved for as long.
        if (queue and queue["oldestDueAgeS"] is not None and queue["oldestDueAgeS"] > stuck_after_s
                and (queue["lastProgressAgeS"] is None or queue["lastProgressAgeS"] > stuck_after_s)):
            problems.append("stuck: the oldest due job has waited %.0f s and no job has moved for %s s (bound: %.0f s)"
                            % (queue["oldestDueAgeS"], queue["lastProgressAgeS"], stuck_after_s))
        return {"ok": not problems, "workers": workers, "queue": queue, "problems": problems}
