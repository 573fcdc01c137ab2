"""Verify the LLM workers on the molecule lab (testinfra): HAProxy on the host's loopback with a
token, workers on the host and nodes 0 and 1, node 3 dead. Requests go from inside the host
container, through HAProxy, which names the worker that answered (X-LLM-Worker).

The tests run in file order: the later ones stop a worker and drain one, and put both back."""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path

import testinfra

LAB = os.environ.get("VCA_LAB_NAME", "vcamolllm")
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
LOCAL = testinfra.get_host("local://")
URL = "http://127.0.0.1:8090/v1/chat/completions"
TOKEN = "lab-llm-token"
WORKERS = {"vca-host", "vca-node0", "vca-node1"}
UNIT = "llama-server-llm-chat.service"


def machine(name: str):
    return testinfra.get_host(f"docker://{LAB}-{name}")


HOST = machine("host")

# n chat requests, `threads` at a time, from inside the host: [[status, worker, completion tokens], ...]
CLIENT = """
import json, sys, urllib.error, urllib.request
from concurrent.futures import ThreadPoolExecutor
url, token, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
body = json.dumps({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}).encode()
def one(_):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers), timeout=300) as r:
            answer = json.load(r)
            return [r.status, r.headers.get("X-LLM-Worker"), answer["usage"]["completion_tokens"]]
    except urllib.error.HTTPError as e:
        return [e.code, e.headers.get("X-LLM-Worker"), None]
with ThreadPoolExecutor(threads) as pool:
    print(json.dumps(list(pool.map(one, range(n)))))
"""


def chat(n: int, threads: int = 3, token: str = TOKEN):
    return json.loads(HOST.check_output("python3 -c %s %s %s %d %d" % (
        shlex.quote(CLIENT), URL, shlex.quote(token), n, threads)))


def status():
    return json.loads(HOST.check_output("llm-workers-status"))   # the role's own reader


def wait_for(predicate, what: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = status()
        if predicate(value):
            return value
        time.sleep(1)
    raise AssertionError(f"{what}: HAProxy still says {status()}")


def drain(worker: str, state: str):
    env = f"VCA_LAB_NAME={LAB} ANSIBLE_CONFIG={PROJECT}/ansible.cfg ANSIBLE_NOCOLOR=1"
    LOCAL.check_output(f"cd {PROJECT} && {env} ansible-playbook -i {INVENTORY} playbooks/llm-drain.yml"
                       f" -e worker={worker} -e state={state}")


def test_haproxy_listens_on_loopback_only():
    listening = HOST.check_output("ss -Hltn")
    assert "127.0.0.1:8090 " in listening, listening
    assert "0.0.0.0:8090 " not in listening and "*:8090 " not in listening, listening


def test_every_live_worker_is_up_and_the_dead_node_is_not_listed():
    assert status() == {name: "UP" for name in WORKERS}
    assert "vca-node3" not in HOST.file("/etc/haproxy/haproxy.cfg").content_string


def test_a_request_without_the_token_is_refused():
    assert [status for status, _, _ in chat(2, token="")] == [401, 401]
    assert [status for status, _, _ in chat(1, token="wrong")] == [401]


def test_requests_spread_over_every_worker():
    answers = chat(12)
    assert all(code == 200 and tokens and tokens > 0 for code, _, tokens in answers), answers
    assert {worker for _, worker, _ in answers} == WORKERS, answers


def test_the_lease_socket_is_its_users_alone_and_drains_a_worker():
    sock = HOST.file("/run/haproxy/llm-leases.sock")
    assert sock.is_socket and sock.user == "nobody" and sock.mode == 0o600
    # what smem.haproxy sends, as the socket's user
    send = ("import socket, sys\n"
            "s = socket.socket(socket.AF_UNIX); s.connect('/run/haproxy/llm-leases.sock')\n"
            "s.sendall(sys.argv[1].encode() + b'\\n'); print(repr(s.recv(4096).decode().strip()))")
    # as the socket's user, sandboxed as smem's unit is (ProtectSystem=strict: /run read-only)
    as_nobody = ("systemd-run --quiet --wait --pipe -p User=nobody -p ProtectSystem=strict -p ProtectHome=yes"
                 " -p PrivateTmp=yes python3 -c %s %s")
    def to(state):
        line = "set server llm_workers/vca-node1 state " + state
        return HOST.check_output(as_nobody % (shlex.quote(send), shlex.quote(line)))
    assert to("drain") == "''"          # HAProxy's empty answer: done
    try:
        assert status()["vca-node1"] == "DRAIN"
    finally:
        to("ready")
    assert status()["vca-node1"] == "UP"


def test_a_stopped_worker_is_taken_out_and_no_request_fails():
    node1 = machine("node1")
    node1.check_output(f"systemctl stop {UNIT}")
    try:
        # From the moment it stops: a refused connection is retried on another worker.
        answers = chat(9)
        assert all(code == 200 for code, _, _ in answers), answers
        wait_for(lambda s: s["vca-node1"].startswith("DOWN"), "node 1's worker stopped", timeout=60)
        answers = chat(6)
        assert all(code == 200 for code, _, _ in answers), answers
        assert "vca-node1" not in {worker for _, worker, _ in answers}, answers
    finally:
        node1.check_output(f"systemctl start {UNIT}")
    wait_for(lambda s: s["vca-node1"] == "UP", "node 1's worker started again")


def test_a_drained_worker_gets_nothing_and_comes_back():
    drain("vca-node0", "drain")
    try:
        assert status()["vca-node0"] == "DRAIN"
        answers = chat(9)
        assert all(code == 200 for code, _, _ in answers), answers
        assert {worker for _, worker, _ in answers} == WORKERS - {"vca-node0"}, answers
    finally:
        drain("vca-node0", "enabled")
    wait_for(lambda s: s["vca-node0"] == "UP", "node 0 returned")
    assert "vca-node0" in {worker for _, worker, _ in chat(9)}


def test_capacity_bench_short_run_ends_with_the_lab_table(tmp_path):
    env = f"VCA_LAB_NAME={LAB} ANSIBLE_CONFIG={PROJECT}/ansible.cfg ANSIBLE_NOCOLOR=1"
    extra = {"capacity_duration_s": 3, "capacity_users": 2, "capacity_max_tokens": 8,
             "capacity_transcode_frames": 10, "vca_bench_results_dir": str(tmp_path)}
    LOCAL.check_output(f"cd {PROJECT} && {env} ansible-playbook -i {INVENTORY} playbooks/bench/capacity.yml"
                       f" -e {shlex.quote(json.dumps(extra))}")
    (run,) = list(tmp_path.glob("capacity-*"))
    record = json.loads((run / "record.json").read_text())
    legs = {leg["name"]: leg for leg in record["legs"]}
    assert set(legs) == {"host", "card", "both"}, sorted(legs)
    for leg in [*legs.values(), *record["scaling"]["legs"]]:
        assert leg["platform"] == "lab" and leg["tok_s"] > 0 and leg["p95_ms"] >= leg["p50_ms"] > 0, leg
    curve = record["scaling"]["curve"]
    assert [point["nodes"] for point in curve] == [1, 2] and curve[0]["ratio"] == 1.0, curve
    # the nodes' simulated RAPL counters give the card a tok/J; the lab host has none, so no figure
    assert legs["card"]["tok_j"] > 0 and legs["host"]["tok_j"] is None and legs["both"]["tok_j"] is None
    assert {leg["name"] for leg in record["transcode"]} == {"transcode-host", "transcode-card", "transcode-both"}
    assert all(leg["fps"] > 0 for leg in record["transcode"]), record["transcode"]
    table = (run / "table.md").read_text()
    assert "(platform: lab)" in table and "| card alone (2 nodes) | lab |" in table
    assert status() == {name: "UP" for name in WORKERS}      # every worker back in after the legs
