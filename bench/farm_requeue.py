#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Re-queue time of the farm (the goal: under 30 s): a worker's process group killed (`kill -9`) or
stopped (`SIGSTOP`: a hung node, as `docker pause` leaves one) mid-chunk, and how long until its
chunk runs again on another worker.

The engine's test bed (apps/farm/tests/_engine.py): a real rabbitmq-server on 127.0.0.1 (its own
ports), `farm coordinator` and three real `farm worker`s as subprocesses (tests/worker_main.py:
each chunk a real testsrc render held to at least --chunk-s seconds, so the signal lands mid-chunk
whatever the machine's speed). One farm per broker_heartbeat (the workers' setting); per run a new
job, one worker signalled once its chunk has run a third of --chunk-s, then sent SIGCONT (SIGSTOP)
and, after the job, replaced by a fresh worker. Measured from the signal:

- broker drops the worker: the job queue's consumer count, as RabbitMQ reports it (a passive
  declare polled every 50 ms), falls; the broker puts the worker's unacked chunk back then;
- re-delivered: the attempt's `lost` report (attempts.finished_at: a worker got the message back,
  `redelivered`); it waits for a worker to be free;
- starts again elsewhere: the chunk's next attempt's `started` (attempts.started_at), on another node.

Every job must end done and verified with every chunk's frames once (_engine.assert_every_chunk_once),
the signalled attempt `lost`: else the failure is printed and the exit status is 1.

  bench/farm_requeue.py                              # broker_heartbeat 10 (the farm's), 3 runs each
  bench/farm_requeue.py --heartbeat 6 10 --repeat 3
  bench/farm_requeue.py --events kill --repeat 1     # a short check
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "apps" / "farm"
sys.path[:0] = [str(APP / "tests"), str(APP / "src")]
import _engine
from kombu import Connection

from farm.config import Settings
from farm.db import FINAL

DEFAULTS = Settings()
# The test bed speeds these up for the tests; the bench runs with the farm's own defaults.
TIMING_KEYS = ("progress_interval_s", "poll_interval_s", "reconcile_interval_s", "failure_backoff_s")
EVENTS = {"kill": ("`kill -9` of a worker's process group mid-chunk", signal.SIGKILL),
          "stop": ("`SIGSTOP` of a worker's process group mid-chunk (a hung node, as `docker pause`)",
                   signal.SIGSTOP)}
COLUMNS = ("drop", "redelivered", "restarted")


class Failed(Exception):
    pass


class ConsumerWatch(threading.Thread):
    """The job queue's consumer count as the broker reports it, polled with a passive declare."""

    def __init__(self, url: str, queue: str, every: float = 0.05):
        super().__init__(daemon=True)
        self.url, self.queue, self.every = url, queue, every
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        with Connection(self.url, connect_timeout=5) as conn:
            ch = conn.channel()
            while not self.done.wait(self.every):
                try:
                    _, _, consumers = ch.queue_declare(queue=self.queue, passive=True)
                except conn.channel_errors:         # not declared yet, or deleted: the channel is closed
                    ch = conn.channel()
                    continue
                self.samples.append((time.time(), consumers))

    def now(self) -> int | None:
        return self.samples[-1][1] if self.samples else None

    def fell_after(self, t: float, before: int) -> float | None:
        return next((ts for ts, n in list(self.samples) if ts >= t and n < before), None)

    def stop(self) -> None:
        self.done.set()
        self.join(10)


def make_farm(broker, work: Path, heartbeat: int, a) -> _engine.Farm:
    settings = {k: getattr(DEFAULTS, k) for k in TIMING_KEYS}
    farm = _engine.Farm(broker, work / ("hb%d" % heartbeat), "h%d" % heartbeat, broker_heartbeat=heartbeat,
                        min_chunk=a.min_chunk, per_node=a.per_node, **settings)
    farm.start_workers(FARM_TEST_MIN_CHUNK_S=str(a.chunk_s))
    farm.start_coordinator()
    return farm


def victim_of(farm: _engine.Farm, job_id: str, a) -> dict:
    """A started attempt that has run a third of a chunk and is still running."""
    def pick():
        now = time.time()
        for x in farm.attempts(job_id):
            if x["state"] == "started" and now - x["started_at"] >= a.chunk_s / 3:
                return x
        return None
    return _engine.wait_for("a chunk in progress", pick, a.timeout, every=0.05)


def next_start(farm: _engine.Farm, job_id: str, victim: dict) -> dict | None:
    later = [x for x in farm.attempts(job_id) if x["idx"] == victim["idx"] and x["n"] > victim["n"]
             and x["started_at"]]
    return later[0] if later else None


def one_run(farm: _engine.Farm, event: str, a) -> dict:
    job_id = farm.submit(frames=a.frames)
    watch = ConsumerWatch(farm.broker.url, "farm.job." + job_id)
    watch.start()
    try:
        victim = victim_of(farm, job_id, a)
        _engine.wait_for("the broker's consumer count", lambda: watch.now() is not None, 30)
        node, worker, before = victim["node"], farm.workers[victim["node"]], watch.now()
        signalled_at = time.time()
        os.killpg(worker.pid, EVENTS[event][1])
        if event == "kill":
            worker.wait(10)
        retry = _engine.wait_for("chunk %d to start again" % victim["idx"],
                                 lambda: next_start(farm, job_id, victim), 6 * farm.settings["broker_heartbeat"]
                                 + 4 * a.chunk_s + 60, every=0.05)
        dropped_at = watch.fell_after(signalled_at, before)
    finally:
        watch.stop()
    if event == "stop":
        os.killpg(worker.pid, signal.SIGCONT)       # the node comes back: its late work must not count twice
    farm.wait_state(job_id, FINAL, timeout=a.timeout)
    _engine.assert_every_chunk_once(farm, job_id)
    lost = next(x for x in farm.attempts(job_id) if x["id"] == victim["id"])
    if lost["state"] != "lost" or retry["node"] == node:
        raise Failed("job %s: the signalled attempt %s ended %s (%s); its chunk started again on %s"
                     % (job_id, victim["id"], lost["state"], lost["error"], retry["node"]))
    _engine.stop_group(worker, signal.SIGKILL)      # a fresh worker for the next run
    farm.start_worker(node, FARM_TEST_MIN_CHUNK_S=str(a.chunk_s))
    farm.wait_workers([node])
    return {"drop": None if dropped_at is None else dropped_at - signalled_at,
            "redelivered": lost["finished_at"] - signalled_at, "restarted": retry["started_at"] - signalled_at,
            "job": job_id, "node": node, "on": retry["node"], "idx": victim["idx"]}


def spread(values: list) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    return "%.2f / %.2f / %.2f" % (min(got), statistics.median(got), max(got))


def table(results: dict, goal: float) -> None:
    print("| event | broker_heartbeat (s) | runs | broker drops the worker (s) | re-delivered: a worker reports it "
          "lost (s) | starts again elsewhere (s) | goal: starts again under %g s |" % goal)
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for (event, hb), runs in results.items():
        worst = max(r["restarted"] for r in runs)
        print("| %s | %d | %d | %s | %s | %s | %s (worst %.1f s) |" % (
            EVENTS[event][0], hb, len(runs), *(spread([r[c] for r in runs]) for c in COLUMNS),
            "pass" if worst < goal else "FAIL", worst))


def measure(broker, work: Path, a) -> dict:
    results = {}
    for hb in a.heartbeat:
        farm = make_farm(broker, work, hb, a)
        try:
            for event in a.events:
                for i in range(a.repeat):
                    try:
                        r = one_run(farm, event, a)
                    except AssertionError as e:
                        raise Failed("%s, broker_heartbeat %d, run %d: %s\n--- coordinator.log ---\n%s"
                                     % (event, hb, i + 1, e, farm.log("coordinator.log"))) from None
                    results.setdefault((event, hb), []).append(r)
                    print("  %s, heartbeat %d s, run %d: job %s chunk %d on %s; dropped %s s, re-delivered %.2f s,"
                          " started again on %s %.2f s after the signal"
                          % (event, hb, i + 1, r["job"], r["idx"], r["node"],
                             "-" if r["drop"] is None else "%.2f" % r["drop"], r["redelivered"], r["on"],
                             r["restarted"]), flush=True)
        finally:
            farm.close()
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heartbeat", type=int, nargs="+", default=[DEFAULTS.broker_heartbeat],
                    help="the workers' broker_heartbeat, seconds (default the farm's)")
    ap.add_argument("--events", nargs="+", choices=sorted(EVENTS), default=["kill", "stop"])
    ap.add_argument("--repeat", type=int, default=3, help="runs per event and heartbeat")
    ap.add_argument("--chunk-s", type=float, default=3.0, help="each chunk takes at least this long")
    ap.add_argument("--min-chunk", type=int, default=DEFAULTS.min_chunk, help="the farm's min_chunk")
    ap.add_argument("--per-node", type=int, default=DEFAULTS.per_node, help="the farm's per_node")
    ap.add_argument("--frames", type=int, help="default: per_node chunks of min_chunk frames on each of 3 workers")
    ap.add_argument("--goal", type=float, default=30.0, help="seconds: issue 14's goal")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a job may take")
    a = ap.parse_args()
    a.frames = a.frames or 3 * a.per_node * a.min_chunk
    if a.repeat < 1 or any(h < 1 for h in a.heartbeat):
        ap.error("--repeat and --heartbeat: >= 1")
    print("platform: this machine's %d cores (os.cpu_count()), shared by the three workers, the coordinator and "
          "RabbitMQ on loopback; load average at the start %.2f" % (os.cpu_count(), os.getloadavg()[0]), flush=True)
    with tempfile.TemporaryDirectory(prefix="farm-requeue-") as tmp:
        broker = _engine.Broker(Path(tmp) / "rabbitmq")
        try:
            broker.start()
            results = measure(broker, Path(tmp), a)
        except (Failed, AssertionError) as e:       # AssertionError: the test bed's waits and checks
            print("FAILED: %s" % e, file=sys.stderr)
            return 1
        finally:
            broker.stop()
    print("\nthree workers, %d frames of testsrc 320x180 in chunks of at least %g s; min / median / max over the runs;"
          " every job done, verified, every chunk once\n" % (a.frames, a.chunk_s))
    table(results, a.goal)
    print("\nload average at the end: %.2f (1 min), %.2f (5 min)" % os.getloadavg()[:2])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
