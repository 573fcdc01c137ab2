#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""smem search latency (p50/p95, warm) and ingest throughput (documents/s), on LoCoMo text.

  .venv/bin/python bench/smem_latency.py                          # embedded default, in-process app
  .venv/bin/python bench/smem_latency.py --conversations 1 --queries 100
  .venv/bin/python bench/smem_latency.py --url http://127.0.0.1:8787 --token "$TOKEN" --ns bench
  .venv/bin/python bench/smem_latency.py --url ... --token ... --ns bench --skip-ingest   # search only

Embedded (no --url): smem.service.build on a fresh DB in a temporary directory with the default
settings (in-process all-MiniLM-L6-v2 int8, no LLM so extraction is skipped, no reranker), the
Starlette app driven in-process (starlette.testclient), its workers running as `smem serve` runs
them. Ingest: every session of the first --conversations LoCoMo conversations POSTed as a document
(validAt = the session's date), timed from the first POST until the last document is done.
Search: --queries LoCoMo questions POSTed to /search after --warmup untimed ones; the latency is the
client's (request to parsed answer) and, beside it, the server's own timing.totalMs.

--url: the same against a running smem (e.g. through the lab's lanes), with a token for --ns. The
documents go to --ns with customIds "locomo-bench-<conv>-<session>", so a re-run replaces them.
--extraction: say that extraction is expected ON. It needs an LLM lane ([models].chat and a
[lanes.background] node serving chat in the server's config), so it only makes sense with --url;
the embedded default has no LLM and refuses it. The script checks what the server did (each
document's job stages say extract "done" or "skipped") and reports it.

Figures are lab models (all-MiniLM-L6-v2 int8 in-process unless the server is configured
otherwise) on this host, not hardware figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "apps" / "smem" / "src"))

from smem_locomo import table  # the benches print their tables one way

DATA = ROOT.parent / "shared" / "bench-data" / "locomo10.json"
LABEL = "lab models (all-MiniLM-L6-v2 int8 unless the server says otherwise), not hardware figures"


def sessions_and_questions(path: Path, conversations: int):
    docs, questions = [], []
    for idx, sample in enumerate(json.loads(path.read_text())[:conversations]):
        c = sample["conversation"]
        n = 1
        while "session_%d" % n in c:
            turns = c["session_%d" % n]
            if turns:
                when = datetime.strptime(" ".join(c["session_%d_date_time" % n].split()), "%I:%M %p on %d %B, %Y")
                lines = []
                for t in turns:
                    line = "%s: %s" % (t["speaker"], " ".join(t["text"].split()))
                    if t.get("blip_caption"):
                        line += " [shares %s]" % t["blip_caption"]
                    lines.append(line)
                docs.append({"content": "\n\n".join(lines), "validAt": when.isoformat(),
                             "customId": "locomo-bench-%d-%d" % (idx, n), "metadata": {"conversation": idx,
                                                                                       "session": n},
                             "conv": idx, "turns": len(lines)})
            n += 1
        questions += [(idx, q["question"]) for q in sample["qa"]]
    return docs, questions


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))]


class Target:
    """Where requests go: the in-process app (embedded) or a running smem (--url)."""

    def __init__(self, client, token: str):
        self.client = client
        self.h = {"Authorization": "Bearer " + token}

    def post(self, path: str, body: dict):
        r = self.client.post(path, json=body, headers=self.h)
        if r.status_code >= 400:
            raise SystemExit("%s %s: %d %s" % ("POST", path, r.status_code, r.text[:300]))
        return r.json()

    def get(self, path: str):
        r = self.client.get(path, headers=self.h)
        if r.status_code >= 400:
            raise SystemExit("GET %s: %d %s" % (path, r.status_code, r.text[:300]))
        return r.json()


def ingest(target: Target, ns_of, docs: list[dict], poll_s: float, timeout_s: float) -> dict:
    t0 = time.perf_counter()
    pending = {}
    for d in docs:
        body = {k: d[k] for k in ("content", "validAt", "customId", "metadata")}
        pending[target.post("/v5/ns/%s/documents" % ns_of(d), body)["id"]] = d
    posted = time.perf_counter() - t0
    done, failed, extract = {}, {}, {}
    while pending:
        if time.perf_counter() - t0 > timeout_s:
            raise SystemExit("ingest: %d documents not done after %.0f s" % (len(pending), timeout_s))
        for doc_id, d in list(pending.items()):
            info = target.get("/v5/ns/%s/documents/%s" % (ns_of(d), doc_id))
            if info["status"] in ("done", "failed"):
                (done if info["status"] == "done" else failed)[doc_id] = info
                state = ((info.get("job") or {}).get("stages") or {}).get("extract", {})
                extract[state.get("state", "?")] = extract.get(state.get("state", "?"), 0) + 1
                del pending[doc_id]
        if pending:
            time.sleep(poll_s)
    wall = time.perf_counter() - t0
    chunks = sum(i.get("chunks", 0) for i in done.values())
    return {"documents": len(docs), "done": len(done), "failed": len(failed), "seconds": wall,
            "post_seconds": posted, "docs_per_s": len(done) / wall, "chunks": chunks, "chunks_per_s": chunks / wall,
            "turns_per_s": sum(d["turns"] for d in docs) / wall, "extract": extract,
            "failures": [i.get("error") for i in failed.values()][:3]}


def search_latency(target: Target, ns_of_q, questions, *, n: int, warmup: int, body_extra: dict) -> dict:
    client_ms, server_ms, results, degraded = [], [], [], {}
    for i in range(warmup + n):
        conv, q = questions[i % len(questions)]
        t = time.perf_counter()
        out = target.post("/v5/ns/%s/search" % ns_of_q(conv), {"q": q, **body_extra})
        ms = 1000 * (time.perf_counter() - t)
        if i < warmup:
            continue
        client_ms.append(ms)
        server_ms.append(out.get("timing", {}).get("totalMs", float("nan")))
        results.append(len(out["results"]))
        for d in out.get("degraded", []):
            degraded[d] = degraded.get(d, 0) + 1
    return {"queries": n, "client_ms": client_ms, "server_ms": server_ms, "mean_results": statistics.mean(results),
            "degraded": degraded}


def row(name: str, v: list[float]) -> list[str]:
    return [name, "%.2f" % pct(v, 50), "%.2f" % pct(v, 95), "%.2f" % statistics.mean(v), "%.2f" % max(v)]


@contextlib.contextmanager
def embedded(workdir: Path | None, workers: int):
    """smem's embedded default as `smem serve` assembles it, in-process; yields (client, token, describe)."""
    from starlette.testclient import TestClient

    from smem import auth
    from smem.config import Settings
    from smem.service import build

    work = workdir or Path(tempfile.mkdtemp(prefix="smem-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    db_path = work / "latency.db"
    for p in work.glob("latency.db*"):
        p.unlink()
    settings = Settings(workers=workers)
    t = time.perf_counter()
    app, pipeline = build(str(db_path), settings)
    load_s = time.perf_counter() - t
    token = auth.create(pipeline.db, [], admin=True, label="bench")
    try:
        with TestClient(app) as client:  # runs the lifespan: the workers start
            yield client, token, "embedded default (in-process app, %d worker%s, model load %.1f s)" % (
                workers, "s" * (workers != 1), load_s), settings.poll_interval_s
    finally:
        pipeline.db.close()
        if not workdir:
            shutil.rmtree(work, ignore_errors=True)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help="locomo10.json, read in place (default %(default)s)")
    ap.add_argument("--conversations", type=int, default=3, help="LoCoMo conversations to ingest (default 3)")
    ap.add_argument("--queries", type=int, default=300, help="timed searches (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed searches first (default 20)")
    ap.add_argument("--limit", type=int, default=10, help="search limit (default 10)")
    ap.add_argument("--budget", type=int, default=400, help="search budgetTokens (default 400; 0: none)")
    ap.add_argument("--mode", default="hybrid", choices=["hybrid", "chunks", "memories"])
    ap.add_argument("--workers", type=int, default=1, help="embedded: ingest workers (default 1, as configured)")
    ap.add_argument("--workdir", type=Path, help="embedded: put the DB here (default: a temp dir, removed)")
    ap.add_argument("--url", help="a running smem instead of the embedded default, e.g. http://127.0.0.1:8787")
    ap.add_argument("--token", help="with --url: a bearer token for --ns")
    ap.add_argument("--ns", default="bench", help="with --url: the namespace (default bench); embedded: one "
                    "namespace per conversation")
    ap.add_argument("--skip-ingest", action="store_true", help="with --url: search --ns as it is")
    ap.add_argument("--extraction", action="store_true",
                    help="extraction is expected on: needs an LLM lane on the server (--url only)")
    ap.add_argument("--timeout", type=float, default=1800, help="give up on ingest after this many seconds")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    return ap


def report_ingest(ing: dict, where: str, extraction: bool) -> None:
    ext = ", ".join("%s %d" % kv for kv in sorted(ing["extract"].items()))
    table("Ingest (%s; extraction %s: job stages say extract %s)" % (
        where, "expected on" if extraction else "off", ext),
        ["documents", "failed", "seconds", "documents/s", "chunks", "chunks/s", "turns/s"],
        [["%d" % ing["done"], "%d" % ing["failed"], "%.1f" % ing["seconds"], "%.2f" % ing["docs_per_s"],
          "%d" % ing["chunks"], "%.1f" % ing["chunks_per_s"], "%.1f" % ing["turns_per_s"]]])
    if ing["failures"]:
        print("  failures: %s" % ing["failures"])
    if extraction and ing["extract"].get("done", 0) == 0:
        print("  WARNING: --extraction given but no document's extract stage ran: the server has no LLM lane")
    if not extraction and ing["extract"].get("done", 0):
        print("  note: the server ran extraction on %d documents (it has an LLM lane)" % ing["extract"]["done"])


def main():
    ap = parser()
    args = ap.parse_args()

    if args.url and not args.token:
        ap.error("--url needs --token")
    if args.extraction and not args.url:
        ap.error("--extraction needs an LLM lane: the embedded default has none (no [models].chat, no [lanes]). "
                 "Run `smem serve --config` with a chat model on a background lane and pass --url/--token/--ns.")
    docs, questions = sessions_and_questions(args.data, args.conversations)
    body = {"limit": args.limit, "mode": args.mode, **({"budgetTokens": args.budget} if args.budget else {})}

    if args.url:
        cm = contextlib.nullcontext((httpx.Client(base_url=args.url.rstrip("/"), timeout=120), args.token,
                                     "smem at %s, namespace %s" % (args.url, args.ns), 0.5))
        ns_doc, ns_q = (lambda d: args.ns), (lambda conv: args.ns)
    else:
        cm = embedded(args.workdir, args.workers)
        ns_doc, ns_q = (lambda d: "locomo-%d" % d["conv"]), (lambda conv: "locomo-%d" % conv)

    out = {"label": LABEL}
    with cm as (client, token, where, poll):
        target = Target(client, token)
        print("smem latency: %s. %s." % (where, LABEL), flush=True)
        if not (args.url and args.skip_ingest):
            print("  ingesting %d documents (%d turns) from %d conversations ..." % (
                len(docs), sum(d["turns"] for d in docs), args.conversations), flush=True)
            ing = ingest(target, ns_doc, docs, min(poll, 0.2), args.timeout)
            out["ingest"] = ing
            report_ingest(ing, where, args.extraction)
        lat = search_latency(target, ns_q, questions, n=args.queries, warmup=args.warmup, body_extra=body)
        out["search"] = lat
        table("Search latency, warm (%d timed after %d untimed; %s, limit %d%s; %s)" % (
            args.queries, args.warmup, args.mode, args.limit,
            ", budgetTokens %d" % args.budget if args.budget else "", where),
            ["ms", "p50", "p95", "mean", "max"],
            [row("client (request to answer)", lat["client_ms"]), row("server timing.totalMs", lat["server_ms"])])
        print("  mean results per search %.1f; degraded: %s" % (lat["mean_results"], lat["degraded"] or "none"))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
