"""smem serve | smem token create | smem mcp."""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys

import uvicorn

from smem import __version__, auth, config, mcp_server
from smem.service import Busy, build, open_db, take_lock

log = logging.getLogger("smem.cli")
BACKLOG = 2048   # uvicorn's default


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError("--listen is HOST:PORT, e.g. 127.0.0.1:8787")
    return host.strip("[]"), int(port)


def show(host: str, port: int) -> str:
    return "[%s]:%d" % (host, port) if ":" in host else "%s:%d" % (host, port)


def resolve_listen(host: str, port: int) -> list[tuple[int, tuple]]:
    """[(family, sockaddr)]: every address HOST names, in every family, as asyncio's create_server
    would bind them (an empty host is every address)."""
    try:
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ValueError("--listen %s: %r does not resolve (%s)" % (show(host, port), host, e)) from None
    out: list[tuple[int, tuple]] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and (family, sockaddr) not in out:
            out.append((family, sockaddr))
    if not out:
        raise ValueError("--listen %s: %r resolves to no IPv4 or IPv6 address" % (show(host, port), host))
    return out


def is_wildcard(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)   # ::ffff:0.0.0.0
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def listen_sockets(addresses: list[tuple[int, tuple]], backlog: int) -> list[socket.socket]:
    """Bound, listening sockets on exactly the addresses that were checked: handing uvicorn the name
    would resolve it again, and a second answer could differ from the one the guard saw."""
    socks: list[socket.socket] = []
    try:
        for family, sockaddr in addresses:
            socks.append(socket.create_server(sockaddr, family=family, backlog=backlog))
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


def serve(args) -> int:
    try:
        settings = config.load(args.config)
    except (OSError, ValueError) as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    host, port = args.listen
    try:
        addresses = resolve_listen(host, port)
    except ValueError as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    if any(is_wildcard(sa[0]) for _, sa in addresses) and not settings.allow_public_listen:
        print("smem: refusing to listen on every address: --listen %s resolves to %s; to mean it, set"
              " allow_public_listen = true in the config (the smem role: smem_allow_public_listen: true)"
              % (show(host, port), ", ".join(sa[0] for _, sa in addresses)), file=sys.stderr)
        return 2
    try:
        lock = take_lock(args.db)
    except Busy as e:
        print("smem: %s" % e, file=sys.stderr)
        return 1
    try:   # before build(), which may load a model: a port in use fails at once
        socks = listen_sockets(addresses, BACKLOG)
    except OSError as e:
        print("smem: cannot listen on %s: %s" % (show(host, port), e.strerror or e), file=sys.stderr)
        return 1
    app, _ = build(args.db, settings)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level, access_log=False, backlog=BACKLOG))
    log.info("listening on %s", ", ".join(show(*s.getsockname()[:2]) for s in socks))
    server.run(sockets=socks)
    del lock
    return 0 if server.started else 1


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
