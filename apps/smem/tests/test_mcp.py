"""The MCP server through the SDK's own client on real transports: stdio (`python -m smem mcp` as a process)
and streamable HTTP (uvicorn on 127.0.0.1), on a real SQLite file and the in-process MiniLM."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import httpx
import httpx2
import pytest
import uvicorn
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from smem import auth
from smem.api import FORBIDDEN
from smem.service import take_lock

APP_SRC = str(Path(__file__).resolve().parent.parent / "src")
TOOLS = {"add_memory", "search", "list_memories", "forget", "list_documents", "who_am_i"}
FERRY = "The ferry to Vaxholm leaves at 9:40 from Strandvägen."
LOCKER = "Bob's locker code is 4711."


def ok(r) -> dict:
    assert not r.is_error, r.content
    return r.structured_content


def refused(r, status: int) -> str:
    assert r.is_error, r.structured_content
    assert r.structured_content["status"] == status, r.structured_content
    return r.content[0].text


async def tools_work(c: Client, settle) -> None:
    """alice's token in namespace alice: every tool, end to end. `settle` plays smem serve's workers."""
    assert {t.name for t in (await c.list_tools()).tools} == TOOLS
    me = ok(await c.call_tool("who_am_i", {}))
    assert (me["admin"], me["namespaces"]) == (False, ["alice"])

    fact = ok(await c.call_tool("add_memory", {"ns": "alice", "content": FERRY}))
    found = ok(await c.call_tool("search", {"ns": "alice", "q": "when does the boat leave?", "limit": 3}))
    assert [r["id"] for r in found["results"]] == [fact["id"]] and found["degraded"] == []

    # A misspelt flag is refused, not ignored (the HTTP API refuses unknown fields too).
    r = await c.call_tool("forget", {"ns": "alice", "content": FERRY, "dry_run": True})
    assert r.is_error and "dry_run" in r.content[0].text
    dry = ok(await c.call_tool("forget", {"ns": "alice", "content": "  the FERRY to vaxholm leaves at 9:40 from "
                                          "strandvägen. ", "dryRun": True}))
    assert dry["dryRun"] is True and [m["id"] for m in dry["forgotten"]] == [fact["id"]]
    found = ok(await c.call_tool("search", {"ns": "alice", "q": "ferry Vaxholm"}))
    assert fact["id"] in [r["id"] for r in found["results"]], "a dry run forgot the fact"

    gone = ok(await c.call_tool("forget", {"ns": "alice", "id": fact["id"]}))
    assert gone["dryRun"] is False and [m["id"] for m in gone["forgotten"]] == [fact["id"]]
    for mode in ("hybrid", "memories"):
        found = ok(await c.call_tool("search", {"ns": "alice", "q": "ferry Vaxholm", "mode": mode}))
        assert fact["id"] not in [r["id"] for r in found["results"]]
    assert "no memory" in refused(await c.call_tool("forget", {"ns": "alice", "id": fact["id"]}), 404)
    assert refused(await c.call_tool("forget", {"ns": "alice"}), 400) == "give exactly one of id and content"

    doc = ok(await c.call_tool("add_memory", {"ns": "alice", "kind": "document", "content": FERRY + "\n\nTickets "
                                              "are sold on board.", "metadata": {"src": "test"}}))
    assert doc["status"] == "queued"
    listed = ok(await c.call_tool("list_documents", {"ns": "alice"}))
    assert [(d["id"], d["status"]) for d in listed["documents"]] == [(doc["id"], "queued")]
    await anyio.to_thread.run_sync(settle)
    listed = ok(await c.call_tool("list_documents", {"ns": "alice", "status": "done"}))
    assert [(d["id"], d["status"]) for d in listed["documents"]] == [(doc["id"], "done")]
    assert listed["documents"][0]["chunks"] == 1 and listed["documents"][0]["metadata"] == {"src": "test"}
    found = ok(await c.call_tool("search", {"ns": "alice", "q": "where are tickets sold?", "mode": "chunks"}))
    assert [r["documentId"] for r in found["results"]] == [doc["id"]]

    # ns left out: the token's one namespace. list_memories pages with a cursor.
    made = [ok(await c.call_tool("add_memory", {"content": "Alice's fact number %d is about %s." % (i, w)}))["id"]
            for i, w in enumerate(("kayaks", "lanterns", "orchards"))]
    seen, cursor = [], None
    while True:
        page = ok(await c.call_tool("list_memories", {"limit": 2, **({"cursor": cursor} if cursor else {})}))
        assert len(page["memories"]) <= 2
        seen += [m["id"] for m in page["memories"]]
        if not (cursor := page["nextCursor"]):
            break
    assert sorted(seen) == sorted(made) and len(seen) == len(set(seen))
    assert "cursor" in refused(await c.call_tool("list_memories", {"cursor": "not-a-cursor"}), 400)


async def scopes_hold(c: Client, svc) -> None:
    """alice's token cannot read or write namespace bob (which exists) or nobody (which does not), through
    any tool, and is told exactly what the HTTP API's 403 says."""
    bob_fact = svc.remember("bob", LOCKER)
    bob_doc = svc.ingest("bob", "Bob's notes: the locker is in the basement.")
    http_403 = svc.call("POST", "/v5/ns/bob/search", "alice", json={"q": "locker"})
    assert http_403.status_code == 403 and http_403.json() == {"error": FORBIDDEN}
    before = svc.db.rows("SELECT id, forgotten_at FROM memories WHERE ns='bob' ORDER BY id")
    for ns in ("bob", "nobody"):
        for tool, args in [("add_memory", {"content": "alice was here"}),
                           ("add_memory", {"content": "alice was here", "kind": "document"}),
                           ("search", {"q": "locker code"}), ("forget", {"content": LOCKER}),
                           ("forget", {"id": bob_fact["id"], "dryRun": True}), ("forget", {"id": bob_fact["id"]}),
                           ("list_documents", {})]:
            r = await c.call_tool(tool, {"ns": ns, **args})
            assert refused(r, 403) == FORBIDDEN, (tool, ns)
            assert [x.text for x in r.content] == [FORBIDDEN]
    assert svc.db.rows("SELECT id, forgotten_at FROM memories WHERE ns='bob' ORDER BY id") == before
    assert svc.db.scalar("SELECT count(*) FROM documents WHERE ns IN ('bob', 'nobody')") == 1
    assert svc.db.scalar("SELECT count(*) FROM memories WHERE ns='nobody'") == 0
    assert [r["id"] for r in svc.search("bob", "locker code", mode="memories")["results"]] == [bob_fact["id"]]
    assert [d["id"] for d in svc.call("GET", "/v5/ns/bob/documents", "bob").json()["documents"]] == [bob_doc]


# -- stdio ---------------------------------------------------------------------------------------------------

def stdio(svc, *args: str, **env: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "smem", "mcp", "--db", str(svc.path), *args],
                                 env={"PYTHONPATH": APP_SRC, **env})


def test_stdio_tools_and_scopes_beside_a_server_holding_the_lock(svc):
    lock = take_lock(str(svc.path))  # as `smem serve` would: `smem mcp` must neither need it nor take it
    try:
        async def main():
            async with Client(stdio(svc, SMEM_TOKEN=svc.tokens["alice"]), read_timeout_seconds=120) as c:
                await tools_work(c, svc.pipeline.run_until_idle)
                await scopes_hold(c, svc)
        anyio.run(main)
    finally:
        os.close(lock)


def test_stdio_refuses_a_missing_or_unknown_token(svc):
    cmd = [sys.executable, "-m", "smem", "mcp", "--db", str(svc.path)]
    env = {k: v for k, v in os.environ.items() if k != "SMEM_TOKEN"} | {"PYTHONPATH": APP_SRC}
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert (r.returncode, r.stdout) == (2, "") and "SMEM_TOKEN" in r.stderr
    r = subprocess.run([*cmd, "--token", "smem_" + "x" * 43], env=env, capture_output=True, text=True, timeout=120,
                       check=False)
    assert (r.returncode, r.stdout) == (2, "") and "unknown or revoked token" in r.stderr


# -- streamable HTTP -----------------------------------------------------------------------------------------

@pytest.fixture
def mcp_url(svc):
    # The service's own app, as `smem serve` runs it: /mcp is mounted by service.build.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(svc.app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield "http://127.0.0.1:%d/mcp" % sock.getsockname()[1]
    server.should_exit = True
    thread.join(timeout=30)
    sock.close()


@contextlib.asynccontextmanager
async def http_client(url: str, token: str | None, mode: str = "auto"):
    headers = {"Authorization": "Bearer " + token} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as h, \
            Client(streamable_http_client(url, http_client=h), mode=mode) as c:
        yield c


@pytest.mark.parametrize("mode", ["legacy", "auto"])  # the initialize handshake, and 2026-07-28 per request
def test_http_tools_and_scopes(svc, mcp_url, mode):
    async def main():
        async with http_client(mcp_url, svc.tokens["alice"], mode) as c:
            await tools_work(c, svc.pipeline.run_until_idle)
            await scopes_hold(c, svc)
        async with http_client(mcp_url, svc.tokens["admin"], mode) as c:
            assert ok(await c.call_tool("who_am_i", {}))["admin"] is True
    anyio.run(main)


def test_http_refuses_a_missing_or_unknown_token(svc, mcp_url):
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "who_am_i", "arguments": {}}}
    accept = {"Accept": "application/json, text/event-stream", "Mcp-Protocol-Version": "2025-06-18"}
    for auth_header in (None, "Bearer smem_unknown", "Basic " + svc.tokens["alice"], svc.tokens["alice"]):
        r = httpx.post(mcp_url, json=call, headers={**accept, **({"Authorization": auth_header} if auth_header
                                                                  else {})}, timeout=60)
        assert (r.status_code, r.json()) == (401, {"error": "missing or unknown bearer token"}), auth_header
    revoked = auth.create(svc.db, ["alice"])
    with svc.db.tx() as c:
        c.execute("UPDATE tokens SET revoked_at='2026-01-01' WHERE hash=?", (auth.digest(revoked),))

    async def main():
        for token in (None, "smem_unknown", revoked):
            with pytest.raises(ExceptionGroup) as e:
                async with http_client(mcp_url, token) as c:
                    await c.call_tool("who_am_i", {})
            assert e.group_contains(MCPError)
    anyio.run(main)
