"""Verify the render farm on the molecule lab (testinfra): what listens where, the workers, the
example rendered on three nodes with sample-exact audio, a node hung mid-job (docker pause), a
broker restart and a coordinator killed mid-job, and a worker killed mid-job.

The tests run in file order: the last one kills a worker."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time

import pytest
import testinfra

LAB = os.environ.get("VCA_LAB_NAME", "vcamolfarm")
NODES = ["vca-node0", "vca-node1", "vca-node4"]
SUBMIT = ("farm submit --project /var/lib/farm/examples/hello --composition Hello --out {out} --nodes "
          + " ".join(NODES))
ONE_SAMPLE_MS = 1000 / 48000


def machine(name: str):
    return testinfra.get_host(f"docker://{LAB}-{name}")


HOST = machine("host")


def status(job: str) -> dict:
    return json.loads(HOST.check_output(f"farm status {job} --json"))


PING = """
import json, sys
from farm import config, tasks
app = tasks.configure(config.load())
print(json.dumps(app.control.ping(destination=["farm@" + sys.argv[1]], timeout=5)))
"""


def ping(node: str) -> list:
    return json.loads(HOST.check_output("runuser -u farm -- env FARM_CONFIG=/etc/farm/farm.toml"
                                        " /opt/farm/venv/bin/python -c %s %s" % (shlex.quote(PING), node)))


def listeners() -> list[tuple[str, int]]:
    out = []
    for line in HOST.check_output("ss -Hltn").splitlines():
        addr, _, port = line.split()[3].rpartition(":")
        out.append((addr.strip("[]"), int(port)))
    return out


def test_the_broker_listens_on_the_farm_address_and_loopback_only():
    ip = "172.31.1.254"                    # the host's end of node 0's link (inventory/lab's farm.yml)
    found = listeners()
    assert (ip, 5672) in found and (ip, 8790) in found, found            # AMQP and the API, for the workers
    assert ("127.0.0.1", 25672) in found and ("127.0.0.1", 4369) in found, found   # distribution, epmd
    for addr, port in found:
        if port in (5672, 25672, 4369, 8790):
            assert addr in (ip, "127.0.0.1"), (addr, port)


def test_the_coordinators_user_and_one_user_per_node_on_the_farms_vhost():
    users = HOST.check_output("rabbitmqctl -q list_users --formatter json")
    assert sorted(u["user"] for u in json.loads(users)) == sorted(["farm"] + ["farm-" + n for n in NODES])
    perms = json.loads(HOST.check_output("rabbitmqctl -q list_user_permissions farm --formatter json"))
    assert [p["vhost"] for p in perms] == ["farm"]
    for node in NODES:
        (perm,) = json.loads(HOST.check_output(f"rabbitmqctl -q list_user_permissions farm-{node} --formatter json"))
        assert perm["vhost"] == "farm" and "farm\\.reports" not in perm["read"] and ".*" not in perm.values()
        assert re.escape(f"farm@{node}.celery.pidbox") in perm["read"]
        # and the node's worker connects as that user
        assert f"amqp://farm-{node}:" in machine(node.removeprefix("vca-")).file("/etc/farm/farm.toml").content_string


@pytest.mark.parametrize("node", NODES)
def test_a_worker_runs_on_each_farm_node(node):
    n = machine(node.removeprefix("vca-"))
    assert n.service("farm-worker").is_running
    unit = n.check_output("systemctl show farm-worker -p KillMode -p User")
    assert "KillMode=mixed" in unit and "User=farm" in unit
    # The worker reaches the broker with the farm's credentials: it answers a ping sent from the host.
    deadline = time.monotonic() + 120
    while not ping(node):
        assert time.monotonic() < deadline, f"farm@{node} does not answer a ping"
        time.sleep(2)


def test_the_example_renders_on_three_nodes_with_exact_audio():
    run = HOST.run(SUBMIT.format(out="hello.mp4") + " --verify")
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    job = run.stdout.split()[0]
    v = status(job)
    assert v["job"]["state"] == "done", v["job"]["reason"]
    check = v["job"]["result"]["verify"]
    assert check["ok"] and check["frames"] == 90, check
    assert abs(check["offsetMs"]) < ONE_SAMPLE_MS and abs(check["driftMs"]) < ONE_SAMPLE_MS, check
    assert [(c["first"], c["last"], c["state"]) for c in v["chunks"]] == [(0, 29, "done"), (30, 59, "done"),
                                                                        (60, 89, "done")]
    assert {c["node"] for c in v["chunks"]} <= set(NODES)
    frames = HOST.check_output("ffprobe -v error -count_frames -select_streams v -show_entries"
                               " stream=nb_read_frames -of csv=p=0 /var/lib/farm/out/hello.mp4")
    assert int(frames) == 90


def test_a_remotion_chunk_longer_than_the_stall_window_is_done_and_charges_no_node():
    """Remotion writes a chunk's output only at its end: a chunk that renders for longer than
    stall_after_s (20 s here) is seen progressing by its frames, not given up as hung."""
    stall = 20
    run = HOST.run("farm submit --project /var/lib/farm/examples/hello --composition Hello --out long.mp4"
                   " --nodes vca-node0 --props %s" % shlex.quote(json.dumps({"frames": 900})))
    assert run.rc == 0, run.stdout[-3000:] + run.stderr[-3000:]
    v = status(run.stdout.split()[0])
    assert v["job"]["state"] == "done", v["job"]["reason"]
    assert [(c["first"], c["last"]) for c in v["chunks"]] == [(0, 899)]
    render_s = v["chunks"][0]["timings"]["render_s"]
    assert render_s > stall, "the chunk rendered in %.1f s, within the stall window: nothing was shown" % render_s
    assert v["retries"] == 0 and v["failures"] == {}, (v["retries"], v["failures"], v["events"])
    print("\nRemotion chunk of 900 frames: %.1f s of render, stall_after_s %d: done, no node charged"
          % (render_s, stall))


def rendering(job: str, deadline: float) -> dict:
    """A chunk of the job being rendered, once one is."""
    while True:
        assert time.monotonic() < deadline, status(job)
        chunk = next((c for c in status(job)["chunks"] if c["state"] == "rendering"), None)
        if chunk:
            return chunk
        time.sleep(0.5)


def hang_a_rendering_node(job: str, deadline: float) -> tuple[dict, str]:
    """docker pause of a node while it renders a chunk of the job: (that chunk, the container). On a
    busy machine the cgroup freezer can give up ("unable to freeze"; runc thaws the container again):
    that is the fault injection failing, not the farm, so it is tried again on a chunk rendering then."""
    for _ in range(5):
        victim = rendering(job, deadline)
        container = f"{LAB}-{victim['node'].removeprefix('vca-')}"
        r = subprocess.run(["docker", "pause", container], capture_output=True, text=True, check=False)
        if r.returncode == 0:
            return victim, container
        assert "unable to freeze" in r.stderr, r.stderr
        time.sleep(1)
    raise AssertionError("docker pause of %s failed 5 times: %s" % (container, r.stderr))


def finished(job: str, deadline: float) -> dict:
    while (v := status(job))["job"]["state"] not in ("done", "failed", "cancelled"):
        assert time.monotonic() < deadline, v
        time.sleep(1)
    return v


def test_a_node_hung_mid_job_docker_pause_has_its_chunk_rendered_elsewhere():
    job = HOST.check_output(SUBMIT.format(out="paused.mp4") + " --detach").split()[0]
    deadline = time.monotonic() + 300
    victim, container = hang_a_rendering_node(job, deadline)      # a hung node: its sockets stay open
    paused_at = time.monotonic()
    try:
        while True:       # the broker gives up the silent worker after two to three heartbeats
            chunk = next(c for c in status(job)["chunks"] if c["idx"] == victim["idx"])
            if chunk["node"] != victim["node"] and chunk["state"] in ("rendering", "done"):
                break
            assert time.monotonic() - paused_at < 120, status(job)
            time.sleep(0.5)
        requeue_s = time.monotonic() - paused_at
    finally:
        subprocess.run(["docker", "unpause", container], check=True)
    v = finished(job, deadline)
    assert v["job"]["state"] == "done", v["job"]["reason"]
    check = v["job"]["result"]["verify"]
    assert check["ok"] and check["frames"] == 90, check
    assert sorted(c["idx"] for c in v["chunks"]) == [0, 1, 2]
    # the node was frozen, not cut off: its loss is its own, charged once (after excuse_wait_s)
    while (failures := status(job)["failures"]) != {victim["node"]: 1}:
        assert failures in ({}, {victim["node"]: 1}) and time.monotonic() < deadline + 60, status(job)
        time.sleep(1)
    print("docker pause of %s mid-chunk %d: rendering again on another node %.1f s later (lab)"
          % (victim["node"], victim["idx"], requeue_s))


def test_a_broker_restart_mid_job_charges_no_node():
    job = HOST.check_output(SUBMIT.format(out="restarted.mp4") + " --detach").split()[0]
    deadline = time.monotonic() + 300
    rendering(job, deadline)
    HOST.check_output("systemctl restart rabbitmq-server")       # an update, mid-job
    v = finished(job, deadline)
    assert v["job"]["state"] == "done", v["job"]["reason"]
    assert v["failures"] == {} and v["blocklist"] == [], v["events"]
    assert any("not charged" in e["text"] for e in v["events"]), v["events"]


def test_a_coordinator_killed_mid_job_ends_it_and_gives_its_nodes_back():
    """(This scenario has no smem, so no lease: apps/farm/tests/test_faults.py kills one at each step
    with a lease held.)"""
    job = HOST.check_output(SUBMIT.format(out="coordinator.mp4") + " --detach").split()[0]
    deadline = time.monotonic() + 300
    rendering(job, deadline)
    HOST.check_output("systemctl kill -s KILL farm-coordinator")   # systemd starts it again (Restart=)
    v = finished(job, deadline)
    assert v["job"]["state"] == "done", v["job"]["reason"]
    assert v["job"]["nodes_released"] == 1 and ping(v["chunks"][0]["node"]), v["job"]
    assert any("resuming" in e["text"] for e in v["events"]), v["events"]


def test_retention_runs_by_its_timer_and_keeps_the_outputs():
    assert HOST.service("farm-gc.timer").is_enabled and HOST.service("farm-gc.timer").is_running
    outputs = HOST.check_output("ls /var/lib/farm/out")
    HOST.check_output("systemctl start farm-gc.service")            # oneshot: returns when it is done
    assert HOST.check_output("systemctl show farm-gc.service -p Result --value") == "success"
    assert HOST.check_output("ls /var/lib/farm/out") == outputs     # the owner's files stay
    assert "freed " in HOST.check_output("journalctl -u farm-gc.service -o cat --no-pager")   # its summary


def test_a_worker_killed_mid_job_costs_a_retry_not_the_job():
    job = HOST.check_output(SUBMIT.format(out="killed.mp4") + " --detach").split()[0]
    deadline = time.monotonic() + 300
    victim = rendering(job, deadline)["node"]
    # Every process of the worker's unit, the render's node and chromium included: kill -9 of the node's worker.
    machine(victim.removeprefix("vca-")).check_output("systemctl kill -s KILL farm-worker")
    v = finished(job, deadline)
    assert v["job"]["state"] == "done", v["job"]["reason"]
    assert v["retries"] >= 1, v["events"]
    check = v["job"]["result"]["verify"]
    assert check["ok"] and check["frames"] == 90, check
    # The unit came back by itself (Restart=on-failure).
    n = machine(victim.removeprefix("vca-"))
    deadline = time.monotonic() + 60
    while not n.service("farm-worker").is_running:
        assert time.monotonic() < deadline
        time.sleep(1)
