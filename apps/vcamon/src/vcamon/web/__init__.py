"""The collector's web page: per-node temperature and power charts (uPlot, bundled) over a chosen range."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, urlparse

from ..store import Store

LOG = logging.getLogger("vcamon.web")
STATIC = resources.files(__name__) / "static"
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
SPAN = re.compile(r"^(\d+)([smhdw])$")
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_span(text):
    """'30m', '6h', '7d', '2w' -> seconds; anything else is a ValueError that says what is accepted."""
    m = SPAN.match(str(text).strip())
    if not m:
        raise ValueError("%r is not a span: use a number and one of s, m, h, d, w (e.g. 1d)" % text)
    return int(m.group(1)) * UNITS[m.group(2)]


def make_handler(db_path):
    local = threading.local()

    def store():
        if getattr(local, "store", None) is None:
            local.store = Store(db_path)
        return local.store

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code, body, ctype):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def _json(self, obj, code=200):
            self._send(code, json.dumps(obj).encode(), "application/json")

        def do_GET(self):
            url = urlparse(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            try:
                if url.path in ("/", "/index.html"):
                    self._send(200, (STATIC / "index.html").read_bytes(), TYPES[".html"])
                elif url.path.startswith("/static/"):
                    self._static(url.path[len("/static/"):])
                elif url.path == "/api/nodes":
                    self._json({"now": int(time.time()), "nodes": store().status()})
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

        def _static(self, rel):
            parts = [p for p in rel.split("/") if p]
            if not parts or any(p in ("..", ".") for p in parts):
                self.send_error(404)
                return
            item = STATIC.joinpath(*parts)
            suffix = "." + parts[-1].rsplit(".", 1)[-1]
            if not item.is_file() or suffix not in TYPES:
                self.send_error(404)
                return
            self._send(200, item.read_bytes(), TYPES[suffix])

        def log_message(self, fmt, *args):
            LOG.debug(fmt, *args)

    return Handler


def start_web(listen, db_path):
    host, _, port = listen.rpartition(":")
    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), make_handler(db_path))
    threading.Thread(target=server.serve_forever, name="vcamon-web", daemon=True).start()
    LOG.info("vcamon page on http://%s:%s/", host or "0.0.0.0", server.server_address[1])
    return server
