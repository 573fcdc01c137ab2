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

from smem import __version__, auth
from smem.embed import EmbedderError
from smem.errors import Conflict, NotFound
from smem.ops import ServiceError
from smem.search import MODES

PRINCIPAL = "smem.principal"  # where the /mcp bearer check leaves the token's Principal in the ASGI scope
UNAUTHORIZED = "missing or unknown bearer token"

NS = Annotated[str | None, Field(description="the namespace; may be left out when the token has exactly one")]
TIME = Annotated[str | None, Field(description="ISO-8601 date or time; no zone means UTC")]

INSTRUCTIONS = """Agent memory. add_memory stores a fact (or, with kind="document", queues a document to be
chunked and indexed); search recalls facts and document chunks; list_memories pages through the facts in
force; forget removes a fact (erase: true removes its text for good); list_documents shows ingest status;
who_am_i lists the namespaces this token may use (with one, ns may be left out everywhere)."""


def _given(**fields) -> dict:
    return {k: v for k, v in fields.items() if v is not None}


def _error(status: int, message: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=message)],
                          structured_content={"error": message, "status": status}, is_error=True)


class Tools:
    """Each tool is one smem.ops call, as the HTTP route for it is."""

    def __init__(self, ops, *, token: str | None):
        self.ops, self.db = ops, ops.db
        self.token = token  # stdio only; over HTTP each request brings its own

    def _principal(self, ctx: Context) -> auth.Principal:
        request = ctx.request_context.request
        if request is not None:
            p = request.scope.get(PRINCIPAL)
        else:
            # stdio: looked up on every call, so a token revoked meanwhile stops working at once.
            p = self.token and auth.resolve(self.db, "Bearer " + self.token)
        if not p:
            raise ServiceError(401, UNAUTHORIZED)
        return p

    async def _call(self, ctx: Context, work):
        try:
            return await anyio.to_thread.run_sync(lambda: work(self._principal(ctx)))
        except ServiceError as e:
            return _error(e.status, e.message)
        except (NotFound, Conflict) as e:
            return _error(e.status, str(e))
        except EmbedderError as e:
            return _error(503, "embedder unavailable: %s" % e)

    async def add_memory(
        self, *, content: Annotated[str, Field(description="the fact, or the document's text")], ctx: Context,
        ns: NS = None,
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
        b = _given(content=content, validAt=validAt, metadata=metadata)
        if kind == "document":
            return await self._call(ctx, lambda p: self.ops.add_document(p, ns, _given(**b, customId=customId)))
        return await self._call(ctx, lambda p: self.ops.add_memory(p, ns, _given(**b, supersedes=supersedes)))

    async def search(
        self, *, q: Annotated[str, Field(description="what to recall, in words")], ctx: Context, ns: NS = None,
        mode: Annotated[Literal[MODES], Field(description="facts and chunks, or one kind")] = "hybrid",
        limit: Annotated[int | None, Field(description="at most this many results")] = None,
        budgetTokens: Annotated[int | None, Field(
            description="pack the best results that fit whole in this many tokens (ceil(chars / 4))")] = None,
        asOf: Annotated[str | None, Field(description="world time: the facts valid then (ISO-8601)")] = None,
        rerank: Literal["none", "order"] = "none",
        threshold: Annotated[float | None, Field(description="drop results whose cosine is below (0-1)")] = None,
    ) -> dict[str, Any]:
        """Recall (like POST /v5/ns/{ns}/search): {results: [{id, kind, content, score, ...}], degraded, usedTokens}."""
        b = _given(q=q, mode=mode, limit=limit, asOf=asOf, rerank=rerank, threshold=threshold,
                   budgetTokens=budgetTokens)
        return await self._call(ctx, lambda p: self.ops.search(p, ns, b))

    async def list_memories(
        self, *, ctx: Context, ns: NS = None, asOf: TIME = None,
        limit: Annotated[int, Field(description="at most this many facts (1-1000)")] = 100,
        cursor: Annotated[str | None, Field(description="nextCursor of the page before")] = None,
    ) -> dict[str, Any]:
        """The facts in force (at asOf, default now), newest first, a page at a time:
        {memories: [...], nextCursor (null on the last page)}."""
        return await self._call(ctx, lambda p: self.ops.list_memories(p, ns, as_of=asOf, limit=limit,
                                                                      cursor=cursor))

    async def forget(
        self, *, ctx: Context, ns: NS = None,
        id: Annotated[str | None, Field(description="the fact's id")] = None,
        content: Annotated[str | None, Field(description="or its text (case- and space-insensitive)")] = None,
        dryRun: Annotated[bool, Field(description="only say what would be forgotten")] = False,
        erase: Annotated[bool, Field(description="also remove its text, embedding and history details for good"
                                                 " (a tombstone with the text's hash stays)")] = False,
    ) -> dict[str, Any]:
        """Forget a fact (like POST /v5/ns/{ns}/forget): no search returns it again. {dryRun, forgotten: [...]}."""
        b = _given(id=id, content=content, dryRun=dryRun, erase=erase)
        return await self._call(ctx, lambda p: self.ops.forget(p, ns, b))

    async def list_documents(
        self, *, ctx: Context, ns: NS = None,
        status: Annotated[Literal["queued", "extracting", "indexing", "done", "failed"] | None,
                          Field(description="only documents in this state")] = None,
        limit: Annotated[int, Field(description="1-1000")] = 100, offset: int = 0,
    ) -> dict[str, Any]:
        """The namespace's documents with their ingest status, error and job stages. {documents, total}."""
        return await self._call(ctx, lambda p: self.ops.list_documents(p, ns, status, limit, offset))

    async def who_am_i(self, ctx: Context) -> dict[str, Any]:
        """This token: the namespaces it may use; admin: true means every namespace."""
        return await self._call(ctx, lambda p: {"tokenId": p.token_id, "admin": p.admin,
                                                "namespaces": sorted(p.namespaces), "scopes": sorted(p.scopes)})


def _tool(fn, **hints) -> Tool:
    """As MCPServer.add_tool makes it, but refusing unknown and mistyped arguments as the HTTP API refuses
    unknown and mistyped fields: a misspelt `dryRun` must not be ignored."""
    tool = Tool.from_function(fn, annotations=ToolAnnotations(**hints))
    base = tool.fn_metadata.arg_model
    tool.fn_metadata.arg_model = type(base.__name__, (base,), {"model_config": ConfigDict(
        extra="forbid", strict=True, arbitrary_types_allowed=True)})
    tool.parameters["additionalProperties"] = False
    return tool


def build_server(ops, *, token: str | None = None) -> MCPServer:
    t = Tools(ops, token=token)
    tools = [_tool(t.add_memory, read_only_hint=False, destructive_hint=False), _tool(t.search, read_only_hint=True),
             _tool(t.list_memories, read_only_hint=True),
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


def mcp_routes(ops):
    """([Route("/mcp")], running), on the smem.ops.Ops the HTTP API uses: add the route to the app and enter
    `running()` in its lifespan (`async with running(): yield`); a Mount would not run a sub-app's lifespan."""
    db, settings = ops.db, ops.settings
    server = build_server(ops)
    # Stateless with JSON answers: no session state to leak between tokens, nothing lost on a restart.
    # DNS-rebinding checks off: they would refuse smem serve's own LAN address, and a page a rebinding
    # attack could load has no bearer token to send.
    server.streamable_http_app(
        stateless_http=True, json_response=True, max_request_body_size=6 * settings.max_document_bytes + 65536,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
    manager = server.session_manager
    return [Route("/mcp", _Bearer(db, manager))], manager.run


def run_stdio(ops, token: str) -> int:
    """`smem mcp`: no ingest workers and no DB.lock here; documents added wait for `smem serve`'s workers."""
    if auth.resolve(ops.db, "Bearer " + token) is None:
        print("smem: unknown or revoked token", file=sys.stderr)
        return 2
    build_server(ops, token=token).run("stdio")
    return 0
