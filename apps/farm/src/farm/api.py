"""The host's HTTP API: the CLI's submit / status / cancel over the same database, behind a bearer
token, on loopback unless allow_public_listen says otherwise.

    POST   /v1/jobs        {spec | project + composition [+ props], out, nodes?, verify?} -> 201 {id}
    GET    /v1/jobs        {jobs: [{id, state, frames, out, reason}]}
    GET    /v1/jobs/{id}   what `farm status --json` prints
    DELETE /v1/jobs/{id}   202 {id, cancel: "requested"}; 409 if it is not live
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from farm import remotion
from farm.cli import check_nodes, submit
from farm.config import Settings
from farm.db import DB

SUBMIT_KEYS = {"spec", "project", "composition", "props", "out", "nodes", "verify"}


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def build(s: Settings, token: str) -> Starlette:
    db = DB(s.db_path)

    def authorized(request: Request) -> bool:
        got = request.headers.get("authorization", "")
        return hmac.compare_digest(got.encode(), ("Bearer " + token).encode())

    async def create(request: Request):
        if not authorized(request):
            return error(401, "bearer token required")
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error(400, "the body is not JSON")
        try:
            if not isinstance(body, dict) or set(body) - SUBMIT_KEYS or not isinstance(body.get("out"), str):
                raise ValueError("expected {spec | project + composition [+ props], out, nodes?, verify?}")
            nodes = check_nodes(s, body.get("nodes"))
            if "spec" in body:
                spec = body["spec"]
            elif body.get("project") and body.get("composition"):
                spec = await run_in_threadpool(remotion.job_spec, Path(body["project"]), body["composition"],
                                               body.get("props") or {}, s)
            else:
                raise ValueError("spec, or project and composition")
            if not isinstance(spec, dict) or "frames" not in spec or "fps" not in spec:
                raise ValueError("the spec needs frames and fps")
            job_id = submit(s, spec, body["out"], nodes, verify=bool(body.get("verify")))
        except ValueError as e:
            return error(400, str(e))
        return JSONResponse({"id": job_id}, status_code=201)

    async def listing(request: Request):
        if not authorized(request):
            return error(401, "bearer token required")
        return JSONResponse({"jobs": db.rows("SELECT id, state, frames, out, reason FROM jobs"
                                             " ORDER BY created_at DESC LIMIT 100")})

    async def one(request: Request):
        if not authorized(request):
            return error(401, "bearer token required")
        v = db.view(request.path_params["id"], s.stale_after_s)
        return error(404, "no such job") if v is None else JSONResponse(json.loads(json.dumps(v, default=str)))

    async def cancel(request: Request):
        if not authorized(request):
            return error(401, "bearer token required")
        jid = request.path_params["id"]
        if db.request_cancel(jid):
            return JSONResponse({"id": jid, "cancel": "requested"}, status_code=202)
        job = db.job(jid)
        return error(404, "no such job") if job is None else error(409, "job is %s" % job["state"])

    return Starlette(routes=[Route("/v1/jobs", create, methods=["POST"]), Route("/v1/jobs", listing, methods=["GET"]),
                             Route("/v1/jobs/{id}", one, methods=["GET"]),
                             Route("/v1/jobs/{id}", cancel, methods=["DELETE"])])


def listen_address(s: Settings) -> tuple[str, int]:
    host, _, port = s.api_listen.rpartition(":")
    host = host.strip("[]")
    loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    if not loopback and not s.allow_public_listen:
        raise SystemExit("farm api: %s is not a loopback address; set allow_public_listen = true to listen there"
                         % s.api_listen)
    return host, int(port)


def serve(s: Settings) -> int:
    import uvicorn  # noqa: PLC0415 (only to serve)

    if not s.api_token_file:
        raise SystemExit("farm api: api_token_file is required (the bearer token)")
    host, port = listen_address(s)
    uvicorn.run(build(s, Path(s.api_token_file).read_text().strip()), host=host, port=port, log_level="info")
    return 0
