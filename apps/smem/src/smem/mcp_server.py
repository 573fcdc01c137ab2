"""smem as an MCP server (the official `mcp` SDK, 2.x): over stdio (`smem mcp`) and streamable HTTP
(`mcp_routes`, at /mcp). Every tool takes the namespace and obeys the token's scope exactly as the
HTTP API does: it calls the same checks and functions the HTTP handlers call."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Literal

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.routing import Route

from smem import __version__, api, auth, memories
from smem.api import HTTPError
from smem.embed import EmbedderError
from smem.errors import Conflict, NotFound
from smem.search import MODES, search

PRINCIPAL = "smem.principal"  # where the /mcp bearer check leaves the token's Principal in the ASGI scope
UNAUTHORIZED = "missing or unknown bearer token"

NS = Annotated[str, Field(description="the namespace; the token must cover it")]
TIME = Annotated[str | None, Field(description="ISO-8601 date or time; no zone means UTC")]

INSTRUCTIONS = """Agent memory. add_memory stores a fact (or, with kind="document", queues a document to be
chunked and indexed); search recalls facts and document chunks; forget removes a fact; list_documents shows
ingest status; who_am_i lists the namespaces this token may use."""


def _given(**fields) -> dict:
    return {k: v for k, v in fields.items() if v is not None}


def _error(status: int, message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)],
                          structured_content={"error": message, "status": status}, is_error=True)


class Tools:
    def __init__(self, db, pipeline, embedder, settings, *, reranker, token: str | None):
        self.db, self.pipeline, self.embedder, self.settings, self.reranker = db, pipeline, embedder, settings, reranker
        self.token = token  # stdio only; over HTTP each request brings its own

    def _principal(self, ctx: Context) -> auth.Principal:
        request = ctx.request_context.request
        if request is not None:
            p = request.scope.get(PRINCIPAL)
        else:
            # stdio: looked up on every call, so a token revoked meanwhile stops working at once.
            p = self.token and auth.resolve(self.db, "Bearer " + self.token)
        if not p:
            raise HTTPError(401, UNAUTHORIZED)
        return p

    async def _call(self, ctx: Context, ns: str | None, work):
        def run():
            p = self._principal(ctx)
            if ns is not None:
                api.check_ns(p, ns)
            return work(p)
        try:
            return await anyio.to_thread.run_sync(run)
        except HTTPError as e:
            return _error(e.status, e.message)
        except (NotFound, Conflict) as e:
            return _error(e.status, str(e))
        except EmbedderError as e:
            return _error(503, "embedder unavailable: %s" % e)

    def _size(self, content: str) -> None:
        if len(content.encode()) > self.settings.max_document_bytes:
            raise HTTPError(413, "content over max_document_bytes (%d)" % self.settings.max_document_bytes)

    async def add_memory(
        self, *, ns: NS, content: Annotated[str, Field(description="the fact, or the document's text")], ctx: Context,
        kind: Annotated[Literal["fact", "document"], Field(
            description="fact: stored and searchable at once (201-like; duplicate: true if already known). "
                        "document: queued for chunking and indexing by `smem serve`")] = "fact",
        validAt: TIME = None,
        supersedes: Annotated[str | None, Field(description="fact only: the id of the fact this one replaces")] = None,
        metadata: dict[str, Any] | None = None,
        customId: Annotated[str | None, Field(
            description="document only: the caller's key; the same customId again replaces the document")] = None,
    ) -> dict[str, Any]:
        """Remember a fact (like POST /v5/ns/{ns}/memories) or add a document (like POST /v5/ns/{ns}/documents)."""
        def work(_):
            b = _given(content=content, validAt=validAt, supersedes=supersedes, metadata=metadata, customId=customId)
            if kind == "document":
                api.check_body(b, api.DOCUMENT)
                if not content.strip():
                    raise HTTPError(400, "content is empty")
                self._size(content)
                doc_id, status = self.pipeline.enqueue(ns, content, b.get("metadata") or {}, b.get("customId"),
                                                       api._time(validAt, "validAt"))
                return {"id": doc_id, "status": status}
            api.check_body(b, api.MEMORY)
            self._size(content)
            return memories.add(self.db, self.embedder, self.settings.near_duplicate, ns, content,
                                valid_at=api._time(validAt, "validAt"), supersedes=supersedes, metadata=metadata)
        return await self._call(ctx, ns, work)

    async def search(
        self, *, ns: NS, q: Annotated[str, Field(description="what to recall, in words")], ctx: Context,
        mode: Annotated[Literal[MODES], Field(description="facts and chunks, or one kind")] = "hybrid",
        limit: Annotated[int | None, Field(description="at most this many results")] = None,
        budgetTokens: Annotated[int | None, Field(
            description="pack the best results that fit whole in this many tokens (ceil(chars / 4))")] = None,
        asOf: Annotated[str | None, Field(description="world time: the facts valid then (ISO-8601)")] = None,
        rerank: Literal["none", "order"] = "none",
        threshold: Annotated[float | None, Field(description="drop results whose cosine is below (0-1)")] = None,
    ) -> dict[str, Any]:
        """Recall (like POST /v5/ns/{ns}/search): {results: [{id, kind, content, score, ...}], degraded, usedTokens}."""
        def work(_):
            api.check_body(_given(q=q, mode=mode, limit=limit, asOf=asOf, rerank=rerank, threshold=threshold,
                                  budgetTokens=budgetTokens), api.SEARCH)
            if limit is not None and limit > self.settings.max_limit:
                raise HTTPError(400, "limit: at most %d" % self.settings.max_limit)
            return search(self.db, self.embedder, self.settings, ns, q, mode=mode, limit=limit,
                          as_of=api._time(asOf, "asOf"), rerank=rerank, threshold=threshold,
                          budget_tokens=budgetTokens, reranker=self.reranker)
        return await self._call(ctx, ns, work)

    async def forget(
        self, *, ns: NS, ctx: Context,
        id: Annotated[str | None, Field(description="the fact's id")] = None,
        content: Annotated[str | None, Field(description="or its text (case- and space-insensitive)")] = None,
        dryRun: Annotated[bool, Field(description="only say what would be forgotten")] = False,
    ) -> dict[str, Any]:
        """Forget a fact (like POST /v5/ns/{ns}/forget): no search returns it again. {dryRun, forgotten: [...]}."""
        def work(_):
            b = api.check_body(_given(id=id, content=content, dryRun=dryRun), api.FORGET)
            if ("id" in b) == ("content" in b):
                raise HTTPError(400, "give exactly one of id and content")
            return memories.forget(self.db, ns, id, content, dryRun)
        return await self._call(ctx, ns, work)

    async def list_documents(
        self, *, ns: NS, ctx: Context,
        status: Annotated[Literal["queued", "extracting", "indexing", "done", "failed"] | None,
                          Field(description="only documents in this state")] = None,
        limit: int = 100, offset: int = 0,
    ) -> dict[str, Any]:
        """The namespace's documents with their ingest status, error and job stages. {documents, total}."""
        return await self._call(ctx, ns, lambda _: api.documents_page(self.db, ns, status, limit, offset))

    async def who_am_i(self, ctx: Context) -> dict[str, Any]:
        """This token: the namespaces it may use; admin: true means every namespace."""
        return await self._call(ctx, None, lambda p: {"tokenId": p.token_id, "admin": p.admin,
                                                      "namespaces": sorted(p.namespaces)})


def _tool(fn, **hints) -> Tool:
    """As MCPServer.add_tool makes it, but refusing unknown and mistyped arguments as the HTTP API refuses
    unknown and mistyped fields: a misspelt `dryRun` must not be ignored."""
    tool = Tool.from_function(fn, annotations=ToolAnnotations(**hints))
    base = tool.fn_metadata.arg_model
    tool.fn_metadata.arg_model = type(base.__name__, (base,), {"model_config": ConfigDict(
        extra="forbid", strict=True, arbitrary_types_allowed=True)})
    tool.parameters["additionalProperties"] = False
    return tool


def build_server(db, pipeline, embedder, settings, *, reranker=None, token: str | None = None) -> MCPServer:
    t = Tools(db, pipeline, embedder, settings, reranker=reranker, token=token)
    tools = [_tool(t.add_memory, read_only_hint=False, destructive_hint=False), _tool(t.search, read_only_hint=True),
             _tool(t.forget, read_only_hint=False, destructive_hint=True),
             _tool(t.list_documents, read_only_hint=True), _tool(t.who_am_i, read_only_hint=True)]
    return MCPServer("smem", version=__version__, instructions=INSTRUCTIONS, tools=tools, log_level="WARNING")


class _Bearer:
    """The /mcp endpoint: every request needs a live token, as on the HTTP API."""

    def __init__(self, db, manager):
        self.db, self.manager = db, manager

    async def __call__(self, scope, receive, send):
        p = await run_in_threadpool(auth.resolve, self.db, Headers(scope=scope).get("authorization"))
        if p is None:
            await JSONResponse({"error": UNAUTHORIZED}, 401, {"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        scope[PRINCIPAL] = p
        await self.manager.handle_request(scope, receive, send)


def mcp_routes(db, pipeline, embedder, settings, reranker=None):
    """([Route("/mcp")], running), given what api.API is given: add the route to the app and enter
    `running()` in its lifespan (`async with running(): yield`); a Mount would not run a sub-app's lifespan."""
    server = build_server(db, pipeline, embedder, settings, reranker=reranker)
    # Stateless with JSON answers: no session state to leak between tokens, nothing lost on a restart.
    # DNS-rebinding checks off: they would refuse smem serve's own LAN address, and a page a rebinding
    # attack could load has no bearer token to send.
    server.streamable_http_app(
        stateless_http=True, json_response=True, max_request_body_size=6 * settings.max_document_bytes + 65536,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    manager = server.session_manager
    return [Route("/mcp", _Bearer(db, manager))], manager.run


def run_stdio(pipeline, settings, token: str, embedder=None, reranker=None) -> int:
    """`smem mcp`: no ingest workers and no DB.lock here; documents added wait for `smem serve`'s workers."""
    if auth.resolve(pipeline.db, "Bearer " + token) is None:
        print("smem: unknown or revoked token", file=sys.stderr)
        return 2
    build_server(pipeline.db, pipeline, embedder or pipeline.embedder, settings, reranker=reranker,
                 token=token).run("stdio")
    return 0
