#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""smem's vector phase alone at scale: the coarse index (bit KNN, then exact cosine) against the exact float KNN.

  nice -n 10 .venv/bin/python bench/smem_knn.py --sizes 100000,1000000 --dir /tmp/knn

One namespace of N facts with CLUSTERED unit vectors (400 topics, cosine ~0.64 to their topic's centre, as
sentence embeddings of one subject sit), written as smem's write path indexes a fact (memories +
vec_memories + vec_memories_bits; no FTS, no history: this bench reads only the vectors). For each query
(a new vector near one topic's centre) it times, with the statements smem runs:

  search   smem.search._knn for search's 50 candidates (k = 200 nearest; coarse: 1,600 by the bits)
  dup      smem.facts.nearest for add's duplicate check (k = 10; coarse: 400 by the bits, vectors.MIN_K)

in three ways: held (the bits held in memory, smem.bit_cache, as smem runs by default), sql bits (sqlite-vec's
scan of the bit table: bit_cache_mb = 0) and exact (coarse_oversample 0); p50/p95 wall ms and CPU ms of this
thread (the CPU figure is what the machine's other load cannot inflate), recall@10 of each coarse answer
against the exact one, and the held copy's first read. --keep --dir keeps the files for the next run.
No MiniLM here: a search adds the query's embedding (bench/smem_scale.py's "embed p50").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "apps" / "smem" / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from smem_locomo import table  # the benches print their tables one way

from smem import db as dbm
from smem import facts, search, vectors
from smem.db import content_key, new_id

DIM = 384
TOPICS = 400


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


def build(db: dbm.DB, n: int, centres: np.ndarray, rng: np.random.Generator, batch: int = 5000) -> None:
    c = db.conn
    for lo in range(0, n, batch):
        k = min(batch, n - lo)
        vecs = unit(centres[rng.integers(0, TOPICS, k)] + 1.2 * unit(rng.standard_normal((k, DIM))))
        with db.tx():
            for v in vecs:
                text = "fact %d" % lo
                blob = v.tobytes()
                c.execute("INSERT INTO memories(id, ns, content, content_key, valid_from, recorded_at, origin,"
                          " embedding, indexed) VALUES (?, 'bench', ?, ?, '2020', '2020', 'user', ?, 1)",
                          (new_id("mem"), text, content_key(text), blob))
                vectors.insert(c, "memory", c.last_insert_rowid(), "bench", blob)


def timed(fn) -> tuple[object, float, float]:
    w, p = time.perf_counter(), time.thread_time()
    out = fn()
    return out, 1000 * (time.perf_counter() - w), 1000 * (time.thread_time() - p)


def run(n: int, queries: int, workdir: Path, keep: bool) -> dict:
    rng = np.random.default_rng(42)
    centres = unit(rng.standard_normal((TOPICS, DIM)))
    path = workdir / ("knn-%d.db" % n)
    db = dbm.DB(str(path), "bench-embedder", DIM)
    t = time.perf_counter()
    if db.scalar("SELECT value FROM meta WHERE key = 'bench_built'") != str(n):   # else a kept file's
        build(db, n, centres, rng)
        db.conn.execute("INSERT OR REPLACE INTO meta VALUES ('bench_built', ?)", (str(n),))
    build_s = time.perf_counter() - t
    db.checkpoint()
    print("  %d: built in %.0f s" % (n, build_s), file=sys.stderr)
    params = {"ns": "bench", "t": dbm.now()}
    qrng = np.random.default_rng(7)   # the same queries whether the file was built now or kept
    qs = unit(centres[qrng.integers(0, TOPICS, queries)] + 1.2 * unit(qrng.standard_normal((queries, DIM))))
    out: dict = {"n": n, "build_s": build_s}
    answers: dict = {}
    cache = db.bit_cache
    for mode, oversample in (("held", 8), ("sql", 8), ("exact", 0)):
        db.coarse_oversample = oversample
        db.bit_cache = cache if mode == "held" else None
        assert db.coarse() == (oversample > 0)
        for name, fn in (("search", lambda q: search._knn(db, "memory", q, params, 50)),
                         ("dup", lambda q: [m["id"] for m in facts.nearest(db, "bench", q, 10)])):
            _, wall, cpu = timed(lambda fn=fn: fn(qs[0]))   # warm; the held copy is read here, once
            if mode == "held" and name == "search":
                out["load wall"], out["load cpu"] = wall, cpu
            walls, cpus, got = [], [], []
            for q in qs:
                ids, wall, cpu = timed(lambda q=q, fn=fn: fn(q))
                walls.append(wall)
                cpus.append(cpu)
                got.append(ids[:10])
            answers[(mode, name)] = got
            for label, values in (("wall", walls), ("cpu", cpus)):
                for p in (50, 95):
                    out["%s %s %s p%d" % (mode, name, label, p)] = pct(values, p)
    for mode in ("held", "sql"):
        for name in ("search", "dup"):
            hits = sum(len(set(a) & set(b)) for a, b in zip(answers[(mode, name)], answers[("exact", name)],
                                                            strict=True))
            out["%s %s recall@10" % (mode, name)] = hits / (10 * queries)
    db.close()
    if not keep:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000", help="facts in one namespace, comma-separated")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--dir", help="where the files are built (default: a temporary directory)")
    ap.add_argument("--keep", action="store_true",
                    help="keep each file in --dir (knn-N.db) and reuse one a run before built")
    args = ap.parse_args()
    if args.keep and not args.dir:
        ap.error("--keep needs --dir")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        where = Path(args.dir) if args.keep else Path(tmp)
        results = [run(int(n), args.queries, where, args.keep) for n in args.sizes.split(",") if n]
    for name, what in (("search", "search's KNN (50 candidates)"), ("dup", "add's duplicate check (k=10)")):
        table("%s, ms (lab, this 2-core machine)" % what,
              ["facts"] + ["%s %s %s" % (m, s, p) for m in ("held", "sql bits", "exact") for s in ("wall", "CPU")
                           for p in ("p50", "p95")] + ["held recall@10", "sql bits recall@10"],
              [["{:,}".format(r["n"])] + [r["%s %s %s %s" % (m, name, s, p)] for m in ("held", "sql", "exact")
                                          for s in ("wall", "cpu") for p in ("p50", "p95")]
               + [r["held %s recall@10" % name], r["sql %s recall@10" % name]] for r in results])
    table("the held copy's first read (the first search of a namespace in a process), ms",
          ["facts", "wall", "CPU"], [["{:,}".format(r["n"]), r["load wall"], r["load cpu"]] for r in results])
    return 0


if __name__ == "__main__":
    sys.exit(main())
