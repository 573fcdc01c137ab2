"""The HTTP API, Supermemory-v5 shaped, on Starlette: requests in, smem.ops out."""

from __future__ import annotations

import logging

import apsw
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from smem import __version__, auth
from smem.db import DB
from smem.embed import EmbedderError
from smem.errors import Conflict, NotFound
from smem.lanes import Lanes
from smem.leases import BadLease, Leases
from smem.metrics import CONTENT_TYPE
from smem.ops import ADMIN_ONLY, FORBIDDEN, SEARCH_FIELDS, Ops, ServiceError, check_body, object_schema, parse_json

__all__ = ["ADMIN_ONLY", "FORBIDDEN", "HTTPError", "create_app"]
log = logging.getLogger("smem.api")
HTTPError = ServiceError

# Supermemory's /v3 and /v4 shapes: the namespace is the one container tag; rerank may be a boolean there.
_TAGS = {"type": "array", "items": {"type": "string"}}
_COMPAT_SEARCH = {**SEARCH_FIELDS, "rerank": {"enum": ["none", "order", True, False]}}
V3_DOCUMENT = object_schema({"content": {"type": "string"}, "containerTags": _TAGS, "metadata": {"type": "object"},
                       "customId": {"type": "string", "minLength": 1, "maxLength": 255}}, ["content", "containerTags"])
V3_SEARCH = object_schema({**_COMPAT_SEARCH, "containerTags": _TAGS}, ["q", "containerTags"])
V4_SEARCH = object_schema({**_COMPAT_SEARCH, "containerTag": {"type": "string"}}, ["q", "containerTag"])


def _compat_search(b: dict, mode: str) -> dict:
    if isinstance(b.get("rerank"), bool):
        b["rerank"] = "order" if b["rerank"] else "none"
    return {"mode": mode, **b}


def _tag(tags: list[str]) -> str:
    if len(tags) != 1:
        raise HTTPError(400, "containerTags: exactly one container tag (the namespace), got %d" % len(tags))
    return tags[0]


class TooLarge(HTTPError):
    """A 413 sent once the body has been read (up to a bound), so that the client reads it."""


class API:
    def __init__(self, ops: Ops):
        self.ops, self.settings, self.db = ops, ops.settings, ops.db

    # -- plumbing ------------------------------------------------------------------------
    async def _principal(self, request: Request) -> auth.Principal:
        p = await run_in_threadpool(auth.resolve, self.db, request.headers.get("authorization"))
        if p is None:
            raise HTTPError(401, "missing or unknown bearer token")
        return p

    async def _drain(self, request: Request, seen: int) -> None:
        """Reads and drops what is left of the body, up to max_drain_bytes: a client that sends its whole
        body before it reads (urllib, requests) then reads the 413 instead of a reset connection."""
        async for part in request.stream():
            seen += len(part)
            if seen > self.settings.max_drain_bytes:
                return

    async def _body(self, request: Request):
        # JSON can escape one byte of content as six (\u00e9): the body may be that much larger.
        cap = 6 * self.settings.max_document_bytes + 65536
        too_large = TooLarge(413, "request body over %d bytes (6 x max_document_bytes + 64 KiB)" % cap)
        if int(request.headers.get("content-length") or 0) > cap:
            await self._drain(request, 0)
            raise too_large
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > cap:
                await self._drain(request, len(raw))
                raise too_large
        return parse_json(bytes(raw))

    def wrap(self, handler):
        async def endpoint(request: Request):
            try:
                return await handler(request)
            except HTTPError as e:
                # After a drained 413 the connection is closed: what is left of a larger body is not read.
                headers = {"Connection": "close"} if isinstance(e, TooLarge) else None
                return JSONResponse({"error": e.message}, status_code=e.status, headers=headers)
            except (NotFound, Conflict, BadLease) as e:
                return JSONResponse({"error": str(e)}, status_code=e.status)
            except EmbedderError as e:
                return JSONResponse({"error": "embedder unavailable: %s" % e}, status_code=503)
            except apsw.FullError as e:
                log.error("%s %s: the disk is full: %s", request.method, request.url.path, e)
                return JSONResponse({"error": "storage full: nothing was written (%s)" % e}, status_code=507)
            except apsw.Error as e:
                log.error("%s %s: database error: %s", request.method, request.url.path, e)
                return JSONResponse({"error": "database error: nothing was written (%s: %s)"
                                     % (type(e).__name__, e)}, status_code=503)
        return endpoint

    def op(self, fn, *args, code: int = 200, body: bool = False, **kw):
        """A route: the token, then (body) the JSON body, then fn(principal, *path params or args, body)."""
        async def handler(request: Request):
            p = await self._principal(request)
            params = [request.path_params[a] for a in args]
            if body:
                params.append(await self._body(request))
            extra = {k: get(request) for k, get in kw.items()}
            return JSONResponse(await run_in_threadpool(lambda: fn(p, *params, **extra)), status_code=code)
        return handler

    # -- routes ----------------------------------------------------------------------------
    async def healthz(self, request):
        h = await run_in_threadpool(self.ops.health)
        out = {"ok": h["ok"], "version": __version__, "schema": self.db.version,
               "embedder": self.ops.embedder.name, **{k: h[k] for k in ("workers", "queue", "problems")}}
        return JSONResponse(out, status_code=200 if h["ok"] else 503)

    async def metrics(self, request):
        p = await self._principal(request)
        text = await run_in_threadpool(self.ops.metrics_text, p)
        return Response(text, media_type=CONTENT_TYPE)

    async def add_memory(self, request):
        p = await self._principal(request)
        b = await self._body(request)
        m = await run_in_threadpool(self.ops.add_memory, p, request.path_params["ns"], b)
        return JSONResponse(m, status_code=200 if m.get("duplicate") else 201)

    async def v3_add_document(self, request):
        p = await self._principal(request)
        b = check_body(await self._body(request), V3_DOCUMENT)
        ns = _tag(b.pop("containerTags"))
        return JSONResponse(await run_in_threadpool(self.ops.add_document, p, ns, b), status_code=202)

    async def v3_search(self, request):
        p = await self._principal(request)
        b = check_body(await self._body(request), V3_SEARCH)
        ns = _tag(b.pop("containerTags"))
        return JSONResponse(await run_in_threadpool(self.ops.search, p, ns, _compat_search(b, "chunks")))

    async def v4_search(self, request):
        p = await self._principal(request)
        b = check_body(await self._body(request), V4_SEARCH)
        ns = _tag([b.pop("containerTag")])
        return JSONResponse(await run_in_threadpool(self.ops.search, p, ns, _compat_search(b, "memories")))

    def routes(self) -> list[Route]:
        o, w = self.ops, self.wrap
        q = lambda name: lambda r: r.query_params.get(name)  # noqa: E731
        flag = lambda name: lambda r: r.query_params.get(name) in ("1", "true")  # noqa: E731

        def route(path, handler, method):
            return Route(path, w(handler), methods=[method])
        return [
            route("/healthz", self.healthz, "GET"),
            route("/metrics", self.metrics, "GET"),
            route("/v5/namespaces", self.op(lambda p: {"namespaces": o.namespaces(p)}), "GET"),
            route("/v5/ns/{ns}/documents", self.op(o.add_document, "ns", body=True, code=202), "POST"),
            route("/v5/ns/{ns}/documents", self.op(o.list_documents, "ns", status=q("status"), limit=q("limit"),
                                                   offset=q("offset")), "GET"),
            route("/v5/ns/{ns}/documents/{id}", self.op(o.get_document, "ns", "id"), "GET"),
            route("/v5/ns/{ns}/documents/{id}", self.op(o.delete_document, "ns", "id", erase=flag("erase")),
                  "DELETE"),
            route("/v5/ns/{ns}/search", self.op(o.search, "ns", body=True), "POST"),
            route("/v5/ns/{ns}/memories", self.add_memory, "POST"),
            route("/v5/ns/{ns}/memories", self.op(o.list_memories, "ns", as_of=q("asOf"), limit=q("limit"),
                                                  cursor=q("cursor"), history=flag("history")), "GET"),
            route("/v5/ns/{ns}/forget", self.op(o.forget, "ns", body=True), "POST"),
            route("/v5/ns/{ns}/profile", self.op(o.profile, "ns"), "GET"),
            route("/v5/admin/tokens", self.op(o.list_tokens), "GET"),
            route("/v5/admin/tokens", self.op(o.create_token, body=True, code=201), "POST"),
            route("/v5/admin/tokens/{id}", self.op(o.revoke_token, "id"), "DELETE"),
            route("/v5/admin/tokens/{id}/rotate", self.op(o.rotate_token, "id"), "POST"),
            route("/v5/admin/leases", self.op(o.create_lease, body=True, code=201), "POST"),
            route("/v5/admin/leases", self.op(o.list_leases), "GET"),
            route("/v5/admin/leases/{id}", self.op(o.release_lease, "id"), "DELETE"),
            route("/v5/admin/leases/{id}", self.op(o.renew_lease, "id", body=True), "PATCH"),
            route("/v5/admin/lanes", self.op(o.lanes_report), "GET"),
            route("/v3/documents", self.v3_add_document, "POST"),
            route("/v3/search", self.v3_search, "POST"),
            route("/v4/search", self.v4_search, "POST"),
        ]


def create_app(db: DB, embedder, settings, pipeline, lifespan=None, *, lanes: Lanes | None = None,
               leases: Leases | None = None, reranker=None, extra_routes=(), ops: Ops | None = None) -> Starlette:
    lanes = lanes or Lanes(settings)
    leases = leases or Leases(db, lanes)
    ops = ops or Ops(db, settings, pipeline, embedder, reranker=reranker, leases=leases, lanes=lanes)
    app = Starlette(routes=[*API(ops).routes(), *extra_routes], lifespan=lifespan)
    app.state.lanes, app.state.leases, app.state.ops = lanes, leases, ops
    return app
