"""farm: submit / status / cancel / worker / coordinator / join / api."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path

from rich.console import Console, Group
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.progress_bar import ProgressBar
from rich.table import Table

from farm import broker_users, join, remotion
from farm.config import Settings, load
from farm.db import DB, FINAL
from farm.jobs import check_nodes, project_spec, submit


def _spec(a, s: Settings) -> tuple[dict, dict | None]:
    timings = None
    try:
        if a.spec:
            spec = json.loads(Path(a.spec).read_text())
        else:
            if not (a.project and a.composition):
                raise SystemExit("farm submit: --project and --composition (or --spec FILE)")
            if not Path(a.project, "package.json").is_file():
                raise SystemExit("farm submit: %s is not a Remotion project (no package.json)" % a.project)
            props = json.loads(a.props or "{}")
            if not isinstance(props, dict):
                raise SystemExit("farm submit: --props is a JSON object")
            spec, timings = project_spec(s, Path(a.project), a.composition, props)
    except OSError as e:
        raise SystemExit("farm submit: %s" % e) from None
    except ValueError as e:     # bad JSON, a frame count that is not a number
        raise SystemExit("farm submit: bad input: %s" % e) from None
    except remotion.RemotionError as e:
        raise SystemExit("farm submit: %s" % e) from None
    return spec, timings


# -- showing a job -------------------------------------------------------------------------------
def _ago(t: float | None) -> str:
    return "-" if t is None else "%.1f s ago" % t


def render_status(v: dict):
    job = v["job"]
    head = Table.grid(padding=(0, 2))
    head.add_row("job", "%s  [bold]%s[/]%s" % (job["id"], job["state"], "  " + job["reason"] if job["reason"] else ""))
    if job.get("paused"):
        head.add_row("paused", escape(job["paused"]))
    done = sum(1 for c in v["chunks"] if c["state"] == "done")
    head.add_row("progress", ProgressBar(total=job["frames"], completed=v["doneFrames"], width=40))
    head.add_row("", "%.0f / %d frames, %d / %d chunks" % (v["doneFrames"], job["frames"], done, len(v["chunks"])))
    head.add_row("nodes", "%s (in use: %s)" % (", ".join(job["nodes"]), ", ".join(v["nodesInUse"]) or "none"))
    head.add_row("retries", str(v["retries"]))
    head.add_row("failures", ", ".join("%s %d" % kv for kv in sorted(v["failures"].items())) or "none")
    head.add_row("blocklist", ", ".join(v["blocklist"]) or "none")
    leases = [lz for lz in v["leases"] if lz["released_at"] is None]
    head.add_row("lease", ", ".join("%s until %s" % (lz["id"], lz["expires_at"]) for lz in leases)
                 or ("released" if v["leases"] else "none"))
    head.add_row("output", job["out"])
    if v.get("timings"):
        head.add_row("timings", ", ".join("%s %.1f s" % (k[:-2], t) for k, t in v["timings"].items()))
    t = Table("chunk", "frames", "state", "node", "attempts", "last report", "")
    for c in v["chunks"]:
        t.add_row(str(c["idx"]), "%d-%d" % (c["first"], c["last"]), c["state"], c["node"] or "",
                  str(c["attempts"]), _ago(c["age"]), ProgressBar(total=1.0, completed=c["fraction"], width=12))
    ev = Table("events", show_header=True, box=None)
    for e in v["events"][-8:]:
        ev.add_row("%s  %s" % (time.strftime("%H:%M:%S", time.localtime(e["at"])), e["text"]))
    return Group(head, t, ev)


def follow(s: Settings, job_id: str) -> int:
    db, console = DB(s.db_path), Console()
    seen = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("frames"),
                  TimeElapsedColumn(), TextColumn("{task.fields[note]}"), console=console) as bar:
        task = None
        while True:
            v = db.view(job_id, s.stale_after_s)
            if task is None:
                task = bar.add_task("job " + job_id, total=v["job"]["frames"], note="")
            for e in v["events"][seen:]:
                bar.console.print("[dim]%s[/] %s" % (time.strftime("%H:%M:%S", time.localtime(e["at"])), e["text"]))
            seen = len(v["events"])
            rendering = [c for c in v["chunks"] if c["state"] == "rendering"]
            bar.update(task, completed=v["doneFrames"], note="%s; rendering on %s; retries %d" % (
                v["job"]["state"], ", ".join(v["nodesInUse"]) or "-", v["retries"]) if rendering or v["retries"]
                else v["job"]["state"])
            if v["job"]["state"] in FINAL:
                break
            time.sleep(s.poll_interval_s)
    job = v["job"]
    console.print("job %s %s: %s" % (job_id, job["state"], job["reason"] or ""))
    return 0 if job["state"] == "done" else 1


# -- the commands --------------------------------------------------------------------------------
def cmd_submit(a, s: Settings) -> int:
    try:
        nodes = check_nodes(s, a.nodes)
    except ValueError as e:
        raise SystemExit("farm: %s" % e) from None
    spec, timings = _spec(a, s)
    try:
        job_id = submit(s, spec, a.out, nodes, verify=a.verify, timings=timings, made_here=not a.spec,
                        s_per_frame=a.s_per_frame)
    except ValueError as e:
        raise SystemExit("farm submit: %s" % e) from None
    print(job_id, flush=True)
    return 0 if a.detach else follow(s, job_id)


def cmd_status(a, s: Settings) -> int:
    db = DB(s.db_path)
    if not a.job:
        for j in db.rows("SELECT id, state, frames, out, reason FROM jobs ORDER BY created_at DESC LIMIT 20"):
            print("%s  %-9s %6d frames  %s  %s" % (j["id"], j["state"], j["frames"], j["out"], j["reason"] or ""))
        return 0
    v = db.view(a.job, s.stale_after_s)
    if v is None:
        print("farm: no job %s" % a.job, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(v, default=str, indent=1))
    else:
        Console().print(render_status(v))
    return 0


def cmd_cancel(a, s: Settings) -> int:
    db = DB(s.db_path)
    if not db.request_cancel(a.job):
        j = db.job(a.job)
        print("farm: %s" % ("no job %s" % a.job if j is None else "job %s is %s already" % (a.job, j["state"])),
              file=sys.stderr)
        return 2
    deadline = time.monotonic() + a.wait
    while time.monotonic() < deadline:
        j = db.job(a.job)
        if j["state"] in FINAL and j["nodes_released"]:   # the state first, then the nodes: wait for both
            if j["state"] != "cancelled":   # it ended (done, failed) before the cancel took
                print("job %s ended %s before the cancel took: %s" % (a.job, j["state"], j["reason"] or ""))
                return 1
            print("job %s cancelled; its nodes are given back" % a.job)
            return 0
        time.sleep(0.2)
    print("job %s: cancel recorded; the coordinator carries it out when it runs" % a.job)
    return 0


def cmd_worker(a, s: Settings) -> int:
    if s.host_url and not s.worker_token_file:
        raise SystemExit("farm worker: host_url needs worker_token_file (the workers' bearer token)")
    from farm import tasks  # noqa: PLC0415 (Celery: only the processes that run tasks load it)
    app = tasks.configure(s, a.node)
    tasks.watch_freezes()
    # -c 1: one render at a time per node; prefork, so the main process keeps the broker's heartbeat
    # while the child renders. The node's own queue is idle until a job's add_consumer. No gossip,
    # mingle or event heartbeat: the coordinator uses none of them (it pings), and with them the
    # node's broker user would need the celeryev exchange too (README "One broker user per node").
    return app.worker_main(["worker", "-P", "prefork", "-c", "1", "-n", "farm@" + a.node,
                            "-Q", "farm.node." + a.node, "--without-gossip", "--without-mingle",
                            "--without-heartbeat", "-l", a.loglevel]) or 0


def cmd_coordinator(a, s: Settings) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from farm.coordinator import Coordinator  # noqa: PLC0415 (Celery: only the processes that run it load it)
    Coordinator(s).run(stop)
    return 0


def cmd_broker_permissions(a, s: Settings) -> int:
    print(json.dumps({"user": s.node_user(a.node), **broker_users.node_permissions(s, a.node)}))
    return 0


def cmd_gc(a, s: Settings) -> int:
    from farm import gc  # noqa: PLC0415

    try:
        done = gc.collect_job(s, a.job, dry_run=a.dry_run) if a.job else gc.collect(s, dry_run=a.dry_run)
    except ValueError as e:
        print("farm gc: %s" % e, file=sys.stderr)
        return 2
    verb = ("would remove", "would free") if a.dry_run else ("removed", "freed")
    for r in done["removed"]:
        print("%s %s (%d bytes): %s" % (verb[0], r["path"], r["bytes"], r["why"]))
    print("%s %d paths, %.1f MiB" % (verb[1], len(done["removed"]), done["bytes"] / 2**20))
    return 0


def cmd_join_job(a, s: Settings) -> int:
    """A failed job whose parts are kept goes back to joining; the coordinator joins it."""
    why = DB(s.db_path).request_join(a.job, s.parts_dir)
    if why:
        print("farm join: %s" % why, file=sys.stderr)
        return 2
    print("job %s is joining again; `farm status %s` follows it" % (a.job, a.job))
    return 0


def cmd_api(a, s: Settings) -> int:
    from farm import api  # noqa: PLC0415 (starlette: the host's extra, the nodes do without)
    return api.serve(s)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["join"] and (len(argv) == 1 or argv[1].startswith("-")):
        # the media half's own parser: farm join --video ... --audio ... --out OUT (farm join JOB: below)
        return join.main(argv[1:]) or 0
    p = argparse.ArgumentParser(prog="farm", description="the Remotion render farm")
    p.add_argument("--config", help="TOML settings (default $FARM_CONFIG, else the built-in defaults)")
    sub = p.add_subparsers(dest="cmd", required=True)
    x = sub.add_parser("submit", help="submit a job and follow it")
    x.add_argument("--project", help="the Remotion project directory")
    x.add_argument("--composition", help="the composition id")
    x.add_argument("--props", help="input props, JSON")
    x.add_argument("--spec", help="a ready render spec, JSON (renderer testsrc or remotion, frames, fps, ...)")
    x.add_argument("--out", required=True, help="the output MP4")
    x.add_argument("--nodes", nargs="+", help="default: the farm group, less the never-lent nodes")
    x.add_argument("--detach", action="store_true", help="print the job id and return")
    x.add_argument("--verify", action="store_true", help="also a single-node reference check")
    x.add_argument("--s-per-frame", type=float, help="one node's render seconds per frame, if you know it: the"
                   " chunks' size and first time limits (then they follow the job's measured speed)")
    x = sub.add_parser("status", help="a job's progress (no JOB: the recent jobs)")
    x.add_argument("job", nargs="?")
    x.add_argument("--json", action="store_true")
    x = sub.add_parser("cancel", help="stop a job and give its nodes back")
    x.add_argument("job")
    x.add_argument("--wait", type=float, default=30.0, help="seconds to wait for the coordinator")
    x = sub.add_parser("worker", help="a node's Celery worker (-c 1)")
    x.add_argument("--node", required=True)
    x.add_argument("--loglevel", default="INFO")
    sub.add_parser("coordinator", help="the long-running coordinator (host)")
    x = sub.add_parser("broker-permissions", help="a node's broker user and its rights, as JSON (the role sets them)")
    x.add_argument("--node", required=True)
    sub.add_parser("api", help="the HTTP API (host; on api_listen, never every address unless allow_public_listen)")
    x = sub.add_parser("gc", help="prune what ended jobs left (parts, verify files, bundles, temporaries)")
    x.add_argument("--dry-run", action="store_true", help="say what would go, remove nothing")
    x.add_argument("--job", help="only this ended job's parts and verify files, now, whatever their age")
    x = sub.add_parser("join", help="join a failed job's kept parts again: farm join JOB (or join parts:"
                       " farm join --video P1 P2 ... --audio A1 A2 ... --out OUT)")
    x.add_argument("job")
    a = p.parse_args(argv)
    s = load(a.config)
    return {"submit": cmd_submit, "status": cmd_status, "cancel": cmd_cancel, "worker": cmd_worker,
            "coordinator": cmd_coordinator, "api": cmd_api, "gc": cmd_gc, "join": cmd_join_job,
            "broker-permissions": cmd_broker_permissions}[a.cmd](a, s)
