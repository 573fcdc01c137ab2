"""Verify smem on the molecule lab (testinfra): the API on the host, the lanes' llama-servers on
the nodes, ingest and search through them, a node down, tokens (the lease token, a rotation, a
revoke), the nightly backup, a lease.

The tests run in file order: the last ones stop node 0 and lease node 4."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
import tomllib
from pathlib import Path

import pytest
import testinfra

LAB = os.environ.get("VCA_LAB_NAME", "vcamolsmem")
URL = f"http://{LAB}-host:8787"
LOCAL = testinfra.get_host("local://")
CREDENTIALS = Path("/var/lib/vcafleet-lab") / LAB / "credentials"
DB = "/var/lib/smem/smem.db"
CONFIG = "/etc/smem/smem.toml"
DOCS = [
    "Maria moved to Lisbon in March 2024 and works as a nurse at the Santa Maria hospital.",
    "The team's render farm runs on Celery with RabbitMQ; Tomas keeps it running.",
]


def machine(name: str):
    return testinfra.get_host(f"docker://{LAB}-{name}")


HOST = machine("host")

# One request from inside the host container, with the venv's httpx: (status, body).
CLIENT = """
import json, sys, httpx
method, url, token, body = sys.argv[1:5]
r = httpx.request(method, url, headers={"Authorization": "Bearer " + token} if token else {},
                  content=body or None, timeout=120)
print(json.dumps([r.status_code, r.json() if r.content else None]))
"""


def api(method: str, path: str, token: str | None, body: dict | None = None):
    cmd = "/opt/smem/venv/bin/python -c %s %s %s %s %s" % (
        shlex.quote(CLIENT), method, shlex.quote(URL + path), shlex.quote(token or ""),
        shlex.quote(json.dumps(body) if body is not None else ""))
    status, data = json.loads(HOST.check_output(cmd))
    return status, data


def node_ip(node: str) -> str:
    """A node's link address, as on a card (node n at 172.31.(n+1).1)."""
    return "172.31.%d.1" % (int(node.removeprefix("node")) + 1)


def node_key(node: str) -> str:
    """The key smem's servers on that node take (made once on the controller, in the lab's state)."""
    return (CREDENTIALS / f"llama-smem-vca-{node}").read_text().split()[0]


def metric(node: str, port: int, name: str) -> float:
    """A counter of a node's llama-server (/metrics, Prometheus text, behind its key), read from the host."""
    script = ("import sys, httpx\n"
              "r = httpx.get(sys.argv[1], timeout=30, headers={'Authorization': 'Bearer ' + sys.argv[3]})\n"
              "for line in r.raise_for_status().text.splitlines():\n"
              "    if line.startswith('llamacpp:' + sys.argv[2] + ' '): print(line.split()[1])")
    out = HOST.check_output("/opt/smem/venv/bin/python -c %s %s %s %s" % (
        shlex.quote(script), f"http://{node_ip(node)}:{port}/metrics", name, shlex.quote(node_key(node))))
    return float(out)


@pytest.fixture(scope="module")
def admin():
    return HOST.check_output("cat /etc/smem/admin.token").strip()


@pytest.fixture(scope="module")
def token():
    return HOST.check_output(f"runuser -u smem -- smem token create --db {DB} --ns lab --config {CONFIG}").strip()


def wait_done(token: str, doc_id: str, timeout: float = 600) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status, doc = api("GET", f"/v5/ns/lab/documents/{doc_id}", token)
        assert status == 200, doc
        if doc["status"] in ("done", "failed") or time.monotonic() > deadline:
            return doc
        time.sleep(2)


def listening(host, port: int) -> set[str]:
    out = host.check_output(f"ss -Hltn 'sport = :{port}'")
    return {line.split()[3].rsplit(":", 1)[0] for line in out.splitlines() if line.strip()}


def test_config_names_the_live_lane_nodes_and_served_models():
    cfg = tomllib.loads(HOST.file(CONFIG).content_string)
    assert set(cfg["lanes"]["interactive"]["nodes"]) == {"vca-node0", "vca-node1"}
    assert set(cfg["lanes"]["background"]["nodes"]) == {"vca-node4"}   # node 3 is dead
    assert cfg["lanes"]["background"]["nodes"]["vca-node4"] == {
        "embed": "http://172.31.5.1:8410", "chat": "http://172.31.5.1:8411"}
    assert set(cfg["models"]) == {"embed", "chat"}                       # the lab ships no reranker
    assert HOST.file(CONFIG).mode == 0o640 and HOST.file("/etc/smem/admin.token").mode == 0o600


@pytest.mark.parametrize("node, units", [(0, {"embed"}), (1, {"embed"}), (4, {"embed", "chat"})])
def test_each_node_runs_its_lanes_servers(node, units):
    host = machine(f"node{node}")
    present = {u.removeprefix("llama-server-smem-").removesuffix(".service")
               for u in host.check_output("systemctl list-units --plain --no-legend 'llama-server-*' "
                                          "| awk '{print $1}'").split()}
    assert present == units
    for unit in units:
        assert host.service(f"llama-server-smem-{unit}").is_running
    # bound to the node's own address, never every address
    assert listening(host, 8410) and not listening(host, 8410) & {"0.0.0.0", "*", "[::]"}


def test_the_dead_node_gets_nothing():
    state = LOCAL.check_output(f"docker inspect -f '{{{{.State.Status}}}}' {LAB}-node3")
    assert state in ("created", "exited")


def test_api_listens_on_its_named_address_only(admin):
    assert not listening(HOST, 8787) & {"0.0.0.0", "*", "[::]", "127.0.0.1"}
    status, health = api("GET", "/healthz", None)
    assert status == 200 and health["embedder"] == "http:smollm2-135m"


def test_ingest_runs_on_the_background_lane(token):
    ids = []
    for content in DOCS:
        status, out = api("POST", "/v5/ns/lab/documents", token, {"content": content})
        assert status == 202, out
        ids.append(out["id"])
    for doc_id in ids:
        doc = wait_done(token, doc_id)
        assert doc["status"] == "done", doc
        assert doc["job"]["stages"]["extract"]["model"] == "smollm2-135m-instruct", doc["job"]
    status, facts = api("GET", "/v5/ns/lab/memories", token)
    for fact in facts["memories"]:                     # whatever the small model found, it is attributed
        if fact.get("documentId") in ids:
            assert fact["model"] == "smollm2-135m-instruct" and re.fullmatch(r"sha256:[0-9a-f]{64}", fact["promptHash"])
    # node 4's servers did the work: their own counters say so
    assert metric("node4", 8411, "n_decode_total") > 0 and metric("node4", 8410, "prompt_tokens_total") > 0


def test_search_from_the_host(token):
    status, out = api("POST", "/v5/ns/lab/search", token, {"q": "Where does Maria work?", "mode": "chunks"})
    assert status == 200, out
    assert out["degraded"] == [] and out["served"]["embed"].startswith("interactive/")
    assert any("Lisbon" in r["content"] for r in out["results"])


def test_search_answers_degraded_with_an_interactive_node_down(token):
    LOCAL.check_output(f"docker stop {LAB}-node0")
    status, out = api("POST", "/v5/ns/lab/search", token, {"q": "Who keeps the render farm running?",
                                                            "mode": "chunks"})
    assert status == 200, out
    assert "interactive/vca-node0" in out["degraded"] and "embedder" not in out["degraded"]
    assert out["served"]["embed"] == "interactive/vca-node1"
    assert any("Celery" in r["content"] for r in out["results"])


@pytest.fixture(scope="module")
def lease():
    return HOST.check_output("cat /etc/smem/lease.token").strip()


def test_a_lease_needs_the_lease_scope_and_the_lease_token_reads_nothing_else(token, lease):
    status, _ = api("POST", "/v5/admin/leases", token, {"nodes": ["vca-node4"], "holder": "x", "ttlSeconds": 60})
    assert status == 403
    assert HOST.file("/etc/smem/lease.token").mode == 0o600
    assert api("GET", "/v5/admin/leases", lease)[0] == 200
    for path in ("/v5/ns/lab/memories", "/v5/admin/tokens", "/v5/admin/lanes"):
        assert api("GET", path, lease)[0] == 403, path


def test_the_metrics_token_reads_metrics_only():
    metrics = HOST.check_output("cat /etc/smem/metrics.token").strip()
    assert HOST.file("/etc/smem/metrics.token").mode == 0o600
    script = ("import sys, httpx\n"
              "r = httpx.get(sys.argv[1], headers={'Authorization': 'Bearer ' + sys.argv[2]}, timeout=30)\n"
              "print(r.status_code); print(r.text)")
    out = HOST.check_output("/opt/smem/venv/bin/python -c %s %s %s" % (
        shlex.quote(script), shlex.quote(URL + "/metrics"), shlex.quote(metrics)))
    status, text = out.split("\n", 1)
    assert status == "200" and 'smem_lane_node_up{lane="background",model="embed",node="vca-node4"} 1.0' in text
    assert api("GET", "/v5/ns/lab/memories", metrics)[0] == 403


def test_the_admin_token_was_rotated_on_request(admin):
    """converge raised smem_admin_token_generation to 2: same token, new secret, the first one refused."""
    first = HOST.check_output("cat /root/admin.token.generation1").strip()
    assert first != admin
    assert HOST.check_output("cat /etc/smem/admin.token.generation").strip() == "2"
    assert api("GET", "/v5/admin/tokens", first)[0] == 401
    status, out = api("GET", "/v5/admin/tokens", admin)
    assert status == 200
    admins = [t for t in out["tokens"] if t["label"] == "ansible-admin"]
    assert len(admins) == 1 and admins[0]["revokedAt"] is None
    assert all("token" not in t and "hash" not in t for t in out["tokens"])   # never a secret


def test_a_revoked_token_is_refused_at_once(admin):
    status, made = api("POST", "/v5/admin/tokens", admin, {"namespaces": ["lab"], "label": "to-revoke"})
    assert status == 201
    assert api("GET", "/v5/ns/lab/memories", made["token"])[0] == 200
    HOST.check_output(f"runuser -u smem -- smem token revoke {made['id']} --db {DB}")  # the CLI, the server's DB
    assert api("GET", "/v5/ns/lab/memories", made["token"])[0] == 401
    listed = HOST.check_output(f"runuser -u smem -- smem token list --db {DB}")
    assert re.search(re.escape(made["id"]) + r".*revoked \d{4}-", listed), listed


def test_the_nightly_backup_makes_a_checked_copy():
    assert HOST.service("smem-backup.timer").is_enabled and HOST.service("smem-backup.timer").is_running
    assert HOST.check_output("systemctl show -P Persistent smem-backup.timer") == "yes"
    assert HOST.service("smem-vacuum.timer").is_enabled and HOST.service("smem-vacuum.timer").is_running
    HOST.check_output("systemctl start smem-backup.service")       # oneshot: returns when the copy is made
    newest = HOST.check_output("ls -1t /var/backups/smem/smem-*.db | head -1")
    f = HOST.file(newest)
    assert f.user == "smem" and f.mode == 0o600
    check = ("import sys, apsw; from smem import archive; print(archive.check_backup(sys.argv[1]));"
             "print(apsw.Connection(sys.argv[1]).execute('SELECT count(*) FROM documents WHERE content=?',"
             " (sys.argv[2],)).fetchall()[0][0])")
    version, copies = HOST.check_output("runuser -u smem -- /opt/smem/venv/bin/python -c %s %s %s" % (
        shlex.quote(check), newest, shlex.quote(DOCS[0]))).split()
    assert int(version) >= 5 and copies == "1"     # the document ingested above is in the copy


def test_a_lease_drains_a_background_node_and_gives_it_back(token, lease):
    status, lease_made = api("POST", "/v5/admin/leases", lease,
                        {"nodes": ["vca-node4"], "holder": "molecule", "ttlSeconds": 600})
    assert status == 201 and lease_made["drained"] is True, lease_made
    status, out = api("POST", "/v5/ns/lab/documents", token, {"content": "Leased nodes take no new calls."})
    assert status == 202
    time.sleep(10)
    status, doc = api("GET", f"/v5/ns/lab/documents/{out['id']}", token)
    assert doc["status"] != "done", doc                 # node 4 is the only background node: ingest waits
    status, _ = api("DELETE", f"/v5/admin/leases/{lease_made['id']}", lease)
    assert status == 200
    assert wait_done(token, out["id"])["status"] == "done"
