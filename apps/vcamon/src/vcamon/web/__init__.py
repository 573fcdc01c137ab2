"""The collector's web page: per-node temperature and power charts (uPlot, bundled) over a chosen range.

Read-only: it answers GET and nothing else (any other method is 405 and
changes nothing). With a token configured every request must carry it:
``Authorization: Bearer <token>``, or the ``vcamon_token`` cookie that the page
sets when any of its addresses is opened once with ``?token=<token>`` (then
redirected to the same address without it: the token stays in no address, no
history, no log). Without one, 401.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

from .. import fleet
from ..auth import bearer, check_token, same
from ..net import bind_address, is_loopback
from ..store import Store

LOG = logging.getLogger("vcamon.web")
STATIC = Path(str(resources.files(__name__) / "static"))
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
SPAN = re.compile(r"^(\d+)([smhdw])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DEFAULT_LISTEN = "127.0.0.1:9480"
COOKIE = "vcamon_token"
TOKEN_IN_QUERY = re.compile(r"(token=)[^&\s]*")


def parse_span(text):
    """'30m', '6h', '7d', '2w' -> seconds; anything else is a ValueError that says what is accepted."""
    m = SPAN.match(str(text).strip())
    if not m:
        raise ValueError("%r is not a span: use a number and one of s, m, h, d, w (e.g. 1d)" % text)
    return int(m.group(1)) * UNITS[m.group(2)]


def static_file(root, rel):
    """The file under root that rel names, or None: whatever rel holds ('..', a link out), it stays under root."""
    top = root.resolve()
    item = top.joinpath(*[p for p in rel.split("/") if p]).resolve()
    if item == top or not item.is_relative_to(top) or not item.is_file():
        return None
    return item


def make_handler(db_path, token=None, static_root=STATIC):
    local = threading.local()
    static_root = Path(static_root)

    def store():
        if getattr(local, "store", None) is None:
            local.store = Store(db_path)
        return local.store

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body, ctype, headers=()):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def _json(self, obj, code=200):
            self._send(code, json.dumps(obj).encode(), "application/json")

        def _cookie_token(self):
            try:
                morsel = SimpleCookie(self.headers.get("Cookie", "")).get(COOKIE)
            except CookieError:
                return None
            return morsel.value if morsel else None

        def _authorized(self, q):
            """No token configured: open. Otherwise the header, the cookie or ?token= must match."""
            if not token:
                return True
            return same(bearer(self.headers), token) or same(self._cookie_token(), token) or same(q.get("token"), token)

        def _refuse(self):
            self._send(401, b"vcamon: a token is required (Authorization: Bearer <token>, "
                       b"or open /?token=<token> once in a browser)\n", "text/plain; charset=utf-8",
                       [("WWW-Authenticate", 'Bearer realm="vcamon"')])

        def do_GET(self):
            url = urlparse(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            if not self._authorized(q):
                self._refuse()
                return
            try:
                if "token" in q:
                    # A link with the token, to any address: keep it in a cookie for the page's requests,
                    # and take it out of the address (the bar, the history, a proxy's log).
                    rest = urlencode({k: v for k, v in q.items() if k != "token"})
                    headers = [("Location", url.path + ("?" + rest if rest else ""))]
                    if token:
                        headers.append(("Set-Cookie", "%s=%s; Path=/; HttpOnly; SameSite=Strict" % (COOKIE, token)))
                    self._send(303, b"", "text/plain", headers)
                    return
                if url.path in ("/", "/index.html"):
                    self._send(200, (static_root / "index.html").read_bytes(), TYPES[".html"])
                elif url.path.startswith("/static/"):
                    self._static(url.path[len("/static/"):])
                elif url.path == "/api/nodes":
                    dead, hosts = fleet.dead_nodes(store()), fleet.vca_hosts(store())
                    rows = store().status()
                    nodes = [dict(n, dead=n["node"] in dead) for n in fleet.label_nodes(rows, hosts, dead)]
                    self._json({"now": int(time.time()), "round_at": store().last_round(), "nodes": nodes,
                                "hosts": fleet.host_states(rows, hosts, dead)})
                elif url.path == "/api/fleet":
                    self._json(fleet.view(store()))
                elif url.path == "/api/chart":
                    now = int(time.time())
                    end = int(q.get("to") or now)
                    start = int(q["from"]) if q.get("from") else end - parse_span(q.get("range", "1h"))
                    if not q.get("node"):
                        raise ValueError("node is required")
                    self._json(store().chart(q["node"], start, end))
                else:
                    self.send_error(404)
            except ValueError as exc:
                self._json({"error": str(exc)}, 400)

        def _read_only(self):
            """Nothing here changes data: every other method is refused (after the token check)."""
            if not self._authorized({k: v[-1] for k, v in parse_qs(urlparse(self.path).query).items()}):
                self._refuse()
                return
            self._send(405, b"vcamon's page is read-only\n", "text/plain; charset=utf-8", [("Allow", "GET")])

        do_POST = do_PUT = do_PATCH = do_DELETE = _read_only

        def _static(self, rel):
            item = static_file(static_root, rel)
            if item is None or item.suffix not in TYPES:
                self.send_error(404)
                return
            self._send(200, item.read_bytes(), TYPES[item.suffix])

        def log_message(self, fmt, *args):
            LOG.debug("%s", TOKEN_IN_QUERY.sub(r"\1***", fmt % args))

    return Handler


def start_web(listen, db_path, token=None, static_root=STATIC):
    """Serve the page on listen ('addr:port'; addr an IPv4 address or a name, none = loopback)."""
    if token is not None:
        check_token(token)     # configured but empty or malformed: refuse to start, never serve it open
    server = ThreadingHTTPServer(bind_address(listen), make_handler(db_path, token, static_root))
    threading.Thread(target=server.serve_forever, name="vcamon-web", daemon=True).start()
    LOG.info("vcamon page on %s (http://%s:%s/)%s", listen, *server.server_address[:2],
             "; token required" if token else "")
    if not token and not is_loopback(server.server_address[0]):
        LOG.warning("the page is open to anyone who reaches %s: set a token (--web-token-file)",
                    server.server_address[0])
    return server
