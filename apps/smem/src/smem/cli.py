"""smem serve | token create/list/revoke/rotate | backup | restore | export | import | mcp."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import socket
import sys

import apsw
import uvicorn

from smem import __version__, archive, auth, config, mcp_server
from smem.errors import Conflict, NotFound
from smem.service import Busy, build, open_db, take_lock, take_users

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


def _tool_db(args):
    """The database for a tool that reads no vectors (tokens): no embedder is loaded or checked."""
    return open_db(args.db, config.load(args.config), check_embedder=False)


def _print(obj) -> None:
    print(json.dumps(obj, indent=2))


def token_create(args) -> int:
    try:
        print(auth.create(_tool_db(args), args.ns or [], admin=args.admin, label=args.label, scopes=args.scope))
    except ValueError as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    return 0


def token_list(args) -> int:
    for t in auth.list_tokens(_tool_db(args)):
        print("%s  %-9s %-18s %-24s %s%s" % (
            t["id"], "admin" if t["admin"] else ",".join(t["scopes"]), t["label"] or "-",
            ",".join(t["namespaces"]) or "-", t["createdAt"], "  revoked " + t["revokedAt"] if t["revokedAt"] else ""))
    return 0


def token_revoke(args) -> int:
    try:
        t = auth.revoke(_tool_db(args), args.id)
    except NotFound as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    print("revoked %s at %s" % (t["id"], t["revokedAt"]), file=sys.stderr)
    return 0


def token_rotate(args) -> int:
    if (args.id is None) == (args.file is None):
        print("smem: token rotate: give a token's ID or --file, not both", file=sys.stderr)
        return 2
    try:
        db = _tool_db(args)
        if args.file is None:
            print(auth.rotate(db, args.id)["token"])
            return 0
        if args.file == "-":   # the old secret on stdin, the new one on stdout (a root shell's files)
            print(auth.rotate(db, auth.token_id(db, sys.stdin.read().strip()))["token"])
            return 0
        with open(args.file, encoding="utf-8") as f:
            token_id = auth.token_id(db, f.read().strip())
        rotated = auth.rotate(db, token_id)
        _replace_secret(args.file, rotated["token"])
    except (NotFound, Conflict, OSError) as e:
        print("smem: token rotate: %s" % e, file=sys.stderr)
        return 2
    print("rotated %s: its new secret is in %s" % (token_id, args.file), file=sys.stderr)
    return 0


def _replace_secret(path: str, secret: str) -> None:
    """The file's new content, whole or not at all, with the old file's owner and mode."""
    st = os.stat(path)
    tmp = path + ".rotating"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (secret + "\n").encode())
        os.fchown(fd, st.st_uid, st.st_gid)
        os.fchmod(fd, st.st_mode & 0o777)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def backup(args) -> int:
    try:
        if args.action == "prune":
            if not args.erased or args.dir is None:
                print("smem: backup prune: give --erased and --dir DIR", file=sys.stderr)
                return 2
            _print(archive.prune_erased(args.db, args.dir, dry_run=args.dry_run))
            return 0
        _print(archive.backup(args.db, to=args.to, directory=args.dir, keep=args.keep))
    except (archive.ArchiveError, OSError, apsw.Error) as e:
        print("smem: backup: %s" % e, file=sys.stderr)
        return 1
    return 0


def vacuum(args) -> int:
    db = open_db(args.db, config.load(args.config), check_embedder=False)
    try:
        _print(archive.vacuum(db))
    except apsw.Error as e:
        print("smem: vacuum: %s" % e, file=sys.stderr)
        return 1
    finally:
        db.close()
    return 0


def restore(args) -> int:
    locks = []
    try:
        archive.check_owner(args.db)   # before any lock file is made as the wrong user
        locks.append(take_lock(args.db))
        locks.append(take_users(args.db))
    except Busy as e:
        for fd in locks:
            os.close(fd)
        print("smem: restore: %s; stop it first (systemctl stop smem, and any smem mcp)" % e, file=sys.stderr)
        return 1
    except archive.ArchiveError as e:
        print("smem: restore: %s" % e, file=sys.stderr)
        return 1
    try:
        _print(archive.restore(args.backup, args.db, force=args.force))
    except (archive.ArchiveError, OSError, apsw.Error) as e:
        print("smem: restore: %s" % e, file=sys.stderr)
        return 1
    finally:
        for fd in locks:
            os.close(fd)
    return 0


def export(args) -> int:
    db = open_db(args.db, config.load(args.config), check_embedder=False)
    if args.out == "-":
        counts = archive.export(db, args.ns, sys.stdout)
    else:
        tmp = args.out + ".part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            counts = archive.export(db, args.ns, f)
        os.replace(tmp, args.out)
    print("exported %(documents)d document(s) and %(facts)d fact(s)" % counts, file=sys.stderr)
    return 0


def import_(args) -> int:
    try:
        settings = config.load(args.config)
        _, pipeline = build(args.db, settings, start_workers=False)
        with (sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")) as f:
            out = archive.import_(pipeline.db, pipeline.embedder, settings, f, ns=args.ns)
    except (archive.ArchiveError, OSError, ValueError) as e:
        print("smem: import: %s (nothing was written)" % e, file=sys.stderr)
        return 2
    print("imported %(documents)d document(s) and %(facts)d fact(s) into %(ns)s;"
          " %(requeued)d document(s) queued to be ingested again" % out, file=sys.stderr)
    return 0


def mcp(args) -> int:
    token = args.token or os.environ.get("SMEM_TOKEN")
    if not token:
        print("smem: give --token or set SMEM_TOKEN", file=sys.stderr)
        return 2
    try:
        settings = config.load(args.config)
        # No take_lock and no workers: `smem serve` may own this file's queue beside us. open_db holds
        # DB.users shared, as serve does: smem restore refuses while this runs.
        app, _ = build(args.db, settings, start_workers=False)
    except (OSError, ValueError) as e:
        print("smem: %s" % e, file=sys.stderr)
        return 2
    return mcp_server.run_stdio(app.state.ops, token)


def _token_parsers(sub) -> None:
    t = sub.add_parser("token", help="manage API tokens (no embedder needed)").add_subparsers(dest="tcmd",
                                                                                            required=True)
    tc = t.add_parser("create", help="print a new token scoped to namespaces (or --admin, or --scope lease)")
    tc.add_argument("--ns", action="append", help="a namespace the token may use; repeat for more")
    tc.add_argument("--scope", action="append", choices=auth.SCOPES,
                    help="read, write (default: both) or lease (the lease routes only); repeat for more")
    tc.add_argument("--admin", action="store_true", help="a token for every namespace, scope and admin route")
    tc.add_argument("--label")
    tc.set_defaults(func=token_create)
    t.add_parser("list", help="every token: id, scopes, label, namespaces (never a secret)").set_defaults(
        func=token_list)
    tr = t.add_parser("revoke", help="refuse a token from now on")
    tr.add_argument("id")
    tr.set_defaults(func=token_revoke)
    tt = t.add_parser("rotate", help="a new secret for a token (printed, or written to --file); the old one is "
                                     "refused at once")
    tt.add_argument("id", nargs="?")
    tt.add_argument("--file", help="the token whose secret is in this file; the new secret replaces it there"
                                      " (-: the old secret on stdin, the new one printed)")
    tt.set_defaults(func=token_rotate)
    for p in (tc, *t.choices.values()):
        if not any(a.dest == "db" for a in p._actions):
            p.add_argument("--db", required=True)
            p.add_argument("--config", help="only for a new database: its embedder")


def _archive_parsers(sub) -> None:
    b = sub.add_parser("backup", help="a consistent copy of the database, safe while smem serve runs")
    b.add_argument("--db", required=True)
    where = b.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", help="the copy's file")
    where.add_argument("--dir", help="or a directory: smem-<UTC time>.db there")
    b.add_argument("--keep", type=int, help="with --dir: keep only the newest N copies")
    b.add_argument("action", nargs="?", choices=["prune"],
                   help="prune --erased --dir DIR: remove the backups taken before the last erase")
    b.add_argument("--erased", action="store_true", help="with prune: the backups that still hold erased content")
    b.add_argument("--dry-run", action="store_true", help="with prune: list them, remove nothing")
    b.set_defaults(func=backup)
    v = sub.add_parser("vacuum", help="shrink the file (free pages out), refresh the planner's statistics")
    v.add_argument("--db", required=True)
    v.add_argument("--config")
    v.set_defaults(func=vacuum)
    r = sub.add_parser("restore", help="a backup as the database (smem serve stopped)")
    r.add_argument("backup")
    r.add_argument("--db", required=True)
    r.add_argument("--force", action="store_true", help="replace an existing database")
    r.set_defaults(func=restore)
    e = sub.add_parser("export", help="one namespace as JSON Lines: documents, chunks, facts with history")
    e.add_argument("--db", required=True)
    e.add_argument("--ns", required=True)
    e.add_argument("--out", default="-", help="a file (default: stdout)")
    e.add_argument("--config")
    e.set_defaults(func=export)
    i = sub.add_parser("import", help="an export into a database (its embedder makes the vectors again)")
    i.add_argument("file", help="the export (- for stdin)")
    i.add_argument("--db", required=True)
    i.add_argument("--ns", help="import as this namespace (default: the export's)")
    i.add_argument("--config")
    i.set_defaults(func=import_)


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
    _token_parsers(sub)
    _archive_parsers(sub)
    m = sub.add_parser("mcp", help="serve the MCP tools over stdio (documents added wait for smem serve's workers)")
    m.add_argument("--db", required=True)
    m.add_argument("--token", help="an API token (default: env SMEM_TOKEN)")
    m.add_argument("--config")
    m.set_defaults(func=mcp)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return args.func(args)
