#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The farm under long jobs and the faults a fleet meets every week (issue 26), on the engine's test
bed (apps/farm/tests/_engine.py): a real rabbitmq-server on 127.0.0.1 of the bench's own, `farm
coordinator` and real `farm worker`s as subprocesses, testsrc renders. Lab figures: this machine's
cores, not a card's.

  long      a two-hour video at 30 fps (216,000 frames, testsrc at 64x36) on 4 workers, with the
            farm's default chunk bound: its chunk count and size, the wall time, verified
  timeout   the broker's consumer_timeout set below a chunk's render time: with the chunk bound the
            job finishes; the same job planned by count (the old plan) has its deliveries taken back
  restarts  three broker restarts (stop, start: systemctl restart's effect) during one job: no node
            charged, no attempt spent
  pause     a worker frozen (SIGSTOP: docker pause) for --pause-s mid-chunk: its chunk re-runs
            elsewhere and the node is charged once

  .venv/bin/python bench/farm_faults.py long restarts pause timeout
Each prints its figures and fails (exit 1) when the farm does not hold what it must.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "apps" / "farm"
sys.path[:0] = [str(APP / "tests"), str(APP / "src")]
import _engine

from farm.config import Settings
from farm.db import FINAL

DEFAULTS = Settings()
TIMING_KEYS = ("progress_interval_s", "poll_interval_s", "reconcile_interval_s", "failure_backoff_s", "excuse_wait_s")


class Failed(Exception):
    pass


def farm_on(broker, root: Path, tag: str, nodes: int, **settings) -> _engine.Farm:
    """A farm with the farm's own timings (the test bed speeds them up) and `nodes` workers."""
    own = {k: getattr(DEFAULTS, k) for k in TIMING_KEYS}
    farm = _engine.Farm(broker, root / tag, tag, **{**own, "min_chunk": DEFAULTS.min_chunk,
                                                      "per_node": DEFAULTS.per_node, **settings})
    farm.nodes = ["%s-node%d" % (tag, i) for i in range(nodes)]
    farm.settings["farm_nodes"] = farm.nodes
    farm.write_config()
    farm.node_urls = broker.add_node_users(farm.settings, farm.nodes)
    return farm


def chunks_of(farm, job_id) -> list[dict]:
    return farm.db.rows("SELECT idx, first, last, node FROM chunks WHERE job_id=? ORDER BY idx", (job_id,))


def charged(farm, job_id) -> list[dict]:
    return farm.db.rows("SELECT node, attempt_id FROM node_failures WHERE job_id=?", (job_id,))


def done(farm, job_id, timeout: float) -> dict:
    job = farm.wait_state(job_id, FINAL, timeout=timeout)
    if job["state"] != "done":
        raise Failed("job %s %s: %s" % (job_id, job["state"], job["reason"]))
    return job


def bench_long(broker, root: Path, a) -> None:
    farm = farm_on(broker, root, "long", 4)
    try:
        farm.start_workers()
        farm.start_coordinator()
        t0 = time.time()
        job_id = farm.submit(frames=216_000, width=64, height=36, out="two-hours.mp4")
        job = done(farm, job_id, a.timeout)
        chunks = chunks_of(farm, job_id)
        sizes = sorted({c["last"] - c["first"] + 1 for c in chunks})
        v = job["result"]["verify"]
        print("long (lab): 216,000 frames at 30 fps (2 h) on 4 workers: %d chunks of %s frames (chunk_target_s %g,"
              " testsrc estimate %g s a frame); wall %.0f s from submit to verified (join %.0f s, verify %.0f s);"
              " %d frames, audio offset %s ms, drift %s ms" % (
                  len(chunks), "-".join(map(str, sizes)), DEFAULTS.chunk_target_s,
                  DEFAULTS.render_s_per_frame["testsrc"], job["finished_at"] - t0, job["timings"]["join_s"],
                  job["timings"]["verify_s"], v["frames"], v["offsetMs"], v["driftMs"]))
        longest = max(sizes) * DEFAULTS.render_s_per_frame["testsrc"]
        if not v["ok"] or v["frames"] != 216_000 or longest > DEFAULTS.chunk_target_s:
            raise Failed("long: not verified, or a chunk estimated at %.0f s, over chunk_target_s: %s" % (longest, v))
    finally:
        farm.close()


def bench_timeout(root: Path, a) -> None:
    """A broker whose consumer_timeout (60 s) is shorter than a chunk of the count plan takes to render
    (RabbitMQ checks the timeout about once a minute, so a delivery goes back 60 to 120 s after it was
    handed out: the count plan's chunks here take 150 s)."""
    timeout_s = 60
    broker = _engine.Broker(root / "rabbitmq-timeout", conf="consumer_timeout = %d\n" % (timeout_s * 1000))
    broker.start()
    try:
        # the real render padded to FARM_TEST_S_PER_FRAME: a chunk lasts frames x that, whatever the machine
        spf, frames = 0.02, 6000                          # 120 s of render in all
        bound = {"chunk_target_s": 20.0, "chunk_limit_floor_s": 2.0, "chunk_limit_factor": 1.2,
                 "broker_consumer_timeout_s": timeout_s, "render_s_per_frame": {"testsrc": spf}}
        farm = farm_on(broker, root, "bounded", 2, per_node=1, **bound)     # the bound alone sizes the chunks
        try:
            farm.start_workers(FARM_TEST_S_PER_FRAME=str(spf))
            farm.start_coordinator()
            t0 = time.time()
            job_id = farm.submit(frames=frames, width=64, height=36)
            job = done(farm, job_id, a.timeout)
            chunks = chunks_of(farm, job_id)
            lost = [x for x in farm.attempts(job_id) if x["state"] != "done"]
            print("timeout (lab): consumer_timeout %d s; %d frames at %g s a frame, bounded to chunk_target_s %g:"
                  " %d chunks of %d frames (%.0f s each), done and verified in %.0f s, %d attempts not done" % (
                      timeout_s, frames, spf, bound["chunk_target_s"], len(chunks),
                      chunks[0]["last"] - chunks[0]["first"] + 1, (chunks[0]["last"] - chunks[0]["first"] + 1) * spf,
                      job["finished_at"] - t0, len(lost)))
            if lost:
                raise Failed("timeout: the bounded job lost attempts: %s" % lost)
        finally:
            farm.close()
        # the count plan: 2 workers x per_node 1 = 2 chunks of 3000 frames, 150 s each, against a 60 s timeout
        farm = farm_on(broker, root, "counted", 2, per_node=1, chunk_target_s=1e6, broker_consumer_timeout_s=1e9,
                       render_s_per_frame={"testsrc": 1e-9}, temp_max_age_h=2000.0)
        try:
            farm.start_workers(FARM_TEST_S_PER_FRAME=str(spf * 2.5))      # 150 s a chunk
            farm.start_coordinator()
            job_id = farm.submit(frames=frames, width=64, height=36)
            t0 = time.time()
            taken = _engine.wait_for("the broker to take a delivery back", lambda: next(
                (line for n in farm.nodes for line in farm.log("worker-%s.log" % n).splitlines()
                 if "delivery acknowledgement on channel" in line and "timed out" in line), None), a.timeout, every=1)
            chunk = chunks_of(farm, job_id)[0]
            print("timeout (lab): the count plan's chunks (%d frames, %.0f s each) against the same timeout: %.0f s"
                  " after the start the broker closed the worker's channel (%s); the job's state then: %s" % (
                      chunk["last"] - chunk["first"] + 1, (chunk["last"] - chunk["first"] + 1) * spf * 2.5,
                      time.time() - t0, taken.split("PRECONDITION_FAILED - ")[-1][:60], farm.job(job_id)["state"]))
            farm.farm("cancel", job_id)
        finally:
            farm.close()
    finally:
        broker.stop()


def bench_restarts(root: Path, a) -> None:
    broker = _engine.Broker(root / "rabbitmq-restarts")
    broker.start()
    farm = farm_on(broker, root, "restarts", 3)
    try:
        farm.start_workers(FARM_TEST_MIN_CHUNK_S="4")
        farm.start_coordinator()
        job_id = farm.submit(frames=360, width=64, height=36)
        since = 0.0
        for i in range(3):
            x = _engine.wait_for("a chunk rendering", lambda since=since: farm.db.rows(
                "SELECT * FROM attempts WHERE job_id=? AND state='started' AND started_at>?", (job_id, since)),
                a.timeout)
            since = max(r["started_at"] for r in x)
            t = time.monotonic()
            broker.stop()
            broker.start()
            print("  restart %d: broker back in %.1f s" % (i + 1, time.monotonic() - t), flush=True)
        job = done(farm, job_id, a.timeout)
        tries = farm.attempts(job_id)
        spent = [x for x in tries if x["charged"] == 1]
        cut = [x for x in tries if x["state"] in ("lost", "interrupted")]
        print("restarts (lab): 3 broker restarts in one job: %s; %d attempts cut short, charged %d, node failures"
              " %d" % (job["state"], len(cut), len(spent), len(charged(farm, job_id))))
        if spent or charged(farm, job_id):
            raise Failed("restarts: charged %s" % spent)
    finally:
        farm.close()
        broker.stop()


def bench_pause(broker, root: Path, a) -> None:
    farm = farm_on(broker, root, "pause", 3)
    try:
        farm.start_workers(FARM_TEST_MIN_CHUNK_S="4")
        farm.start_coordinator()
        job_id = farm.submit(frames=360, width=64, height=36)
        victim = _engine.wait_for("a chunk rendering", lambda: farm.db.rows(
            "SELECT * FROM attempts WHERE job_id=? AND state='started'", (job_id,)), a.timeout)[0]
        worker = farm.workers[victim["node"]]
        os.killpg(worker.pid, signal.SIGSTOP)
        t0 = time.time()
        retry = _engine.wait_for("chunk %d started elsewhere" % victim["idx"], lambda: farm.db.rows(
            "SELECT * FROM attempts WHERE job_id=? AND idx=? AND n>? AND started_at IS NOT NULL",
            (job_id, victim["idx"], victim["n"])), a.timeout)[0]
        time.sleep(max(0.0, a.pause_s - (time.time() - t0)))
        os.killpg(worker.pid, signal.SIGCONT)
        done(farm, job_id, a.timeout)
        got = _engine.wait_for("the loss charged", lambda: charged(farm, job_id), 2 * DEFAULTS.excuse_wait_s + 30)
        print("pause (lab): %s frozen %.0f s mid-chunk %d: started again on %s %.1f s after; charged %s" % (
            victim["node"], a.pause_s, victim["idx"], retry["node"], retry["started_at"] - t0,
            ", ".join("%s (%s)" % (c["node"], c["attempt_id"]) for c in got)))
        if got != [{"node": victim["node"], "attempt_id": victim["id"]}] or retry["node"] == victim["node"]:
            raise Failed("pause: charged %s, re-run on %s" % (got, retry["node"]))
    finally:
        farm.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", nargs="+", choices=["long", "timeout", "restarts", "pause"])
    ap.add_argument("--pause-s", type=float, default=60.0)
    ap.add_argument("--timeout", type=float, default=1800.0, help="for each wait, seconds")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # stopped: everything it started goes too
    with tempfile.TemporaryDirectory(prefix="farm-faults-") as tmp:
        root = Path(tmp)
        broker = _engine.Broker(root / "rabbitmq")
        broker.start()
        try:
            for what in a.what:
                t = time.monotonic()
                if what == "long":
                    bench_long(broker, root, a)
                elif what == "pause":
                    bench_pause(broker, root, a)
                elif what == "timeout":
                    bench_timeout(root, a)
                else:
                    bench_restarts(root, a)
                print("  (%s: %.0f s)" % (what, time.monotonic() - t), flush=True)
        except (Failed, AssertionError) as e:
            print("FAILED: %s" % e, file=sys.stderr)
            return 1
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
