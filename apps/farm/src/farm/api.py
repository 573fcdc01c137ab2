"""The host's HTTP API: the CLI's submit / status / cancel over the same database, behind a bearer
token, on the address api_listen names (every address only with allow_public_listen); and for
workers without a shared filesystem (host_url), bundles by hash and part uploads, behind a second
token.

    POST   /v1/jobs        {spec | project + composition [+ props], out, nodes?, verify?} -> 201 {id}
    GET    /v1/jobs        {jobs: [{id, state, frames, out, reason}]}
    GET    /v1/jobs/{id}   what `farm status --json` prints
    DELETE /v1/jobs/{id}   202 {id, cancel: "requested"}; 409 if it is not live
    GET    /v1/bundles/{hash}             a tar of work_dir/bundles/<hash> (either token)
    PUT    /v1/jobs/{id}/parts/{name}     X-Content-SHA256; into parts_dir/<id>/ (the worker token)
    GET    /metrics        Prometheus text (the metrics token, or the API token): farm.metrics

No token (or an unknown one): 401; a token of the wrong kind: 403.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

from farm import metrics, remotion, transport
from farm.config import Settings
from farm.db import DB, LIVE
from farm.jobs import check_nodes, project_spec, submit

log = logging.getLogger("farm.api")
SUBMIT_KEYS = {"spec", "project", "composition", "props", "out", "nodes", "verify", "s_per_frame"}


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build(s: Settings, token: str, worker_token: str | None = None, metrics_token: str | None = None, *,
          node_tokens: dict[str, str] | None = None) -> Starlette:
    """node_tokens: each node's own worker token (worker_tokens_dir), by node; a part upload with one is
    accepted only for an attempt of that node. worker_token: one token shared by every node (older)."""
    db = DB(s.db_path)
    nodes = dict(node_tokens or {})
    every = [t for t in (token, worker_token, metrics_token, *nodes.values()) if t]
    if len(every) != len(set(every)):
        raise ValueError("the API, worker, metrics and node tokens must all differ")
    tokens = {"api": token, "worker": worker_token, "metrics": metrics_token,
              **{"node:" + n: t for n, t in nodes.items()}}
    scrape = metrics.registry(db)

    def bearer(request: Request) -> str | None:
        got = request.headers.get("authorization", "").encode()
        return next((k for k, t in tokens.items() if t and hmac.compare_digest(got, ("Bearer " + t).encode())), None)

    def refused(request: Request, *kinds: str) -> JSONResponse | None:
        kind = bearer(request)
        if kind is None:
            return error(401, "bearer token required")
        if kind.startswith("node:"):
            kind = "worker"
        return None if kind in kinds else error(403, "the %s token cannot use this route" % kind)

    async def create(request: Request):
        if denied := refused(request, "api"):
            return denied
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error(400, "the body is not JSON")
        try:
            job_id = await _submit(s, body)
        except (ValueError, remotion.RemotionError) as e:
            return error(400, str(e))
        return JSONResponse({"id": job_id}, status_code=201)

    async def listing(request: Request):
        if denied := refused(request, "api"):
            return denied
        return JSONResponse({"jobs": db.rows("SELECT id, state, frames, out, reason FROM jobs"
                                             " ORDER BY created_at DESC LIMIT 100")})

    async def one(request: Request):
        if denied := refused(request, "api"):
            return denied
        v = db.view(request.path_params["id"], s.stale_after_s)
        return error(404, "no such job") if v is None else JSONResponse(json.loads(json.dumps(v, default=str)))

    async def cancel(request: Request):
        if denied := refused(request, "api"):
            return denied
        jid = request.path_params["id"]
        if db.request_cancel(jid):
            return JSONResponse({"id": jid, "cancel": "requested"}, status_code=202)
        job = db.job(jid)
        return error(404, "no such job") if job is None else error(409, "job is %s" % job["state"])

    async def bundle(request: Request):
        if denied := refused(request, "api", "worker"):
            return denied
        digest = request.path_params["hash"]
        src = Path(s.work_dir) / "bundles" / digest
        if not transport.HASH.fullmatch(digest) or not src.is_dir():
            return error(404, "no bundle %s" % digest)
        tar = await run_in_threadpool(transport.bundle_tar, src, Path(s.work_dir) / "bundle-tars")
        return FileResponse(tar, media_type="application/x-tar")

    async def put_part(request: Request):
        if denied := refused(request, "worker"):
            return denied
        jid, name = request.path_params["id"], request.path_params["name"]
        want = request.headers.get("x-content-sha256", "").lower()
        who = bearer(request)
        node = who[5:] if who and who.startswith("node:") else None
        if refusal := _part_refused(db, s, jid, name, request.headers, node=node):
            return refusal
        return await _store_part(request, Path(s.parts_dir) / jid, name, want, s.max_part_bytes)

    async def prometheus(request: Request):
        if denied := refused(request, "metrics", "api"):
            return denied
        return Response(await run_in_threadpool(metrics.render, scrape), media_type=metrics.CONTENT_TYPE)

    return Starlette(routes=[Route("/v1/jobs", create, methods=["POST"]), Route("/v1/jobs", listing, methods=["GET"]),
                             Route("/metrics", prometheus, methods=["GET"]),
                             Route("/v1/jobs/{id}", one, methods=["GET"]),
                             Route("/v1/jobs/{id}", cancel, methods=["DELETE"]),
                             Route("/v1/bundles/{hash}", bundle, methods=["GET"]),
                             Route("/v1/jobs/{id}/parts/{name}", put_part, methods=["PUT"])])


async def _submit(s: Settings, body) -> str:
    """The job's id; ValueError for a request that records nothing."""
    if not isinstance(body, dict) or set(body) - SUBMIT_KEYS or not isinstance(body.get("out"), str):
        raise ValueError("expected {spec | project + composition [+ props], out, nodes?, verify?, s_per_frame?}")
    nodes = check_nodes(s, body.get("nodes"))
    timings = None
    if "spec" in body:
        spec = body["spec"]
    elif body.get("project") and body.get("composition"):
        spec, timings = await run_in_threadpool(project_spec, s, Path(body["project"]), body["composition"],
                                                body.get("props") or {})
    else:
        raise ValueError("spec, or project and composition")
    return submit(s, spec, body["out"], nodes, verify=bool(body.get("verify")), timings=timings,
                  made_here="spec" not in body, s_per_frame=body.get("s_per_frame"))


def _part_refused(db: DB, s: Settings, jid: str, name: str, headers, *, node: str | None) -> JSONResponse | None:
    """The answer to a part upload that is refused before its body is read, or None."""
    if not transport.PART.fullmatch(name):
        return error(400, "a part is named part-NNNNN.ts or part-NNNNN.wav")
    if not transport.HASH.fullmatch(headers.get("x-content-sha256", "").lower()):
        return error(400, "X-Content-SHA256 (64 hex digits) required")
    job = db.job(jid)
    if job is None or job["state"] not in LIVE:
        return error(409, "job %s is %s" % (jid, job["state"] if job else "unknown"))
    if why := _not_the_attempts_part(db, jid, name, headers, node=node):
        log.warning("part upload %s/%s refused: %s", jid, name, why)
        return error(403, why)
    if int(headers.get("content-length") or 0) > s.max_part_bytes:
        return error(413, "a part is at most max_part_bytes (%d bytes)" % s.max_part_bytes)
    return None


def _not_the_attempts_part(db: DB, jid: str, name: str, headers, *, node: str | None) -> str | None:
    """Why this upload is not the part of an attempt its sender holds, or None: the attempt named in
    X-Farm-Attempt must be this job's, of this part's chunk, started, and X-Farm-Attempt-Key its key
    (which went out in its message alone). Started or queued: its `started` may not be applied yet."""
    a = db.one("SELECT idx, state, key, node FROM attempts WHERE id=? AND job_id=?",
               (headers.get("x-farm-attempt", ""), jid))
    if a is None:
        return "X-Farm-Attempt names no attempt of job %s" % jid
    if node and a["node"] and a["node"] != node:
        return "attempt %s is %s's; the token is %s's" % (headers.get("x-farm-attempt"), a["node"], node)
    if not a["key"] or not hmac.compare_digest(headers.get("x-farm-attempt-key", "").encode(), a["key"].encode()):
        return "X-Farm-Attempt-Key is not the attempt's key"
    if name.split(".", maxsplit=1)[0] != "part-%05d" % a["idx"]:
        return "attempt %s renders chunk %d, not %s" % (headers.get("x-farm-attempt"), a["idx"], name)
    if a["state"] not in ("queued", "started"):      # queued: its `started` report may not be applied yet
        return "attempt %s is %s" % (headers.get("x-farm-attempt"), a["state"])
    return None


async def _store_part(request: Request, folder: Path, name: str, want: str, limit: int) -> JSONResponse:
    """The body into a temporary file, checked against its sha256, fsynced, then renamed into place:
    under its name a part is whole, and a second upload replaces it whole."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.{secrets.token_hex(4)}.upload"
    try:
        return await _write_part(request, tmp, folder / name, name, want=want, limit=limit)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # The host's own fault: 507, which the worker reports as `interrupted` (nobody charged), and the
        # coordinator pauses the job until space is back (README "The host's faults are the host's").
        return error(507, "the host's disk is full under %s: %s" % (folder.parent, e.strerror))
    finally:
        tmp.unlink(missing_ok=True)


async def _write_part(request: Request, tmp: Path, final: Path, name: str, *, want: str, limit: int) -> JSONResponse:
    """The body into tmp, checked against its sha256, fsynced, then renamed to final."""
    h, size = hashlib.sha256(), 0
    with open(tmp, "wb") as f:
        async for block in request.stream():
            h.update(block)
            size += len(block)
            if size > limit:      # no Content-Length, or a false one
                return error(413, "a part is at most max_part_bytes (%d bytes)" % limit)
            await run_in_threadpool(f.write, block)
        if h.hexdigest() != want:
            return error(400, "%s: the body's sha256 is %s, X-Content-SHA256 says %s" % (name, h.hexdigest(), want))
        f.flush()
        await run_in_threadpool(os.fsync, f.fileno())
    os.replace(tmp, final)
    return JSONResponse({"name": name, "sha256": want, "bytes": size}, status_code=201)


WILDCARDS = {ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::")}


def listen_address(s: Settings) -> tuple[str, int]:
    """api_listen's host and port. The host is resolved as the server will resolve it: any address it
    resolves to that is every address (0.0.0.0, ::, and so 0, ::0, an empty host, or a name that
    resolves to one) needs allow_public_listen; a specific address, loopback or not, is the inventory's
    choice. A host that does not resolve is an error too."""
    host, sep, port = s.api_listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit("farm api: api_listen is HOST:PORT (e.g. 127.0.0.1:8790), not %r" % s.api_listen)
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SystemExit("farm api: api_listen %r does not resolve: %s" % (s.api_listen, e)) from None
    found = sorted({ipaddress.ip_address(i[4][0].split("%")[0]) for i in infos}, key=str)
    wild = [str(a) for a in found if a in WILDCARDS or (a.version == 6 and a.ipv4_mapped in WILDCARDS)]
    if wild and not s.allow_public_listen:
        raise SystemExit("farm api: refusing to listen on every address (%r resolves to %s): name one address, or "
                         "set allow_public_listen = true" % (s.api_listen, ", ".join(wild)))
    return host, int(port)


def serve(s: Settings) -> int:
    import uvicorn  # noqa: PLC0415 (only to serve)

    if not s.api_token_file:
        raise SystemExit("farm api: api_token_file is required (the bearer token)")
    host, port = listen_address(s)
    app = build(s, Path(s.api_token_file).read_text().strip(), s.worker_token(), s.metrics_token(),
                node_tokens=s.node_tokens())
    uvicorn.run(app, host=host, port=port, log_level="info")
    return 0
