"""The HTTP API, Supermemory-v5 shaped, on Starlette."""

from __future__ import annotations

import json
import logging

from jsonschema import Draft202012Validator
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from smem import __version__, auth, memories
from smem.db import DB, parse_time
from smem.embed import EmbedderError
from smem.errors import Conflict, NotFound
from smem.lanes import Lanes
from smem.leases import BadLease, Leases
from smem.search import MODES, search

log = logging.getLogger("smem.api")


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _schema(props: dict, required=()) -> Draft202012Validator:
    return Draft202012Validator({"type": "object", "additionalProperties": False, "properties": props,
                                 "required": list(required)})


_TIME = {"type": "string", "minLength": 1}
DOCUMENT = _schema({"content": {"type": "string"}, "metadata": {"type": "object"},
                    "customId": {"type": "string", "minLength": 1, "maxLength": 255}, "validAt": _TIME}, ["content"])
_SEARCH = {"q": {"type": "string", "minLength": 1}, "mode": {"enum": list(MODES)},
           "limit": {"type": "integer", "minimum": 1}, "asOf": _TIME, "rerank": {"enum": ["none", "order"]},
           "threshold": {"type": "number", "minimum": 0, "maximum": 1},
           "budgetTokens": {"type": "integer", "minimum": 1}}
SEARCH = _schema(_SEARCH, ["q"])
MEMORY = _schema({"content": {"type": "string", "minLength": 1}, "validAt": _TIME,
                  "supersedes": {"type": "string", "minLength": 1}, "metadata": {"type": "object"}}, ["content"])
FORGET = _schema({"id": {"type": "string", "minLength": 1}, "content": {"type": "string", "minLength": 1},
                  "dryRun": {"type": "boolean"}})

LEASE = _schema({"nodes": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                 "holder": {"type": "string", "minLength": 1, "maxLength": 200},
                 "ttlSeconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 30 * 86400}},
                ["nodes", "holder", "ttlSeconds"])
RENEW = _schema({"ttlSeconds": LEASE.schema["properties"]["ttlSeconds"]}, ["ttlSeconds"])

# Supermemory's /v3 and /v4 shapes: the namespace is the one container tag; rerank may be a boolean there.
_TAGS = {"type": "array", "items": {"type": "string"}}
_COMPAT_SEARCH = {**_SEARCH, "rerank": {"enum": ["none", "order", True, False]}}
V3_DOCUMENT = _schema({"content": {"type": "string"}, "containerTags": _TAGS, "metadata": {"type": "object"},
                       "customId": {"type": "string", "minLength": 1, "maxLength": 255}}, ["content", "containerTags"])
V3_SEARCH = _schema({**_COMPAT_SEARCH, "containerTags": _TAGS}, ["q", "containerTags"])
V4_SEARCH = _schema({**_COMPAT_SEARCH, "containerTag": {"type": "string"}}, ["q", "containerTag"])

FORBIDDEN = "forbidden: this token has no access to that namespace"
ADMIN_ONLY = "forbidden: this needs an admin token"


def check_ns(p: auth.Principal, ns: str) -> str:
    # One answer for a namespace the token lacks, whether or not it exists.
    if not p.allows(ns):
        raise HTTPError(403, FORBIDDEN)
    if not auth.NS_RE.match(ns):
        raise HTTPError(400, "bad namespace name")
    return ns


def check_body(body, validator: Draft202012Validator):
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path)
        raise HTTPError(400, "%s%s" % (where + ": " if where else "", e.message))
    return body


def document_view(db: DB, d: dict) -> dict:
    job = db.one("SELECT stage, state, attempts, stages FROM jobs WHERE document_id=?", (d["id"],))
    out = {"id": d["id"], "status": d["status"], "error": d["error"], "customId": d["custom_id"],
           "metadata": json.loads(d["metadata"]), "validAt": d["valid_at"], "createdAt": d["created_at"],
           "updatedAt": d["updated_at"],
           "chunks": db.scalar("SELECT count(*) FROM chunks WHERE document_id=?", (d["id"],))}
    if job:
        out["job"] = {"stage": job["stage"], "state": job["state"], "attempts": job["attempts"],
                      "stages": json.loads(job["stages"])}
    return out


def documents_page(db: DB, ns: str, status: str | None, limit: int, offset: int) -> dict:
    where, params = "ns=?", [ns]
    if status:
        where += " AND status=?"
        params.append(status)
    rows = db.rows("SELECT * FROM documents WHERE %s ORDER BY created_at, id LIMIT ? OFFSET ?" % where,
                   (*params, min(limit, 1000), offset))
    return {"documents": [document_view(db, d) for d in rows],
            "total": db.scalar("SELECT count(*) FROM documents WHERE %s" % where, params)}


def _compat_search(b: dict, mode: str) -> dict:
    if isinstance(b.get("rerank"), bool):
        b["rerank"] = "order" if b["rerank"] else "none"
    return {"mode": mode, **b}


def _time(value, field: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise HTTPError(400, "%s: not an ISO-8601 date or time: %r" % (field, value)) from None


class API:
    def __init__(self, db: DB, embedder, settings, pipeline, *, lanes: Lanes | None = None,
                 leases: Leases | None = None, reranker=None):
        self.db, self.embedder, self.settings, self.pipeline = db, embedder, settings, pipeline
        self.lanes = lanes or Lanes(settings)
        self.leases = leases or Leases(db, self.lanes)
        self.reranker = reranker

    # -- plumbing ------------------------------------------------------------------------
    async def _principal(self, request: Request) -> auth.Principal:
        p = await run_in_threadpool(auth.resolve, self.db, request.headers.get("authorization"))
        if p is None:
            raise HTTPError(401, "missing or unknown bearer token")
        return p

    async def _ns(self, request: Request) -> str:
        return check_ns(await self._principal(request), request.path_params["ns"])

    async def _admin(self, request: Request) -> None:
        if not (await self._principal(request)).admin:
            raise HTTPError(403, ADMIN_ONLY)

    async def _body(self, request: Request, validator: Draft202012Validator) -> dict:
        # JSON can escape one byte of content as six (\u00e9): the body may be that much larger.
        cap = 6 * self.settings.max_document_bytes + 65536
        if int(request.headers.get("content-length") or 0) > cap:
            raise HTTPError(413, "request body over %d bytes" % cap)
        raw = bytearray()
        async for part in request.stream():
            raw += part
            if len(raw) > cap:
                raise HTTPError(413, "request body over %d bytes" % cap)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise HTTPError(400, "malformed JSON: %s" % e) from None
        return check_body(body, validator)

    def wrap(self, handler):
        async def endpoint(request: Request):
            try:
                return await handler(request)
            except HTTPError as e:
                return JSONResponse({"error": e.message}, status_code=e.status)
            except (NotFound, Conflict, BadLease) as e:
                return JSONResponse({"error": str(e)}, status_code=e.status)
            except EmbedderError as e:
                return JSONResponse({"error": "embedder unavailable: %s" % e}, status_code=503)
        return endpoint

    # -- routes ----------------------------------------------------------------------------
    async def healthz(self, request):
        return JSONResponse({"ok": True, "version": __version__, "schema": self.db.version,
                             "embedder": self.embedder.name})

    async def namespaces(self, request):
        p = await self._principal(request)

        def run():
            seen = {r["ns"] for r in self.db.rows("SELECT ns FROM documents UNION SELECT ns FROM memories")}
            names = sorted(seen | p.namespaces) if p.admin else sorted(p.namespaces)
            return [{"name": n, "documents": self.db.scalar("SELECT count(*) FROM documents WHERE ns=?", (n,)),
                     "memories": self.db.scalar("SELECT count(*) FROM memories WHERE ns=? AND forgotten_at IS NULL"
                                                " AND valid_to IS NULL AND indexed=1", (n,))} for n in names]
        return JSONResponse({"namespaces": await run_in_threadpool(run)})

    async def add_document(self, request):
        ns = await self._ns(request)
        return await self._add_document(ns, await self._body(request, DOCUMENT))

    async def _add_document(self, ns: str, body: dict):
        content = body["content"]
        if not content.strip():
            raise HTTPError(400, "content is empty")
        if len(content.encode()) > self.settings.max_document_bytes:
            raise HTTPError(413, "content over max_document_bytes (%d)" % self.settings.max_document_bytes)
        valid_at = _time(body.get("validAt"), "validAt")
        doc_id, status = await run_in_threadpool(self.pipeline.enqueue, ns, content, body.get("metadata") or {},
                                                 body.get("customId"), valid_at)
        return JSONResponse({"id": doc_id, "status": status}, status_code=202)

    def _doc(self, d: dict) -> dict:
        return document_view(self.db, d)

    async def get_document(self, request):
        ns = await self._ns(request)

        def run():
            d = self.db.one("SELECT * FROM documents WHERE id=? AND ns=?", (request.path_params["id"], ns))
            return self._doc(d) if d else None
        d = await run_in_threadpool(run)
        if d is None:
            raise HTTPError(404, "no document %s in this namespace" % request.path_params["id"])
        return JSONResponse(d)

    async def list_documents(self, request):
        ns = await self._ns(request)
        try:
            limit = int(request.query_params.get("limit", 100))
            offset = int(request.query_params.get("offset", 0))
        except ValueError:
            raise HTTPError(400, "limit and offset are integers") from None
        status = request.query_params.get("status")
        return JSONResponse(await run_in_threadpool(documents_page, self.db, ns, status, limit, offset))

    async def delete_document(self, request):
        ns = await self._ns(request)
        doc_id = request.path_params["id"]

        def run():
            with self.db.tx() as c:
                if not self.db.one("SELECT 1 FROM documents WHERE id=? AND ns=?", (doc_id, ns)):
                    return False
                self.pipeline._drop_index(c, doc_id)
                c.execute("DELETE FROM documents WHERE id=?", (doc_id,))  # chunks and jobs cascade
            return True
        if not await run_in_threadpool(run):
            raise HTTPError(404, "no document %s in this namespace" % doc_id)
        return JSONResponse({"id": doc_id, "deleted": True})

    async def search(self, request):
        ns = await self._ns(request)
        return await self._search(ns, await self._body(request, SEARCH))

    async def _search(self, ns: str, b: dict):
        limit = b.get("limit")
        if limit is not None and limit > self.settings.max_limit:
            raise HTTPError(400, "limit: at most %d" % self.settings.max_limit)
        as_of = _time(b.get("asOf"), "asOf")
        out = await run_in_threadpool(lambda: search(
            self.db, self.embedder, self.settings, ns, b["q"], mode=b.get("mode", "hybrid"), limit=limit,
            as_of=as_of, rerank=b.get("rerank", "none"), threshold=b.get("threshold"),
            budget_tokens=b.get("budgetTokens"), reranker=self.reranker))
        return JSONResponse(out)

    async def add_memory(self, request):
        ns = await self._ns(request)
        b = await self._body(request, MEMORY)
        if len(b["content"].encode()) > self.settings.max_document_bytes:
            raise HTTPError(413, "content over max_document_bytes (%d)" % self.settings.max_document_bytes)
        valid_at = _time(b.get("validAt"), "validAt")
        m = await run_in_threadpool(lambda: memories.add(
            self.db, self.embedder, self.settings.near_duplicate, ns, b["content"], valid_at=valid_at,
            supersedes=b.get("supersedes"), metadata=b.get("metadata")))
        return JSONResponse(m, status_code=200 if m.get("duplicate") else 201)

    async def list_memories(self, request):
        ns = await self._ns(request)
        as_of = _time(request.query_params.get("asOf"), "asOf")
        rows = await run_in_threadpool(memories.list_at, self.db, ns, as_of, 1000)
        if request.query_params.get("history") == "1":
            for m in rows:
                m["history"] = await run_in_threadpool(memories.history, self.db, ns, m["id"])
        return JSONResponse({"memories": rows, "asOf": as_of})

    async def forget(self, request):
        ns = await self._ns(request)
        b = await self._body(request, FORGET)
        if ("id" in b) == ("content" in b):
            raise HTTPError(400, "give exactly one of id and content")
        out = await run_in_threadpool(memories.forget, self.db, ns, b.get("id"), b.get("content"),
                                      b.get("dryRun", False))
        return JSONResponse(out)

    async def profile(self, request):
        ns = await self._ns(request)
        return JSONResponse(await run_in_threadpool(memories.profile, self.db, ns))

    # -- /v3, /v4: Supermemory's shapes onto the v5 handlers ---------------------------------
    async def v3_add_document(self, request):
        p = await self._principal(request)
        b = await self._body(request, V3_DOCUMENT)
        return await self._add_document(self._tag(p, b.pop("containerTags")), b)

    async def v3_search(self, request):
        p = await self._principal(request)
        b = await self._body(request, V3_SEARCH)
        return await self._search(self._tag(p, b.pop("containerTags")), _compat_search(b, "chunks"))

    async def v4_search(self, request):
        p = await self._principal(request)
        b = await self._body(request, V4_SEARCH)
        return await self._search(self._tag(p, [b.pop("containerTag")]), _compat_search(b, "memories"))

    @staticmethod
    def _tag(p: auth.Principal, tags: list[str]) -> str:
        if len(tags) != 1:
            raise HTTPError(400, "containerTags: exactly one container tag (the namespace), got %d" % len(tags))
        return check_ns(p, tags[0])

    # -- admin: leases and lanes -------------------------------------------------------------
    async def create_lease(self, request):
        await self._admin(request)
        b = await self._body(request, LEASE)
        lease = await run_in_threadpool(self.leases.create, b["nodes"], b["holder"], b["ttlSeconds"])
        return JSONResponse(lease, status_code=201)

    async def list_leases(self, request):
        await self._admin(request)
        return JSONResponse({"leases": await run_in_threadpool(self.leases.live)})

    async def renew_lease(self, request):
        await self._admin(request)
        b = await self._body(request, RENEW)
        return JSONResponse(await run_in_threadpool(self.leases.renew, request.path_params["id"], b["ttlSeconds"]))

    async def delete_lease(self, request):
        await self._admin(request)
        return JSONResponse(await run_in_threadpool(self.leases.release, request.path_params["id"]))

    async def admin_lanes(self, request):
        await self._admin(request)
        return JSONResponse({"lanes": self.lanes.report()})

    def routes(self) -> list[Route]:
        w = self.wrap
        return [
            Route("/healthz", w(self.healthz), methods=["GET"]),
            Route("/v5/namespaces", w(self.namespaces), methods=["GET"]),
            Route("/v5/ns/{ns}/documents", w(self.add_document), methods=["POST"]),
            Route("/v5/ns/{ns}/documents", w(self.list_documents), methods=["GET"]),
            Route("/v5/ns/{ns}/documents/{id}", w(self.get_document), methods=["GET"]),
            Route("/v5/ns/{ns}/documents/{id}", w(self.delete_document), methods=["DELETE"]),
            Route("/v5/ns/{ns}/search", w(self.search), methods=["POST"]),
            Route("/v5/ns/{ns}/memories", w(self.add_memory), methods=["POST"]),
            Route("/v5/ns/{ns}/memories", w(self.list_memories), methods=["GET"]),
            Route("/v5/ns/{ns}/forget", w(self.forget), methods=["POST"]),
            Route("/v5/ns/{ns}/profile", w(self.profile), methods=["GET"]),
            Route("/v5/admin/leases", w(self.create_lease), methods=["POST"]),
            Route("/v5/admin/leases", w(self.list_leases), methods=["GET"]),
            Route("/v5/admin/leases/{id}", w(self.delete_lease), methods=["DELETE"]),
            Route("/v5/admin/leases/{id}", w(self.renew_lease), methods=["PATCH"]),
            Route("/v5/admin/lanes", w(self.admin_lanes), methods=["GET"]),
            Route("/v3/documents", w(self.v3_add_document), methods=["POST"]),
            Route("/v3/search", w(self.v3_search), methods=["POST"]),
            Route("/v4/search", w(self.v4_search), methods=["POST"]),
        ]


def create_app(db: DB, embedder, settings, pipeline, lifespan=None, *, lanes: Lanes | None = None,
               leases: Leases | None = None, reranker=None, extra_routes=()) -> Starlette:
    api = API(db, embedder, settings, pipeline, lanes=lanes, leases=leases, reranker=reranker)
    app = Starlette(routes=[*api.routes(), *extra_routes], lifespan=lifespan)
    app.state.lanes, app.state.leases = api.lanes, api.leases
    return app
