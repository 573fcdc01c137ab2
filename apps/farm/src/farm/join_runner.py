"""A job's end, off the coordinator's loop: each join (the concat, the one AAC encode, the verify) runs
in a child process of its own, at most join_workers at once, so that one long join holds back no
other job, and a join can be cancelled (SIGTERM to its process group: farm.proc takes its ffmpeg down
too). The child dies with the coordinator (PR_SET_PDEATHSIG); the join is then run again at the next
start, and its output, renamed into place only when whole, is the same.

    python -m farm.join_runner REQUEST.json RESULT.json    (REQUEST: settings, job, chunks)
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from farm import join as media_join
from farm import proc
from farm import render as media_render
from farm import verify as media_verify
from farm.config import Settings, worker_spec


def run(s: Settings, job: dict, chunks: list[dict]) -> dict:
    """Join the parts by chunk index into job["out"] and verify it: {"join", "verify", "timings"}."""
    if [c["idx"] for c in chunks] != list(range(len(chunks))):
        raise ValueError("chunks %s are not 0..%d" % ([c["idx"] for c in chunks], len(chunks) - 1))
    parts = Path(s.parts_dir)
    out = Path(job["out"])
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    joined = media_join.join([parts / c["video"] for c in chunks], [parts / c["audio"] for c in chunks],
                             out, fps=job["fps"])
    t1 = time.monotonic()
    spec = worker_spec(job["spec"], s)     # the host's own executables, never the job's
    frames, ref, kw = job["frames"], Path(s.work_dir) / "verify" / job["id"], {}
    if job["verify"] or spec.get("renderer") == "testsrc":   # testsrc's reference tone costs nothing
        ref.mkdir(parents=True, exist_ok=True)
        kw["reference_audio"] = media_render.reference_audio(spec, frames, ref / "reference.wav")
    if job["verify"]:   # a single-node reference of sampled frames (the middle ones), compared by PSNR
        n = min(frames, s.min_chunk)
        first = (frames - n) // 2
        sample = media_render.render_chunk(spec, 0, first, first + n - 1, ref)
        kw.update(reference_video=Path(sample["video"]), reference_first=first)
    checked = media_verify.verify(out, frames=frames, fps=job["fps"], **kw)
    timings = {"join_s": round(t1 - t0, 3), "verify_s": round(time.monotonic() - t1, 3)}
    return {"join": joined, "verify": checked, "timings": timings}


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG


def timeout_s(s: Settings, job: dict) -> float:
    """How long a job's join (and its verify) may run: a floor, plus a factor of the job's length."""
    return s.join_timeout_floor_s + s.join_timeout_factor * job["frames"] / job["fps"]


class Joins:
    """The joins under way and waiting. want() asks for one (again: nothing), poll() starts what the
    pool has room for, kills what ran past its timeout, and hands back what ended: [(job id, result
    dict, or an error text)]. argv: the join's command, to which the request and result paths are
    added (the tests pass their own)."""

    def __init__(self, s: Settings, *, argv: list[str] | None = None):
        self.s = s
        self.argv = argv or [sys.executable, "-m", "farm.join_runner"]
        self.dir = Path(s.work_dir) / "joins"
        self.running: dict[str, subprocess.Popen] = {}
        self.waiting: list[str] = []
        self.limit: dict[str, float] = {}       # job id -> its join's timeout, seconds
        self.started: dict[str, float] = {}     # job id -> when its process started (monotonic)
        self.killed: set[str] = set()           # past their timeout: killed, reaped at a next poll

    def want(self, job: dict, chunks: list[dict]) -> None:
        jid = job["id"]
        if jid in self.running or jid in self.waiting:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        request = {"settings": dataclasses.asdict(self.s), "job": job, "chunks": chunks, "parent": os.getpid()}
        (self.dir / (jid + ".request.json")).write_text(json.dumps(request, default=str))
        (self.dir / (jid + ".result.json")).unlink(missing_ok=True)
        self.limit[jid] = timeout_s(self.s, job)
        self.waiting.append(jid)

    def poll(self) -> list[tuple[str, dict | str]]:
        ended = []
        for jid, p in list(self.running.items()):
            if p.poll() is None and jid not in self.killed and time.monotonic() - self.started[jid] > self.limit[jid]:
                # a hung join: its whole group (ffmpeg too) killed at once; no grace, no wait on the loop
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                self.killed.add(jid)
            if p.poll() is None:
                continue
            del self.running[jid]
            result = self.dir / (jid + ".result.json")
            if jid in self.killed:
                self.killed.discard(jid)
                ended.append((jid, "it ran past its timeout (%.0f s: join_timeout_floor_s + join_timeout_factor x"
                                   " frames / fps); its processes were killed" % self.limit[jid]))
            else:
                try:
                    ended.append((jid, json.loads(result.read_text())))
                except (OSError, ValueError):
                    ended.append((jid, "the join's process ended (exit %s) without a result" % p.returncode))
            for f in (result, self.dir / (jid + ".request.json")):
                f.unlink(missing_ok=True)
        while self.waiting and len(self.running) < self.s.join_workers:
            jid = self.waiting.pop(0)
            log = open(self.dir / (jid + ".log"), "ab")
            with log:
                self.running[jid] = subprocess.Popen(
                    [*self.argv, str(self.dir / (jid + ".request.json")), str(self.dir / (jid + ".result.json"))],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            self.started[jid] = time.monotonic()
        return ended

    def cancel(self, jid: str) -> None:
        """The join stopped (its ffmpeg too); nothing of it stays but its temporaries, which gc prunes."""
        if jid in self.waiting:
            self.waiting.remove(jid)
        p = self.running.pop(jid, None)
        self.killed.discard(jid)
        if p is not None:
            proc.kill_group(p, grace=30)
            p.wait(10)

    def stop(self) -> None:
        for jid in list(self.running) + list(self.waiting):
            self.cancel(jid)


def main(argv: list[str]) -> int:
    request, result = Path(argv[0]), Path(argv[1])
    r = json.loads(request.read_text())
    _die_with_parent()
    if os.getppid() != r.get("parent", os.getppid()):    # the coordinator died before the prctl
        return 1
    try:
        out = run(Settings(**r["settings"]), r["job"], r["chunks"])
    except Exception as e:          # the coordinator fails the job with it
        out = {"error": "%s: %s" % (type(e).__name__, e)}
    tmp = result.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    os.replace(tmp, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
