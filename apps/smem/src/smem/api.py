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
SEARCH = _schema({"q": {"type": "string", "minLength": 1}, "mode": {"enum": list(MODES)},
                  "limit": {"type": "integer", "minimum": 1}, "asOf": _TIME, "rerank": {"enum": ["none", "order"]},
                  "threshold": {"type": "number", "minimum": 0, "maximum": 1},
                  "budgetTokens": {"type": "integer", "minimum": 1}}, ["q"])
MEMORY = _schema({"content": {"type": "string", "minLength": 1}, "validAt": _TIME,
                  "supersedes": {"type": "string", "minLength": 1}, "metadata": {"type": "object"}}, ["content"])
FORGET = _schema({"id": {"type": "string", "minLength": 1}, "content": {"type": "string", "minLength": 1},
                  "dryRun": {"type": "boolean"}})

FORBIDDEN = "forbidden: this token has no access to that namespace"


def _time(value, field: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise HTTPError(400, "%s: not an ISO-8601 date or time: %r" % (field, value)) from None


class API:
    def __init__(self, db: DB, embedder, settings, pipeline):
        self.db, self.embedder, self.settings, self.pipeline = db, embedder, settings, pipeline

    # -- plumbing ------------------------------------------------------------------------
    async def _principal(self, request: Request) -> auth.Principal:
        p = await run_in_threadpool(auth.resolve, self.db, request.headers.get("authorization"))
        if p is None:
            raise HTTPError(401, "missing or unknown bearer token")
        return p

    async def _ns(self, request: Request) -> str:
        p = await self._principal(request)
        ns = request.path_params["ns"]
        # One answer for a namespace the token lacks, whether or not it exists.
        if not p.allows(ns):
            raise HTTPError(403, FORBIDDEN)
        if not auth.NS_RE.match(ns):
            raise HTTPError(400, "bad namespace name")
        return ns

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
        errors = sorted(validator.iter_errors(body), key=lambda e: list(e.path))
        if errors:
            e = errors[0]
            where = "/".join(str(p) for p in e.path)
            raise HTTPError(400, "%s%s" % (where + ": " if where else "", e.message))
        return body

    def wrap(self, handler):
        async def endpoint(request: Request):
            try:
                return await handler(request)
            except HTTPError as e:
                return JSONResponse({"error": e.message}, status_code=e.status)
            except (NotFound, Conflict) as e:
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
        body = await self._body(request, DOCUMENT)
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
        job = self.db.one("SELECT stage, state, attempts, stages FROM jobs WHERE document_id=?", (d["id"],))
        out = {"id": d["id"], "status": d["status"], "error": d["error"], "customId": d["custom_id"],
               "metadata": json.loads(d["metadata"]), "validAt": d["valid_at"], "createdAt": d["created_at"],
               "updatedAt": d["updated_at"],
               "chunks": self.db.scalar("SELECT count(*) FROM chunks WHERE document_id=?", (d["id"],))}
        if job:
            out["job"] = {"stage": job["stage"], "state": job["state"], "attempts": job["attempts"],
                          "stages": json.loads(job["stages"])}
        return out

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
            limit = min(int(request.query_params.get("limit", 100)), 1000)
            offset = int(request.query_params.get("offset", 0))
        except ValueError:
            raise HTTPError(400, "limit and offset are integers") from None
        status = request.query_params.get("status")

        def run():
            where, params = "ns=?", [ns]
            if status:
                where += " AND status=?"
                params.append(status)
            rows = self.db.rows("SELECT * FROM documents WHERE %s ORDER BY created_at, id LIMIT ? OFFSET ?" % where,
                                (*params, limit, offset))
            return {"documents": [self._doc(d) for d in rows],
                    "total": self.db.scalar("SELECT count(*) FROM documents WHERE %s" % where, params)}
        return JSONResponse(await run_in_threadpool(run))

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
        b = await self._body(request, SEARCH)
        limit = b.get("limit")
        if limit is not None and limit > self.settings.max_limit:
            raise HTTPError(400, "limit: at most %d" % self.settings.max_limit)
        as_of = _time(b.get("asOf"), "asOf")
        out = await run_in_threadpool(lambda: search(
            self.db, self.embedder, self.settings, ns, b["q"], mode=b.get("mode", "hybrid"), limit=limit,
            as_of=as_of, rerank=b.get("rerank", "none"), threshold=b.get("threshold"),
            budget_tokens=b.get("budgetTokens")))
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
        ]


def create_app(db: DB, embedder, settings, pipeline, lifespan=None) -> Starlette:
    return Starlette(routes=API(db, embedder, settings, pipeline).routes(), lifespan=lifespan)
