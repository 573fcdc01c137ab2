"""llama_server's restart handler, run by ansible-playbook on two nodes (local connections): one node
at a time, one unit at a time, each back before the next goes down (issue 40: an update must not take
every server of a lane at once). The double: `systemctl` is a shim that logs the restart, and each
unit's /health is a loopback server that answers 503 for DOWN_S after that restart, then 200. What
systemd does and the shim does not (start the process, load a model) is the molecule scenarios' part:
there the same handler restarts real llama-servers."""

from __future__ import annotations

import http.server
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOWN_S = 1.0
NODES = {"node-a": {"chat": None, "embed": None}, "node-b": {"chat": None, "embed": None}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Units:
    """The restarts the shim logged and what /health answered, per unit."""

    def __init__(self, log: Path, never_up: set[str]):
        self.log, self.never_up, self.answers = log, never_up, []

    def restarted_at(self, unit: str) -> float | None:
        times = [float(t) for t, verb, u in (line.split() for line in self.log.read_text().splitlines())
                 if verb == "restart" and u == unit] if self.log.exists() else []
        return times[-1] if times else None

    def health(self, unit: str) -> int:
        t = self.restarted_at(unit)
        code = 503 if unit in self.never_up or (t is not None and time.time() - t < DOWN_S) else 200
        self.answers.append((time.time(), unit, code))
        return code


def serve(units: Units, unit: str, port: int) -> http.server.ThreadingHTTPServer:
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(units.health(unit) if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def unit_name(node: str, name: str) -> str:
    return "llama-server-smem-%s-%s.service" % (name, node)


def run_handler(tmp_path: Path, never_up: set[str] = frozenset(), timeout_s: int = 60):
    """Notify the role's handler on both nodes; (ansible-playbook's result, Units)."""
    shims = tmp_path / "bin"
    shims.mkdir()
    log = tmp_path / "systemctl.log"
    for tool in ("systemctl", "journalctl"):
        (shims / tool).write_text('#!/bin/sh\n[ "$1" = restart ] && echo "$(date +%%s.%%N) $1 $2" >> %s\nexit 0\n'
                                  % log)
        (shims / tool).chmod(0o755)
    for tool in ("curl", "wget", "python3"):           # not on a node (node_base installs none of them for this)
        (shims / tool).write_text("#!/bin/sh\necho '%s: not on a node' >&2\nexit 127\n" % tool)
        (shims / tool).chmod(0o755)
    units, servers, hosts = Units(log, set(never_up)), [], {}
    for node, by_name in NODES.items():
        unit_list = []
        for name in by_name:
            port = free_port()
            servers.append(serve(units, unit_name(node, name), port))
            unit_list.append({"name": "%s-%s" % (name, node), "port": port, "model": "m.gguf"})
        hosts[node] = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                       "llama_server_units": unit_list}
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "restart-one-by-one.sh").symlink_to(ROOT / "roles/llama_server/files/restart-one-by-one.sh")
    (tmp_path / "group_vars").mkdir()     # the role's defaults, below the hosts' own units
    (tmp_path / "group_vars" / "all.yml").symlink_to(ROOT / "roles/llama_server/defaults/main.yml")
    (tmp_path / "play.yml").write_text(f"""
- hosts: all
  gather_facts: false
  vars:
    llama_server_owner: smem
    llama_server_address: 127.0.0.1
    llama_server_health_timeout_s: {timeout_s}
  environment:
    PATH: "{shims}:{{{{ lookup('env', 'PATH') }}}}"
  handlers:
    - ansible.builtin.import_tasks: {ROOT}/roles/llama_server/handlers/main.yml
  tasks:
    - name: A change that restarts the servers
      ansible.builtin.debug:
        msg: changed
      changed_when: true
      notify: Restart llama-server units
""")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STRATEGY": "linear",
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORKS": "5"}
    try:
        run = subprocess.run(["ansible-playbook", "-i", str(tmp_path / "inventory.json"), str(tmp_path / "play.yml")],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    finally:
        for s in servers:
            s.shutdown()
    return run, units


def down_spans(units: Units) -> list[tuple[float, float, str]]:
    """Each restart, from the shim's log, to the first 200 its /health gave after it."""
    spans = []
    for line in units.log.read_text().splitlines():
        t, _, unit = line.split()
        up = min((at for at, u, code in units.answers if u == unit and code == 200 and at > float(t)), default=None)
        spans.append((float(t), up, unit))
    return sorted(spans)


def test_every_unit_restarts_once_and_none_goes_down_while_another_is_down(tmp_path):
    run, units = run_handler(tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    spans = down_spans(units)
    assert sorted(u for _, _, u in spans) == sorted(unit_name(n, u) for n in NODES for u in NODES[n]), spans
    assert all(up is not None for _, up, _ in spans), spans
    for (_, up, unit), (later, _, next_unit) in itertools.pairwise(spans):
        assert later >= up, "%s went down before %s was back: %s" % (next_unit, unit, spans)


def test_a_unit_that_never_comes_back_fails_its_node_and_its_other_unit_keeps_serving(tmp_path):
    """node-a's chat server stays down: node-a fails, naming it, and its embed server is not touched;
    node-b (its turn after node-a's) restarts its own one by one, each back before the next."""
    stuck = unit_name("node-a", "chat")
    run, units = run_handler(tmp_path, never_up={stuck}, timeout_s=3)
    assert run.returncode != 0
    assert "no 200 from" in run.stdout and stuck in run.stdout, run.stdout[-3000:]
    assert re.search(r"^node-a\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=1 ", run.stdout, re.M), run.stdout
    spans = down_spans(units)
    assert [u for _, _, u in spans] == [stuck, unit_name("node-b", "chat"), unit_name("node-b", "embed")], spans
    assert spans[1][0] >= spans[0][0] + 3                # node-b's turn came after node-a's wait ran out
    assert spans[2][0] >= spans[1][1], spans             # node-b's second after its first was back


@pytest.fixture(autouse=True)
def _ansible_on_path(monkeypatch):
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
