"""node_image's drain (tasks/drain.yml, undrain.yml), run by the real ansible-playbook against a
stand-in for smem's lease API on loopback that keeps smem's contract (apps/smem/src/smem/leases.py,
ops.py): the lease-scoped bearer token, the body's fields, 201 with the lease, 409 while another
holder (the farm) has the node, 400 for a node in no lane, DELETE 200 or 404."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import ROOT

TOKEN = "smem-lease-token-of-the-test"
LANE_NODES = {"vca-node0", "vca-node1"}


class LeaseAPI(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def authorised(self):
        if self.headers.get("Authorization") != "Bearer " + TOKEN:
            self.answer(401, {"error": "bad token"})
            return False
        return True

    def do_POST(self):
        state = self.server.state
        if self.path != "/v5/admin/leases" or not self.authorised():
            return None if self.path == "/v5/admin/leases" else self.answer(404, {"error": "no route"})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert set(body) == {"nodes", "holder", "ttlSeconds"} and body["ttlSeconds"] > 0, body
        state["posts"].append(body)
        unknown = sorted(set(body["nodes"]) - LANE_NODES)
        if unknown:
            return self.answer(400, {"error": "unknown node(s): %s" % ", ".join(unknown)})
        if state["farm_holds_for"] > 0:          # the farm's job still has the node
            state["farm_holds_for"] -= 1
            return self.answer(409, {"error": "node(s) %s already leased by farm" % body["nodes"][0]})
        state["leases"]["lse_1"] = body
        return self.answer(201, {"id": "lse_1", "nodes": body["nodes"], "holder": body["holder"], "drained": True})

    def do_DELETE(self):
        prefix, _, lease = self.path.rpartition("/")
        if prefix != "/v5/admin/leases":
            return self.answer(404, {"error": "no route"})
        if not self.authorised():
            return None
        self.server.state["deletes"].append(lease)
        if self.server.state["leases"].pop(lease, None) is None:
            return self.answer(404, {"error": "no live lease %s" % lease})
        return self.answer(200, {"id": lease, "released": True})


@pytest.fixture
def smem(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), LeaseAPI)
    server.state = {"posts": [], "deletes": [], "leases": {}, "farm_holds_for": 0}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def drain_and_give_back(tmp_path, smem, node, token=True, wait_s=30):
    token_file = tmp_path / "lease.token"
    if token:
        token_file.write_text(TOKEN + "\n")
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {node: {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (tmp_path / "play.yml").write_text(json.dumps([{
        "hosts": node, "gather_facts": False,
        "vars": {"node_image_drain_host": node, "node_image_drain_token_file": str(token_file),
                 "node_image_drain_smem_url": "http://127.0.0.1:%d" % smem.server_address[1],
                 "node_image_drain_wait_s": wait_s, "node_image_drain_retry_s": 1},
        "tasks": [{"name": "Drain", "ansible.builtin.include_role": {"name": "node_image", "tasks_from": "drain"}},
                  {"name": "Leased", "ansible.builtin.debug": {"msg": "LEASE={{ node_image_lease_id }}"}},
                  {"name": "Give back", "ansible.builtin.include_role": {"name": "node_image",
                                                                          "tasks_from": "undrain"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STRATEGY="linear")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "hosts.yml"),
                           str(tmp_path / "play.yml")], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=False)


def test_the_node_is_leased_while_the_farm_holds_it_and_given_back(tmp_path, smem):
    smem.state["farm_holds_for"] = 2
    run = drain_and_give_back(tmp_path, smem, "vca-node1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert [p["nodes"] for p in smem.state["posts"]] == [["vca-node1"]] * 3      # two 409s, then the lease
    assert smem.state["posts"][-1]["holder"] == "node_image rollout"
    assert "LEASE=lse_1" in run.stdout
    assert smem.state["deletes"] == ["lse_1"] and smem.state["leases"] == {}


def test_a_farm_job_that_keeps_the_node_stops_the_rollout_before_it(tmp_path, smem):
    smem.state["farm_holds_for"] = 100
    run = drain_and_give_back(tmp_path, smem, "vca-node1", wait_s=2)
    assert run.returncode != 0
    assert "vca-node1 could not be drained, so it was not touched: 409" in run.stdout
    assert smem.state["deletes"] == []


def test_a_node_in_no_lane_needs_no_lease(tmp_path, smem):
    run = drain_and_give_back(tmp_path, smem, "vca-node5")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "LEASE=" in run.stdout and "LEASE=lse" not in run.stdout
    assert smem.state["deletes"] == []


def test_without_smem_the_rollout_says_it_does_not_drain(tmp_path, smem):
    run = drain_and_give_back(tmp_path, smem, "vca-node1", token=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "vca-node1 is rebooted without a drain" in run.stdout
    assert smem.state["posts"] == [] and smem.state["deletes"] == []
