#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""What synchronous=FULL costs smem's ingest, against NORMAL, on this machine's disk.

  .venv/bin/python bench/smem_durability.py                 # 40 documents, 3 rounds, in a temp dir
  .venv/bin/python bench/smem_durability.py --dir /var/lib/smem-bench --docs 100

Each round ingests the same documents into a new database once with FULL and once with NORMAL (the
order alternating between rounds), through smem's real queue and stages and the in-process embedder:
  accept   the time a 202 waits for: the document and its job committed (p50, p95 per document)
  ingest   documents per second, queued to done (chunk, embed, extract skipped, judge, index)
FULL fsyncs the WAL at every commit, so a document answered 202 survives a power cut; NORMAL fsyncs
only at checkpoints. The figures depend on the disk (a VCA node's, a host's NVMe, a container's
overlay), so measure where smem runs. The lab's embedder is all-MiniLM-L6-v2 int8 in-process: not
a hardware figure for the nodes' models.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "apps" / "smem" / "src"))

from smem.config import Settings
from smem.db import DB
from smem.embed import MiniLMEmbedder
from smem.ingest import Pipeline

TEXT = ("Note {i}: the {team} team met on day {i} to plan the release of build {b}. They agreed to move the "
        "{part} work to next week, and {name} will write up the open questions for the review.")
TEAMS = ["render", "memory", "power", "image", "probe"]
PARTS = ["scheduler", "indexer", "governor", "builder", "kernel"]
NAMES = ["Ines", "Tomas", "Maria", "Ola", "Ravi"]


def docs(n: int) -> list[str]:
    return ["\n\n".join(TEXT.format(i=i * 3 + k, team=TEAMS[(i + k) % 5], b=100 + i, part=PARTS[(i * k) % 5],
                                    name=NAMES[(i + 2 * k) % 5]) for k in range(3)) for i in range(n)]


def run(path: Path, mode: str, contents: list[str], embedder) -> dict:
    db = DB(str(path), embedder.name, embedder.dim, mode)
    pipeline = Pipeline(db, embedder, Settings(synchronous=mode))
    accept = []
    t0 = time.perf_counter()
    for c in contents:
        t = time.perf_counter()
        pipeline.enqueue("bench", c, {}, None, None)
        accept.append(time.perf_counter() - t)
    pipeline.run_until_idle()
    wall = time.perf_counter() - t0
    done = db.scalar("SELECT count(*) FROM documents WHERE status='done'")
    db.close()
    if done != len(contents):
        raise SystemExit("%s: %d of %d documents done" % (mode, done, len(contents)))
    accept.sort()
    return {"p50": statistics.median(accept) * 1000, "p95": accept[int(0.95 * (len(accept) - 1))] * 1000,
            "docs_s": len(contents) / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", help="where the databases go (the disk to measure); default: a temp dir")
    a = ap.parse_args()
    embedder = MiniLMEmbedder()
    embedder.embed(["warm up"])
    contents = docs(a.docs)
    results: dict[str, list[dict]] = {"FULL": [], "NORMAL": []}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        for r in range(a.rounds):
            for mode in (("FULL", "NORMAL") if r % 2 == 0 else ("NORMAL", "FULL")):
                results[mode].append(run(Path(tmp) / ("%s-%d.db" % (mode, r)), mode, contents, embedder))
    print("smem ingest, synchronous FULL against NORMAL: %d documents x %d rounds, disk under %s"
          % (a.docs, a.rounds, a.dir or tempfile.gettempdir()))
    print("(embedder: all-MiniLM-L6-v2 int8 in-process; lab figures, not hardware figures)")
    print("%-8s %14s %14s %14s" % ("mode", "accept p50 ms", "accept p95 ms", "ingest docs/s"))
    med = {}
    for mode, rows in results.items():
        med[mode] = {k: statistics.median(x[k] for x in rows) for k in ("p50", "p95", "docs_s")}
        print("%-8s %14.2f %14.2f %14.2f" % (mode, med[mode]["p50"], med[mode]["p95"], med[mode]["docs_s"]))
    print("FULL/NORMAL: accept p50 x%.2f, ingest throughput x%.2f"
          % (med["FULL"]["p50"] / med["NORMAL"]["p50"], med["FULL"]["docs_s"] / med["NORMAL"]["docs_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
