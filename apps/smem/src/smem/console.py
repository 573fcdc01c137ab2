"""The web console: one static page at /console/ (HTML, CSS, JS shipped in smem/console/, no build step).

The page holds no data and needs no token to be served. It asks for a token (typed in once, kept in the
tab's sessionStorage; or given as ``#token=...`` in the fragment, which it moves there and takes out of
the address bar), then calls the public HTTP API from the browser with ``Authorization: Bearer``.
Wire it with ``routes=[*API(...).routes(), *console_routes()]``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from starlette.routing import BaseRoute, Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC = Path(str(resources.files("smem") / "console"))

# The page loads only its own files and talks only to this origin; it is never framed, never cached.
HEADERS = [
    (b"content-security-policy", b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self';"
                                 b" connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
]


class _WithHeaders:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)
        await self.app(scope, receive, send_with)


def console_routes(directory: Path = STATIC) -> list[BaseRoute]:
    """The console at /console/ (GET and HEAD only; /console redirects there)."""
    return [Mount("/console", app=_WithHeaders(StaticFiles(directory=directory, html=True)), name="console")]
