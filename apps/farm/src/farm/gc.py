"""Retention on the host (`farm gc`, and the role's hourly farm-gc.timer): what a job leaves behind is
pruned by age, and by a free-space floor. Outputs are the owner's and never touched.

- parts_dir/<job>/ and work_dir/verify/<job>/ of a job that ended done or cancelled more than
  keep_parts_h ago, failed more than keep_failed_parts_h ago (`farm join JOB` may join its parts
  again until then; `farm gc --job JOB` removes them now); of a job the database does not know, once
  older than temp_max_age_h;
- bundles (work_dir/bundles/<hash>, and their tars) that no live job uses and no job used for
  keep_bundles_h;
- temporaries older than temp_max_age_h: a render's or an upload's half-written part (`.part-*`), a
  killed join's temporary directory with its whole-job WAV (`.<out>.*` beside the output), a staged
  bundle (`.new-*`);
- then, while parts_dir or output_dir has less than min_free_gib free: the parts of the jobs that
  ended, oldest first, whatever their age; a failed job's only once no done or cancelled job's are left.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from farm.config import Settings
from farm.db import DB, FINAL, LIVE

HOUR = 3600.0


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def free_gib(path: str) -> float:
    """GiB free on the filesystem that holds path (its nearest existing parent, if it is not made yet)."""
    d = Path(path)
    while not d.exists() and d != d.parent:
        d = d.parent
    return shutil.disk_usage(d).free / 2**30


class Pruner:
    def __init__(self, s: Settings, *, dry_run: bool = False, now: float | None = None, free_gib=free_gib):
        self.s, self.dry_run, self.now, self.free_gib = s, dry_run, now or time.time(), free_gib
        self.removed: list[dict] = []

    def remove(self, path: Path, why: str) -> None:
        if not path.exists():
            return
        self.removed.append({"path": str(path), "bytes": _size(path), "why": why})
        if not self.dry_run:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()

    def run(self) -> dict:
        s, now = self.s, self.now
        db = DB(s.db_path)
        jobs = {j["id"]: j for j in db.rows("SELECT id, state, spec, finished_at, created_at FROM jobs")}
        ended = {jid: j for jid, j in jobs.items() if j["state"] in FINAL}
        for root in (Path(s.parts_dir), Path(s.work_dir) / "verify"):
            for d in sorted(root.glob("*")) if root.is_dir() else []:
                j = jobs.get(d.name)
                if j is None and d.is_dir() and _age(d, now) > s.temp_max_age_h * HOUR:
                    self.remove(d, "no such job")
                elif d.name in ended:
                    knob = "keep_failed_parts_h" if j["state"] == "failed" else "keep_parts_h"
                    if now - (j["finished_at"] or 0) > getattr(s, knob) * HOUR:
                        self.remove(d, "job %s %s more than %s (%g) ago" % (d.name, j["state"], knob, getattr(s, knob)))
        self._bundles(jobs)
        self._temporaries()
        self._floor(ended)
        old = [jid for jid, j in ended.items() if now - (j["finished_at"] or j["created_at"]) > s.keep_records_h * HOUR]
        for jid in old:
            self.remove(Path(s.work_dir) / "joins" / (jid + ".log"), "its job ended more than keep_records_h ago")
        records = self._records(db, old)
        return {"removed": self.removed, "bytes": sum(r["bytes"] for r in self.removed), "dryRun": self.dry_run,
                "records": records}

    def _records(self, db: DB, jobs: list[str]) -> dict:
        """The database's rows of jobs that ended more than keep_records_h ago, and outbox rows carried out
        more than a day ago: how many of each went (or would go)."""
        counts = {}
        with db.tx() as c:
            for table in ("events", "outbox", "node_failures", "blocklist", "consumers", "leases", "attempts",
                          "chunks", "jobs"):
                key = "id" if table == "jobs" else "job_id"
                n = 0
                for i in range(0, len(jobs), 500):
                    batch = jobs[i:i + 500]
                    marks = ",".join("?" * len(batch))
                    where = "FROM %s WHERE %s IN (%s)" % (table, key, marks)
                    n += c.execute("SELECT count(*) " + where, batch).fetchone()[0]
                    if not self.dry_run:
                        c.execute("DELETE " + where, batch)
                counts[table] = n
            done = self.now - 86400
            counts["outbox carried out"] = c.execute("SELECT count(*) FROM outbox WHERE done_at < ?",
                                                     (done,)).fetchone()[0]
            if not self.dry_run:
                c.execute("DELETE FROM outbox WHERE done_at < ?", (done,))
        return counts

    def _bundles(self, jobs: dict) -> None:
        s, now = self.s, self.now
        in_use, recent = set(), set()
        for j in jobs.values():
            digest = json.loads(j["spec"] or "{}").get("bundleHash")
            if digest and j["state"] in (*LIVE, "joining"):
                in_use.add(digest)
            elif digest and now - (j["finished_at"] or j["created_at"]) <= s.keep_bundles_h * HOUR:
                recent.add(digest)
        work = Path(s.work_dir)
        for d in sorted((work / "bundles").glob("*")) if (work / "bundles").is_dir() else []:
            if d.name.startswith(".new-"):
                continue            # a bundle being staged: a temporary (below)
            if d.name not in in_use | recent and _age(d, now) > s.keep_bundles_h * HOUR:
                self.remove(d, "bundle used by no job for keep_bundles_h (%g)" % s.keep_bundles_h)
                self.remove(work / "bundle-tars" / (d.name + ".tar"), "its bundle was pruned")

    def _temporaries(self) -> None:
        s, now, old = self.s, self.now, self.s.temp_max_age_h * HOUR
        work, out, parts = Path(s.work_dir), Path(s.output_dir), Path(s.parts_dir)
        joins = (d for d in out.rglob(".*") if d.is_dir() and (d / "videos.txt").is_file())   # farm.join's own
        found = [*parts.glob("*/.part-*"), *(work / "bundles").glob(".new-*"), *(work / "bundle-tars").glob(".*"),
                 *joins]
        for f in found:
            if _age(f, now) > old:
                self.remove(f, "a temporary older than temp_max_age_h (%g)" % s.temp_max_age_h)

    def _floor(self, ended: dict) -> None:
        s = self.s
        oldest_first = sorted(ended.values(), key=lambda j: (j["state"] == "failed", j["finished_at"] or 0))
        for j in oldest_first:
            low = [w for w in (s.parts_dir, s.output_dir) if self.free_gib(w) < s.min_free_gib]
            if not low or self.dry_run:
                break
            for root in (Path(s.parts_dir), Path(s.work_dir) / "verify"):
                self.remove(root / j["id"], "less than min_free_gib (%g) free under %s" % (s.min_free_gib, low[0]))


def collect(s: Settings, *, dry_run: bool = False) -> dict:
    return Pruner(s, dry_run=dry_run).run()


def collect_job(s: Settings, jid: str, *, dry_run: bool = False) -> dict:
    """The parts and verify files of one job that ended, now, whatever their age (the owner's say);
    ValueError for a job that is not known or has not ended."""
    job = DB(s.db_path).one("SELECT state FROM jobs WHERE id=?", (jid,))
    if job is None:
        raise ValueError("no job %s" % jid)
    if job["state"] not in FINAL:
        raise ValueError("job %s is %s: its parts are in use" % (jid, job["state"]))
    p = Pruner(s, dry_run=dry_run)
    for root in (Path(s.parts_dir), Path(s.work_dir) / "verify"):
        p.remove(root / jid, "farm gc --job %s (%s)" % (jid, job["state"]))
    return {"removed": p.removed, "bytes": sum(r["bytes"] for r in p.removed), "dryRun": dry_run}
