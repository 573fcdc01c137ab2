#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""smem at scale: one namespace of 10,000 / 100,000 / 1,000,000 facts, and 1,000 namespaces x 1,000 facts.

  nice -n 10 .venv/bin/python bench/smem_scale.py                       # 10k and 100k
  nice -n 10 .venv/bin/python bench/smem_scale.py --sizes 1000000 --multi 1000x1000

The bulk goes straight into smem's own tables (smem.bulk: the rows smem's write path writes for a fact,
memories + memories_fts + vec_memories + a history event), with made-up words (a Zipf spread over
20,000 words) and RANDOM UNIT VECTORS, not MiniLM's, in transactions of 5,000. The measured operations
go through smem's service layer (smem.ops.Ops, as the HTTP API calls it) on the embedded default
(in-process all-MiniLM-L6-v2 int8, no LLM, no reranker):

  search   Ops.search mode "memories", 4-word queries: its total (hybrid), and from the answer's own
           timing its BM25 phase (keyword) and its embed + KNN phase (semantic); p50/p95
  add      Ops.add_memory of a new sentence (embed, duplicate check, write); p50/p95
  embed    MiniLM on one query alone (part of both search and add): p50/p95
  dup      add's duplicate check alone (smem.facts.find_duplicate on that embedding): p50/p95; what add
           costs besides these two is its write transaction (synchronous FULL: an fsync a commit)
  forget   Ops.forget by id; p50/max
  export   archive.export of the namespace (to /dev/null) and archive.backup of the file: wall time,
           while a writer thread adds facts to another namespace; the longest single add it saw
  size     the file (and WAL) after the build, per fact; the process's RSS now and at its peak

Figures are "lab, this 2-core machine" (shared with other work): read them as orders of magnitude.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "apps" / "smem" / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from smem_locomo import table  # the benches print their tables one way

from smem import archive, bulk
from smem.auth import Principal
from smem.config import Settings
from smem.facts import find_duplicate
from smem.service import build

ADMIN = Principal("bench", frozenset(), True, frozenset(("read", "write")))
TARGETS = {"search p95": 150.0, "add p95": 50.0, "writer wait": 1000.0}


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def rss_mb() -> tuple[float, float]:
    now = 0.0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            now = int(line.split()[1]) / 1024
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class Writer(threading.Thread):
    """Adds facts to another namespace in a loop until stopped; the longest single add, in ms."""

    def __init__(self, ops, ns: str, words: bulk.Words):
        super().__init__(daemon=True)
        self.ops, self.ns, self.words = ops, ns, words
        self.stop, self.longest, self.done, self.errors = threading.Event(), 0.0, 0, []

    def run(self):
        while not self.stop.is_set():
            t = time.perf_counter()
            try:
                self.ops.add_memory(ADMIN, self.ns, {"content": self.words.sentence()})
            except Exception as e:
                self.errors.append(repr(e))
            self.longest = max(self.longest, 1000 * (time.perf_counter() - t))
            self.done += 1


def during_writes(ops, words, fn) -> tuple[float, float, int, list]:
    """fn's wall time (s) while a writer adds facts elsewhere; (wall, longest add ms, adds, errors)."""
    w = Writer(ops, "bench-writer", words)
    w.start()
    time.sleep(0.5)
    t = time.perf_counter()
    fn()
    wall = time.perf_counter() - t
    time.sleep(0.2)
    w.stop.set()
    w.join()
    return wall, w.longest, w.done, w.errors


def scenario(label: str, namespaces: int, per_ns: int, args, workdir: Path) -> dict:
    path = workdir / ("%s.db" % label)
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    app, pipeline = build(str(path), Settings(), start_workers=False)
    ops, db = app.state.ops, pipeline.db
    rng = np.random.default_rng(42)
    words = bulk.Words(rng)
    dim = ops.embedder.dim
    t = time.perf_counter()
    for i in range(namespaces):
        ns = "bench" if i == 0 else "ns%04d" % i
        bulk.facts(db, ns, per_ns, dim, rng=rng, words=words, start=i * per_ns)
        if namespaces > 1 and i % 100 == 0:
            print("  %s: %d namespaces built, %.0f s" % (label, i + 1, time.perf_counter() - t), file=sys.stderr)
    build_s = time.perf_counter() - t
    db.checkpoint()
    size = os.path.getsize(path) + (os.path.getsize(str(path) + "-wal") if os.path.exists(str(path) + "-wal") else 0)
    print("  %s: built in %.0f s, %.1f MB" % (label, build_s, size / 1e6), file=sys.stderr)

    for _ in range(3):   # warm: the model loaded, the first pages read
        ops.search(ADMIN, "bench", {"q": words.sentence(4), "mode": "memories"})
    total, bm25, vector = [], [], []
    for _ in range(args.queries):
        t = time.perf_counter()
        out = ops.search(ADMIN, "bench", {"q": words.sentence(4), "mode": "memories"})
        total.append(1000 * (time.perf_counter() - t))
        bm25.append(out["timing"]["bm25Ms"])
        vector.append(out["timing"]["vectorMs"])
    embeds, dups = [], []   # the query's embedding alone (the share of search and add no index takes away),
    for _ in range(args.queries):   # and add's duplicate check alone on that embedding
        sentence = words.sentence()
        t = time.perf_counter()
        v = ops.embedder.embed([sentence])[0]
        embeds.append(1000 * (time.perf_counter() - t))
        t = time.perf_counter()
        find_duplicate(db, "bench", sentence, v, ops.settings.near_duplicate)
        dups.append(1000 * (time.perf_counter() - t))
    adds, ids = [], []
    for _ in range(args.adds):
        t = time.perf_counter()
        ids.append(ops.add_memory(ADMIN, "bench", {"content": words.sentence()})["id"])
        adds.append(1000 * (time.perf_counter() - t))
    forgets = []
    for mem_id in ids[:10]:
        t = time.perf_counter()
        ops.forget(ADMIN, "bench", {"id": mem_id})
        forgets.append(1000 * (time.perf_counter() - t))

    def export():
        with open(os.devnull, "w") as f:
            archive.export(db, "bench", f)
    export_s, export_wait, export_adds, export_err = during_writes(ops, words, export)
    copy = workdir / ("%s.backup.db" % label)
    backup_s, backup_wait, backup_adds, backup_err = during_writes(
        ops, words, lambda: archive.backup(str(path), to=str(copy)))
    copy.unlink(missing_ok=True)
    now_mb, peak_mb = rss_mb()
    facts = namespaces * per_ns
    db.close()
    for suffix in ("", "-wal", "-shm"):
        Path(str(path) + suffix).unlink(missing_ok=True)
    return {"label": label, "facts": facts, "build_s": build_s, "size_mb": size / 1e6, "per_fact": size / facts,
            "search_p50": pct(total, 50), "search_p95": pct(total, 95), "kw_p50": pct(bm25, 50),
            "kw_p95": pct(bm25, 95), "sem_p50": pct(vector, 50), "sem_p95": pct(vector, 95),
            "embed_p50": pct(embeds, 50), "embed_p95": pct(embeds, 95), "dup_p50": pct(dups, 50),
            "dup_p95": pct(dups, 95), "add_p50": pct(adds, 50), "add_p95": pct(adds, 95),
            "forget_p50": pct(forgets, 50),
            "forget_max": max(forgets), "export_s": export_s, "export_wait": export_wait,
            "export_adds": export_adds, "backup_s": backup_s, "backup_wait": backup_wait, "backup_adds": backup_adds,
            "errors": export_err + backup_err, "rss_mb": now_mb, "peak_mb": peak_mb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="10000,100000", help="facts in one namespace, comma-separated")
    ap.add_argument("--multi", default="", help="NAMESPACESxFACTS, e.g. 1000x1000 (default: none)")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--adds", type=int, default=50)
    ap.add_argument("--dir", help="where the files are built (default: a temporary directory)")
    args = ap.parse_args()
    runs = [("1x%d" % int(n), 1, int(n)) for n in args.sizes.split(",") if n]
    if args.multi:
        a, _, b = args.multi.partition("x")
        runs.append(("%sx%s" % (a, b), int(a), int(b)))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        results = [scenario(label, a, b, args, Path(tmp)) for label, a, b in runs]
    print("smem at scale (lab, this 2-core machine; bulk facts with random unit vectors; measured operations"
          " through Ops on the embedded MiniLM default)")
    table("Search, add, forget (ms)", ["namespaces x facts", "hybrid p50", "hybrid p95", "keyword p50",
                                       "keyword p95", "semantic p50", "semantic p95", "embed p50", "embed p95",
                                       "dup check p50",
                                       "dup check p95", "add p50", "add p95", "forget p50", "forget max"],
          [[r["label"], r["search_p50"], r["search_p95"], r["kw_p50"], r["kw_p95"], r["sem_p50"], r["sem_p95"],
            r["embed_p50"], r["embed_p95"], r["dup_p50"], r["dup_p95"], r["add_p50"], r["add_p95"], r["forget_p50"],
            r["forget_max"]] for r in results])
    table("Export and backup beside a writer; size", ["namespaces x facts", "export s", "writer wait ms",
                                                       "backup s", "writer wait ms ", "writes during",
                                                       "write errors", "file MB", "bytes/fact", "build s",
                                                       "RSS MB", "peak RSS MB"],
          [[r["label"], r["export_s"], r["export_wait"], r["backup_s"], r["backup_wait"],
            r["export_adds"] + r["backup_adds"], len(r["errors"]), r["size_mb"], round(r["per_fact"]),
            round(r["build_s"]), round(r["rss_mb"]), round(r["peak_mb"])] for r in results])
    for r in results:
        if r["facts"] >= 1_000_000:
            checks = {"search p95": r["search_p95"], "add p95": r["add_p95"],
                      "writer wait": max(r["export_wait"], r["backup_wait"])}
            print("\n%s against the targets: %s" % (r["label"], ", ".join(
                "%s %.0f ms (target %.0f: %s)" % (k, v, TARGETS[k], "met" if v <= TARGETS[k] else "MISSED")
                for k, v in checks.items())))
        for e in r["errors"][:3]:
            print("%s: a write failed: %s" % (r["label"], e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
