"""vcamon's tests: the package from src/, the lab simulator's sysfs tree as a node."""

from __future__ import annotations

import sys
import threading
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


@pytest.fixture
def agent(node_tree):
    """A real agent serving node_tree on a free port; yields its /metrics URL."""
    server, stop = start_agent("127.0.0.1:0", "vca-node0", str(node_tree.root), sample_interval=0.2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d/metrics" % server.server_address[1]
    stop.set()
    server.shutdown()
    server.server_close()
