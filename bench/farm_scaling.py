#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Parallel efficiency of the farm: the same job on 1, 2 and 4 workers, the speed-up over one worker
and where the time went (the job's own timings, `farm status --json`).

The engine's test bed (apps/farm/tests/_engine.py): a real rabbitmq-server on 127.0.0.1 (its own
ports), `farm coordinator`, `farm api` with host_url, and real `farm worker`s as subprocesses, each
with a cache_dir and parts dir of its own (no shared directory: the bundle is fetched by hash and
the parts uploaded over the API, as in the lab and on the cards). One fresh farm per worker count.
Every job must end done and verified, with every chunk's frames in the output once and in order
(_engine.assert_every_chunk_once); else the failure is printed and the exit status is 1.

  bench/farm_scaling.py                                  # testsrc, --workers 1 2 4
  bench/farm_scaling.py --frames 1200 --workers 1 2      # a shorter run
  bench/farm_scaling.py --renderer remotion --frames 600 # apps/farm/examples/hello at 1280x720 (its props)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "apps" / "farm"
sys.path[:0] = [str(APP / "tests"), str(APP / "src")]
import _engine

from farm import remotion
from farm.config import Settings
from farm.db import FINAL

HELLO = APP / "examples" / "hello"
WORKER_MODULES = APP / "remotion-worker"     # the workers' package set (@remotion/renderer), as on the nodes
DEFAULTS = Settings()
# The test bed speeds these up for the tests; the bench runs with the farm's own defaults.
TIMING_KEYS = ("progress_interval_s", "poll_interval_s", "reconcile_interval_s", "failure_backoff_s")


class Failed(Exception):
    pass


def farm_for(broker, work: Path, workers: int, a) -> _engine.Farm:
    tag = "w%d" % workers
    settings = {k: getattr(DEFAULTS, k) for k in TIMING_KEYS}
    farm = _engine.Farm(broker, work / tag, tag, min_chunk=a.min_chunk, per_node=a.per_node, **settings)
    farm.nodes = ["%s-node%d" % (tag, i) for i in range(workers)]
    farm.settings["farm_nodes"] = farm.nodes
    farm.write_config()
    return farm


def start(farm: _engine.Farm, a) -> None:
    farm.start_api()
    render = {}
    if a.renderer == "remotion":
        render = {"render": {"browser": a.browser, "node_modules": str(remotion.ensure_node_modules(WORKER_MODULES))}}
    for node in farm.nodes:
        farm.start_worker(node, config=farm.remote_worker_config(node, **render))
    farm.wait_workers(farm.nodes)
    farm.start_coordinator()


def submit(farm: _engine.Farm, a) -> str:
    if a.renderer == "testsrc":
        return farm.submit(frames=a.frames, verify=a.verify, nodes=farm.nodes, width=a.width, height=a.height)
    props = {"frames": a.frames, "width": a.width, "height": a.height}
    r = farm.farm("submit", "--project", str(HELLO), "--composition", "Hello", "--props", json.dumps(props),
                  "--out", str(farm.root / "out" / "job.mp4"), "--detach", "--nodes", *farm.nodes,
                  *(["--verify"] if a.verify else []), timeout=a.timeout)
    if r.returncode != 0:
        raise Failed("farm submit exited %d: %s" % (r.returncode, r.stderr.strip()[-2000:]))
    return r.stdout.strip().splitlines()[-1]


def check(farm: _engine.Farm, job_id: str, view: dict) -> None:
    job = view["job"]
    verify = (job.get("result") or {}).get("verify") or {}
    if job["state"] != "done" or not verify.get("ok"):
        errors = ["%s on %s: %s" % (x["id"], x["node"], x["error"]) for x in farm.attempts(job_id) if x["error"]]
        raise Failed("job %s ended %s: %s; verify %s\n--- attempts that failed ---\n%s\n--- coordinator.log ---\n%s"
                     % (job_id, job["state"], job["reason"], verify.get("reasons"), "\n".join(errors[:6]),
                        farm.log("coordinator.log")))
    try:
        _engine.assert_every_chunk_once(farm, job_id)
    except AssertionError as e:
        raise Failed("job %s: the output is not every chunk once: %s" % (job_id, e)) from None


def figures(farm: _engine.Farm, job_id: str, view: dict, submitted_at: float) -> dict:
    job, t = view["job"], view["timings"]
    chunks = view["chunks"]
    started = [x["started_at"] for x in farm.attempts(job_id) if x["started_at"]]
    per_node = {}
    for c in chunks:
        per_node[c["node"]] = per_node.get(c["node"], 0) + 1
    wall = job["finished_at"] - submitted_at
    phase = max(c["done_at"] for c in chunks) - min(started)
    host = sum(t.get(k, 0.0) for k in ("bundle_s", "join_s", "verify_s"))
    return {"wall": wall, "phase": phase, "chunks": len(chunks),
            "per_node": [per_node.get(n, 0) for n in farm.nodes],
            "bundle": t.get("bundle_s"), "render": t.get("render_s", 0.0),
            "ship": t.get("fetch_s", 0.0) + t.get("upload_s", 0.0),
            "join": t.get("join_s", 0.0), "verify": t.get("verify_s", 0.0), "rest": wall - phase - host}


def run(broker, work: Path, workers: int, a) -> dict:
    farm = farm_for(broker, work, workers, a)
    try:
        start(farm, a)
        submitted_at = time.time()
        job_id = submit(farm, a)
        try:
            farm.wait_state(job_id, FINAL, timeout=a.timeout)
        except AssertionError as e:
            raise Failed("job %s on %d workers: %s\n--- coordinator.log ---\n%s"
                         % (job_id, workers, e, farm.log("coordinator.log"))) from None
        r = farm.farm("status", job_id, "--json")
        view = json.loads(r.stdout)
        check(farm, job_id, view)
        got = figures(farm, job_id, view, submitted_at)
        print("  %d worker(s): job %s, %d chunks %s, %.1f s submit to done"
              % (workers, job_id, got["chunks"], got["per_node"], got["wall"]), flush=True)
        return got
    finally:
        farm.close()


def fmt(x, digits=1) -> str:
    return "-" if x is None else "%.*f" % (digits, x)


def verify_column(a) -> str:
    """What the job's verify_s covered (farm.join_runner.run)."""
    if a.verify:
        return "verify: frame count, durations, single-node reference render, audio offset, PSNR (s)"
    if a.renderer == "testsrc":
        return "verify: frame count, durations, reference tone, audio offset (s)"
    return "verify: frame count, durations (s)"


def table(results: dict, a) -> None:
    base_n = min(results)
    base = results[base_n]["wall"]
    print("| workers | chunks (per worker) | wall, submit to done (s) | speed-up over %d | efficiency "
          "| bundle (s) | render phase, first start to last done (s) | render (node-s) "
          "| ship: fetch + upload (node-s) | join: concat + the one AAC encode (s) "
          "| %s | rest: submit, dispatch, ticks (s) |" % (base_n, verify_column(a)))
    print("|" + " ---: |" * 12)
    for n, g in sorted(results.items()):
        speed = base / g["wall"]
        print("| %d | %d (%s) | %s | %.2f | %.0f %% | %s | %s | %s | %s | %s | %s | %s |" % (
            n, g["chunks"], ", ".join(map(str, g["per_node"])), fmt(g["wall"]), speed,
            100 * speed * base_n / n, fmt(g["bundle"]), fmt(g["phase"]), fmt(g["render"]), fmt(g["ship"], 2),
            fmt(g["join"], 2), fmt(g["verify"], 2), fmt(g["rest"])))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--renderer", choices=("testsrc", "remotion"), default="testsrc")
    ap.add_argument("--frames", type=int, default=4500, help="the job's frames (remotion: the example's props)")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=720)
    ap.add_argument("--min-chunk", type=int, default=DEFAULTS.min_chunk, help="the farm's min_chunk")
    ap.add_argument("--per-node", type=int, default=DEFAULTS.per_node, help="the farm's per_node")
    ap.add_argument("--verify", action="store_true", help="submit with --verify (a single-node reference too)")
    ap.add_argument("--browser", default="/usr/bin/chromium", help="remotion: the workers' browser")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a job may take")
    a = ap.parse_args()
    if any(n < 1 for n in a.workers):
        ap.error("--workers: counts >= 1")
    load = os.getloadavg()
    print("platform: these figures are from this machine's %d cores (os.cpu_count(); %s), shared by every worker, "
          "the coordinator, the API and RabbitMQ, so they check the plumbing, not what a card does "
          "(load average at the start: %.2f)" % (os.cpu_count(), platform.machine(), load[0]), flush=True)
    with tempfile.TemporaryDirectory(prefix="farm-scaling-") as tmp:
        work = Path(tmp)
        if a.renderer == "remotion":
            t0 = time.monotonic()
            remotion.ensure_node_modules(WORKER_MODULES)
            remotion.bundle(HELLO, work / "warm-bundle")   # webpack's cache warm: every count bundles alike
            print("  remotion: node_modules ready and a warm-up bundle (not counted) in %.1f s"
                  % (time.monotonic() - t0), flush=True)
        broker = _engine.Broker(work / "rabbitmq")
        results = {}
        try:
            broker.start()
            for n in sorted(set(a.workers)):
                results[n] = run(broker, work, n, a)
        except (Failed, AssertionError) as e:       # AssertionError: the test bed's waits and checks
            print("FAILED: %s" % e, file=sys.stderr)
            return 1
        finally:
            broker.stop()
    what = "%s %dx%d, %d frames" % ("testsrc" if a.renderer == "testsrc" else "remotion apps/farm/examples/hello",
                                    a.width, a.height, a.frames)
    print("\n%s; min_chunk %d, per_node %d; every job done, verified, every chunk once\n"
          % (what, a.min_chunk, a.per_node))
    table(results, a)
    print("\nload average at the end: %.2f (1 min), %.2f (5 min)" % os.getloadavg()[:2])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
