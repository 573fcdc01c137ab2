"""vcamon's tests: the package from src/, the lab simulator's sysfs tree as a node."""

from __future__ import annotations

import contextlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent
REPO = APP.parent.parent
sys.path.insert(0, str(APP / "src"))
sys.path.insert(0, str(REPO / "lab" / "sim"))

from vcamon.agent import start_agent  # noqa: E402
from vcasim.model import load_params  # noqa: E402
from vcasim.tree import SysfsTree  # noqa: E402


@pytest.fixture
def node_tree(tmp_path):
    """A simulated node's sysfs (coretemp, intel-rapl, throttle counters) under tmp_path/sys."""
    tree = SysfsTree(tmp_path / "sys", load_params()["node"])
    tree.create()
    return tree


@contextlib.contextmanager
def http_server(handler):
    """A real HTTP server on a free loopback port with this handler class; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield "http://127.0.0.1:%d" % server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serving_text(bodies, tokens=None):
    """A real HTTP server answering GET path with bodies[path] as Prometheus text, and 401 to a request
    for a path of tokens without its Bearer token; yields its base URL."""
    tokens = tokens or {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            want = tokens.get(self.path)
            if want and self.headers.get("Authorization") != "Bearer " + want:
                self.send_response(401)
                self.end_headers()
                return
            body = bodies[self.path].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http_server(Handler) as base:
        yield base


AGENT_TOKEN = "agent-token-0123456789abcdef"       # made up for the tests; no deployment uses it


def serving(node_tree, token=None):
    """A real agent serving node_tree on a free port (with token: only to requests that carry it)."""
    server, stop = start_agent("127.0.0.1:0", "vca-node0", str(node_tree.root), sample_interval=0.2, token=token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d/metrics" % server.server_address[1]
    stop.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def agent(node_tree):
    """An agent without a token; yields its /metrics URL."""
    yield from serving(node_tree)


@pytest.fixture
def locked_agent(node_tree):
    """An agent that wants AGENT_TOKEN; yields its /metrics URL."""
    yield from serving(node_tree, AGENT_TOKEN)
