#!/usr/bin/env python3
"""vcamon's costs, measured on this machine, against the issue's goals.

1. Collector CPU per node-scrape: six real agents (separate processes, on the
   lab simulator's sysfs trees) scraped N rounds by the real Collector; CPU time
   of the collector process (HTTP, parsing, SQLite) / (rounds x nodes).
   Goal: <= 5 ms.
2. Bytes on disk: three days of 7 machines (6 nodes + host) at 30 s through the
   real write path (record_round, rollup, prune with raw kept 1 day) give the
   measured bytes per node-day of raw samples and of rollups; then a year file
   (14 days raw + 365 days of 5-minute rollups, rows shaped as the real ones,
   bulk-inserted) is built and its size printed. Goal: a year of 6 nodes <= 300 MB.
3. Query time of a 7-day chart for 6 nodes on that year file (median of 5).
   Goal: < 200 ms.

    .venv/bin/python bench/vcamon_bench.py [--rounds 200] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "apps" / "vcamon" / "src"))
sys.path.insert(0, str(REPO / "lab" / "sim"))

from vcamon.collector import Collector
from vcamon.store import DAY_S, ROLLUP_S, Scrape, Store
from vcamon.web import start_web
from vcasim.model import load_params
from vcasim.tree import SysfsTree

NODES = [f"vca-node{i}" for i in (0, 1, 2, 4, 5)] + ["vca-node3"]
MACHINES = ["host", *NODES]
LABELS = ["Package id 0", "Core 0", "Core 1", "Core 2", "Core 3"]


def start_agents(tmp, count):
    procs, urls = [], []
    env = dict(os.environ, PYTHONPATH=str(REPO / "apps" / "vcamon" / "src"))
    for i in range(count):
        tree = SysfsTree(Path(tmp) / f"node{i}" / "sys", load_params()["node"])
        tree.create()
        port = 19478 + i
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "vcamon", "agent", "--node", f"n{i}", "--listen", f"127.0.0.1:{port}",
             "--sysfs-root", str(tree.root), "--sample-interval", "1"], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        urls.append(f"http://127.0.0.1:{port}/metrics")
    for url in urls:
        for _ in range(50):
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
    return procs, urls


def collector_cpu(tmp, rounds):
    procs, urls = start_agents(tmp, 6)
    try:
        store = Store(str(Path(tmp) / "cpu.db"))
        collector = Collector(store, [{"node": f"vca-node{i}", "url": u} for i, u in enumerate(urls)], interval=30)
        collector.round()                                   # warm: series ids, connections
        t0 = time.time()
        cpu0 = time.process_time()
        for i in range(rounds):
            collector.round(now=t0 + 30 * (i + 1))
        cpu = time.process_time() - cpu0
    finally:
        for p in procs:
            p.terminate()
    return cpu / (rounds * 6) * 1000


def synthetic(node, ts, rng):
    base = 40 + 30 * rng.random()
    temps = {label: round(base - i, 1) for i, label in enumerate(LABELS)}
    return Scrape(node=node, ok=node != "vca-node3", temps=temps,
                  power_w=round(12 + 30 * rng.random(), 2), limits={"long_term": 35.0, "short_term": 40.0},
                  throttle={"core 0:0": 0, "core 0:1": 0, "core 0:2": 0, "core 0:3": 0, "package 0": 0})


def table_bytes(path):
    """Bytes per table after VACUUM, from the pages each b-tree uses (dbstat when available)."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("VACUUM")
    try:
        return dict(con.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall())
    except sqlite3.OperationalError:
        return {}
    finally:
        con.close()


def measured_days(tmp, days=3):
    path = str(Path(tmp) / "days.db")
    store = Store(path, raw_days=1)
    rng = random.Random(1)
    start = 1_800_000_000 // DAY_S * DAY_S
    for i in range(days * DAY_S // 30):
        ts = start + 30 * i
        store.record_round(ts, [synthetic(m, ts, rng) for m in MACHINES])
        if ts % 3600 == 0:
            store.rollup(ts)
            store.prune(ts)
    end = start + days * DAY_S
    store.rollup(end)
    store.prune(end)
    counts = {t: store.db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("samples", "rollups", "scrapes")}
    store.close()
    return path, counts, table_bytes(path), days


def year_file(tmp, raw_days=14, rollup_days=365):
    """A year for 6 nodes + host, all answering: rollups and raw rows shaped as the real ones, bulk-inserted."""
    path = str(Path(tmp) / "year.db")
    store = Store(path)
    rng = random.Random(2)
    now = 1_800_000_000 // ROLLUP_S * ROLLUP_S
    ids = [store.series_id(m, "temp", label) for m in MACHINES for label in LABELS]
    ids += [store.series_id(m, "power") for m in MACHINES]
    db = store.db
    db.execute("BEGIN")
    for sid in ids:
        rows = []
        for b in range(rollup_days * DAY_S // ROLLUP_S):
            mean = round(30 + 40 * rng.random(), 6)
            rows.append((sid, now - rollup_days * DAY_S + b * ROLLUP_S, mean - 3, mean, mean + 4, 10))
        db.executemany("INSERT INTO rollups VALUES (?, ?, ?, ?, ?, ?)", rows)
        raw = [(sid, now - raw_days * DAY_S + 30 * k, round(30 + 40 * rng.random(), 3))
               for k in range(raw_days * DAY_S // 30)]
        db.executemany("INSERT INTO samples VALUES (?, ?, ?)", raw)
    scrapes = [(m, now - raw_days * DAY_S + 30 * k, 1, 3.0, None)
               for m in MACHINES for k in range(raw_days * DAY_S // 30)]
    db.executemany("INSERT INTO scrapes VALUES (?, ?, ?, ?, ?)", scrapes)
    db.execute("COMMIT")
    store.close()
    table_bytes(path)
    return path, now


def chart_query_ms(path, now):
    store = Store(path)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        points = sum(len(store.chart(n, now - 7 * DAY_S, now)["t"]) for n in NODES)
        times.append((time.perf_counter() - t0) * 1000)
    store.close()
    return statistics.median(times), points


def page_load_ms(path, now):
    """What the page asks for when it opens on a 7-day range, through the real web server: /api/nodes,
    /api/fleet and one /api/chart per node (JSON encoding and HTTP included); median of 5."""
    server = start_web("127.0.0.1:0", path)
    base = "http://127.0.0.1:%d" % server.server_address[1]
    urls = [base + "/api/nodes", base + "/api/fleet"] + [
        base + "/api/chart?" + urllib.parse.urlencode({"node": n, "from": now - 7 * DAY_S, "to": now}) for n in NODES]
    times = []
    try:
        for _ in range(5):
            t0 = time.perf_counter()
            size = sum(len(urllib.request.urlopen(u, timeout=30).read()) for u in urls)
            times.append((time.perf_counter() - t0) * 1000)
    finally:
        server.shutdown()
        server.server_close()
    return statistics.median(times), size


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--keep", help="keep the databases in this directory")
    args = ap.parse_args()
    tmp = args.keep or tempfile.mkdtemp(prefix="vcamon-bench-")
    os.makedirs(tmp, exist_ok=True)
    results = {}

    ms = collector_cpu(tmp, args.rounds)
    results["collector_cpu_ms_per_node_scrape"] = round(ms, 3)
    print(f"collector CPU per node-scrape: {ms:.2f} ms over {args.rounds} rounds x 6 agents (goal <= 5 ms)")

    _, counts, sizes, days = measured_days(tmp)
    print(f"real write path, {days} days x {len(MACHINES)} machines at 30 s (raw kept 1 day): rows {counts}")
    if sizes:
        machines = len(MACHINES)
        rollup = sizes.get("rollups", 0) / (days * machines)       # every day of the run is rolled up
        raw = (sizes.get("samples", 0) + sizes.get("scrapes", 0)) / machines   # one day of raw is kept
        year = (rollup * 365 + raw * 14) * machines
        print(f"  bytes per node-day: {rollup:.0f} of rollups, {raw:.0f} of raw samples and scrape rows")
        print(f"  a year (365 d rollups + 14 d raw) for {machines} machines at these rates: {year / 1e6:.0f} MB")
        results["bytes_per_node_day"] = {"rollups": round(rollup), "raw": round(raw)}
    else:
        print("  (this SQLite has no dbstat table: per-table bytes not measured)")

    path, now = year_file(tmp)
    size = os.path.getsize(path)
    results["year_file_mb"] = round(size / 1e6, 1)
    print(f"year file, 6 nodes + host (365 d rollups, 14 d raw), after VACUUM: {size / 1e6:.1f} MB (goal <= 300 MB)")

    q, points = chart_query_ms(path, now)
    results["chart_7d_6nodes_ms"] = round(q, 1)
    print(f"7-day chart for 6 nodes: {q:.1f} ms median of 5 ({points} points) (goal < 200 ms)")
    ms, size = page_load_ms(path, now)
    results["page_7d_6nodes_http_ms"] = round(ms, 1)
    print(f"the page's data on a 7-day range over HTTP (nodes, fleet, 6 charts): {ms:.1f} ms median of 5 "
          f"({size / 1e3:.0f} kB)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
