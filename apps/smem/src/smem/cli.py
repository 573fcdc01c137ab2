"""smem serve | smem token create | smem mcp."""

from __future__ import annotations

import argparse
import logging
import os
import sys

import uvicorn

from smem import __version__, auth, config, mcp_server
from smem.service import Busy, build, open_db, take_lock

PUBLIC = ("0.0.0.0", "::", "")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError("--listen is HOST:PORT, e.g. 127.0.0.1:8787")
    return host.strip("[]"), int(port)


def serve(args) -> int:
    try:
        settings = config.load(args.config)
    except (OSError, ValueError) as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    host, port = args.listen
    if host in PUBLIC and not settings.allow_public_listen:
        print("smem: refusing to listen on all interfaces (%r): set allow_public_listen = true in the config"
              % host, file=sys.stderr)
        return 2
    try:
        lock = take_lock(args.db)
    except Busy as e:
        print("smem: %s" % e, file=sys.stderr)
        return 1
    app, _ = build(args.db, settings)
    uvicorn.run(app, host=host, port=port, log_level=args.log_level, access_log=False)
    del lock
    return 0


def token_create(args) -> int:
    db = open_db(args.db, config.load(args.config))
    try:
        print(auth.create(db, args.ns or [], admin=args.admin, label=args.label))
    except ValueError as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    return 0


def mcp(args) -> int:
    token = args.token or os.environ.get("SMEM_TOKEN")
    if not token:
        print("smem: give --token or set SMEM_TOKEN", file=sys.stderr)
        return 2
    try:
        settings = config.load(args.config)
        # No take_lock and no workers: `smem serve` may own this file's queue beside us.
        app, pipeline = build(args.db, settings, start_workers=False)
    except (OSError, ValueError) as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    return mcp_server.run_stdio(pipeline, settings, token, embedder=app.state.search_embedder,
                                reranker=app.state.reranker)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="smem", description="Local agent memory (Supermemory-v5 shaped).")
    ap.add_argument("--version", action="version", version=__version__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the HTTP API and the ingest workers")
    s.add_argument("--db", required=True)
    s.add_argument("--listen", type=parse_listen, default=parse_listen("127.0.0.1:8787"))
    s.add_argument("--config")
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=serve)
    t = sub.add_parser("token", help="manage API tokens").add_subparsers(dest="tcmd", required=True)
    tc = t.add_parser("create", help="print a new token scoped to namespaces (or --admin)")
    tc.add_argument("--db", required=True)
    tc.add_argument("--ns", action="append", help="a namespace the token may use; repeat for more")
    tc.add_argument("--admin", action="store_true", help="a token for every namespace")
    tc.add_argument("--label")
    tc.add_argument("--config")
    tc.set_defaults(func=token_create)
    m = sub.add_parser("mcp", help="serve the MCP tools over stdio (documents added wait for smem serve's workers)")
    m.add_argument("--db", required=True)
    m.add_argument("--token", help="an API token (default: env SMEM_TOKEN)")
    m.add_argument("--config")
    m.set_defaults(func=mcp)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.func(args)
