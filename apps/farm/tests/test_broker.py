"""One broker user per node, against a real RabbitMQ: what a node's user may not do, a report that
claims another node, rabbitmqctl's own listener, and the API's listen guard.

Every engine test runs its workers as their own nodes' users (farm.broker_users's permissions), so a job
completing there is the proof that those permissions are enough."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import amqp
import pytest
from _engine import (  # noqa: F401 (fixtures)
    _listeners,
    assert_every_chunk_once,
    broker_fixture,
    make_farm_fixture,
    wait_for,
)
from kombu import Connection, Exchange, Producer

from farm import api, cli
from farm.config import Settings

REFUSED = 403     # AMQP's ACCESS_REFUSED


def refused(url: str, action) -> int:
    """The AMQP reply code the broker closed the channel with while doing action(channel)."""
    with Connection(url) as conn:
        channel = conn.channel()
        with pytest.raises(amqp.exceptions.AMQPError) as e:
            action(channel)
        return e.value.reply_code


def test_a_worker_with_its_nodes_rights_only_renders_a_job_and_is_refused_nothing(make_farm):
    """Its user, not the broker's guest, and no operation of it refused along the way (one would be a
    right it lacks: the Celery event heartbeat's celeryev exchange, say, which it does without)."""
    farm = make_farm()
    node = farm.nodes[0]
    farm.start_workers([node])
    farm.start_coordinator()
    job_id = farm.submit(frames=20, nodes=[node])                  # two chunks
    farm.wait_state(job_id, ("done", "failed"), timeout=120)
    assert_every_chunk_once(farm, job_id)
    r = farm.broker.ctl("list_connections", "user", "--silent")
    assert r.returncode == 0, r.stdout + r.stderr
    ours = {u for u in r.stdout.split() if u.startswith("farm-%s-" % farm.tag)}
    assert ours == {"farm-" + node}, r.stdout
    log = (farm.broker.root / "log" / ("%s.log" % farm.broker.env["RABBITMQ_NODENAME"])).read_text()
    refused = [line for line in log.splitlines() if "refused for user 'farm-%s-" % farm.tag in line]
    assert not refused, refused


def test_a_node_user_reads_neither_the_reports_nor_another_nodes_queues(make_farm):
    farm = make_farm()
    farm.start_workers(farm.nodes[:2])
    mine, other = farm.nodes[:2]
    url = farm.node_url(mine)
    reports = farm.settings["reports_queue"]
    farm.start_coordinator()                       # declares the reports exchange and queue
    wait_for("the reports queue", lambda: _declared(farm.broker.url, reports), 60)
    assert refused(url, lambda ch: ch.basic_consume(reports, callback=lambda m: None)) == REFUSED
    assert refused(url, lambda ch: ch.basic_consume("farm@%s.celery.pidbox" % other, callback=lambda m: None)) \
        == REFUSED
    assert refused(url, lambda ch: ch.basic_consume("farm.node." + other, callback=lambda m: None)) == REFUSED
    assert refused(url, lambda ch: ch.queue_declare("anything-else")) == REFUSED
    assert refused(url, lambda ch: ch.queue_delete(reports)) == REFUSED
    # nor publish into any queue through the default exchange (it reaches every queue by name): the
    # broker closes the channel, which the next synchronous call meets
    assert refused(url, lambda ch: (ch.basic_publish(amqp.Message("x"), "", reports),
                                    ch.exchange_declare("amq.direct", "direct", passive=True))) == REFUSED
    # nor send a remote-control command to every worker
    assert refused(url, lambda ch: (ch.basic_publish(amqp.Message("x"), "celery.pidbox", ""),
                                    ch.exchange_declare("amq.direct", "direct", passive=True))) == REFUSED


def _declared(url: str, queue: str) -> bool:
    try:
        with Connection(url) as conn:
            conn.default_channel.queue_declare(queue, passive=True)
        return True
    except Exception:
        return False


def test_a_report_is_applied_only_from_the_node_it_names(make_farm):
    farm = make_farm()
    a, b = farm.nodes[:2]
    farm.start_coordinator()
    job_id = farm.submit(frames=20, nodes=[a, b])            # no worker: its chunks stay queued
    wait_for("the job running", lambda: farm.job(job_id)["state"] == "running", 60)
    attempt = farm.attempts(job_id)[0]
    s = Settings(**{k: v for k, v in farm.settings.items() if k in Settings.__dataclass_fields__})
    exchange = Exchange(s.reports_queue, "direct", durable=True)

    def publish(url: str, body: dict, **props) -> None:
        with Connection(url, transport_options={"confirm_publish": True}) as conn:   # on the broker, or refused
            Producer(conn.channel()).publish(body, exchange=exchange, routing_key=s.reports_queue,
                                             serializer="json", **props)

    forged = {"event": "started", "ts": time.time(), "job": job_id, "index": attempt["idx"],
              "attempt": attempt["id"], "first": 0, "last": 9, "key": attempt["key"]}
    # node a's user, claiming node b; no user_id at all; the coordinator's own user, claiming a node
    publish(farm.node_url(a), {**forged, "node": b}, user_id=s.node_user(a))
    publish(farm.node_url(a), {**forged, "node": b})
    publish(farm.broker.url, {**forged, "node": a}, user_id="guest")
    wait_for("three refusals in the coordinator's log",
             lambda: farm.log("coordinator.log").count("report refused") >= 3, 60,
             why=lambda: farm.log("coordinator.log"))
    assert farm.attempts(job_id)[0]["state"] == "queued", farm.attempts(job_id)[0]   # none was applied
    log = farm.log("coordinator.log")
    assert "it says node %r, but the broker user that sent it is %r" % (b, s.node_user(a)) in log
    # and the broker itself refuses a user_id that is not the connection's (its validation)
    with pytest.raises(amqp.exceptions.PreconditionFailed):
        publish(farm.node_url(a), {**forged, "node": b}, user_id=s.node_user(b))
    # the node's own report, under its own name, is applied
    publish(farm.node_url(a), {**forged, "node": a}, user_id=s.node_user(a))
    wait_for("node a's report applied", lambda: farm.attempts(job_id)[0]["state"] == "started", 60)
    assert farm.attempts(job_id)[0]["node"] == a


def test_the_cli_prints_a_nodes_user_and_its_permissions(capsys):
    assert cli.main(["broker-permissions", "--node", "vca-node0"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["user"] == "farm-vca-node0"
    assert got["read"] == (r"^(farm\.node\.vca\-node0|farm@vca\-node0\.celery\.pidbox|farm\.job\.[0-9a-f]+"
                           r"|celery\.pidbox)$")
    assert "farm\\.reports" in got["write"] and "farm\\.reports" not in got["read"]


def test_rabbitmqctl_listens_on_loopback_only(broker):
    """rabbitmqctl is an Erlang node of its own while it runs, listening for distribution on one of
    35672..35682: on every address unless CTL_ERL_ARGS pins it (the role's rabbitmq-env.conf does)."""
    ports = set(range(35672, 35683))

    def listening_while_it_runs(env: dict) -> list:
        p = subprocess.Popen(broker.ctl_argv("eval", "timer:sleep(6000)."), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        try:
            return wait_for("rabbitmqctl's listener", lambda: _listeners(ports), 60, every=0.05)
        finally:
            p.wait(60)

    pinned = listening_while_it_runs(broker.env)
    assert {addr for addr, _ in pinned} <= {"0100007F"}, pinned          # 127.0.0.1 only
    wait_for("the CLI to be gone", lambda: not _listeners(ports), 30)
    unpinned = listening_while_it_runs({**broker.env, "RABBITMQ_CTL_ERL_ARGS": " "})   # as out of the box
    assert {addr for addr, _ in unpinned} & {"00000000", "00000000000000000000000000000000"}, unpinned


@pytest.mark.parametrize("listen", ["0:8790", "0.0.0.0:8790", "[::]:8790", "[::0]:8790", "[::ffff:0.0.0.0]:8790",
                                    ":8790", "wild.test:8790"])
def test_the_api_refuses_every_address_unless_asked(listen, monkeypatch):
    real = socket.getaddrinfo

    def resolve(host, *args, **kw):      # a name an /etc/hosts entry points at every address
        return real("0.0.0.0" if host == "wild.test" else host, *args, **kw)
    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(SystemExit, match="refusing to listen on every address"):
        api.listen_address(Settings(api_listen=listen))
    assert api.listen_address(Settings(api_listen=listen, allow_public_listen=True))[1] == 8790


def test_farm_api_refuses_every_address_with_one_line(tmp_path):
    """The command, as the unit runs it. Its token file is missing, so that a guard that let it
    through fails on reading it and never binds every address here."""
    config = tmp_path / "farm.toml"
    config.write_text('api_listen = "[::]:8790"\napi_token_file = "%s"\n' % (tmp_path / "no-token"))
    src = str(Path(api.__file__).parent.parent)
    r = subprocess.run([sys.executable, "-m", "farm", "--config", str(config), "api"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": src}, timeout=120, check=False)
    assert r.returncode == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.splitlines() == ["farm api: refusing to listen on every address ('[::]:8790' resolves to ::): "
                                     "name one address, or set allow_public_listen = true"], r.stderr


def test_the_api_listens_where_the_inventory_says():
    assert api.listen_address(Settings(api_listen="127.0.0.1:8790")) == ("127.0.0.1", 8790)
    assert api.listen_address(Settings(api_listen="172.31.1.254:8790")) == ("172.31.1.254", 8790)  # no opt-in
    with pytest.raises(SystemExit, match="does not resolve"):
        api.listen_address(Settings(api_listen="no-such-name.invalid:8790"))
    with pytest.raises(SystemExit, match="HOST:PORT"):
        api.listen_address(Settings(api_listen="127.0.0.1"))
