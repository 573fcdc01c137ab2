"""The collector against real agents (on simulated trees) and a node that does not answer."""

from __future__ import annotations

import json
import logging
import socket
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from conftest import AGENT_TOKEN, http_server
from vcamon.cli import main
from vcamon.collector import Collector, load_targets, scrape
from vcamon.hw.vca_sensors import read_all
from vcamon.store import AUTH_FAILED, Store


def dead_url():
    """A port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "http://127.0.0.1:%d/metrics" % s.getsockname()[1]


def test_live_node_rows_and_down_rows_and_the_collector_keeps_going(agent, node_tree, tmp_path):
    store = Store(str(tmp_path / "db"))
    targets = [{"node": "vca-node0", "url": agent, "vca_node": 0},
               {"node": "vca-node3", "url": dead_url(), "vca_node": 3}]
    collector = Collector(store, targets, interval=1.0)
    for i in range(3):
        collector.round(now=1_700_000_000 + 30 * i)
    rows = dict(store.db.execute("SELECT node, group_concat(up) FROM scrapes GROUP BY node").fetchall())
    assert rows == {"vca-node0": "1,1,1", "vca-node3": "0,0,0"}
    samples = store.db.execute(
        "SELECT count(*) FROM samples v JOIN series s ON s.id = v.series_id WHERE s.node = 'vca-node0'").fetchone()[0]
    assert samples >= 15
    status = {r["node"]: r for r in store.status(1_700_000_060)}
    assert status["vca-node3"]["up"] is False and "Connection refused" in status["vca-node3"]["error"]
    assert status["vca-node0"]["pl1_w"] == 45.0
    # The platform the agent's sensors reader decided, for the node and for each of its samples.
    platform = read_all(str(node_tree.root), sample_seconds=0)["platform"]
    assert status["vca-node0"]["platform"] == platform and status["vca-node3"]["platform"] is None
    assert {r["platform"] for r in store.export_rows(0, 1_700_000_060, node="vca-node0")} == {platform}


@pytest.mark.parametrize("content, words", [
    ('{"node": "x"}', "expected a list"),
    ('[{"node": "a"}]', "target 0 needs 'node' and 'url'"),
    ('[{"node": "a", "url": "u"}, {"node": "a", "url": "v"}]', "node a listed twice"),
])
def test_bad_targets_file_is_a_clear_error(tmp_path, content, words):
    path = tmp_path / "targets.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=words):
        load_targets(str(path))


def test_targets_file_round_trip(tmp_path):
    path = tmp_path / "targets.json"
    path.write_text(json.dumps([{"node": "host", "url": "http://127.0.0.1:9478/metrics"}]))
    assert load_targets(str(path))[0]["node"] == "host"


def token_file(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_the_collector_sends_each_target_its_token_and_names_a_refusal(locked_agent, agent, tmp_path, capsys):
    store = Store(str(tmp_path / "db"))
    targets = [
        {"node": "right", "url": locked_agent, "token_file": token_file(tmp_path, "right", AGENT_TOKEN + "\n")},
        {"node": "wrong", "url": locked_agent, "token_file": token_file(tmp_path, "wrong", "x" * 32 + "\n")},
        {"node": "none", "url": locked_agent},
        {"node": "open", "url": agent, "token_file": token_file(tmp_path, "open", AGENT_TOKEN)},  # sent, not needed
        {"node": "dead", "url": dead_url()},
    ]
    collector = Collector(store, targets, interval=1.0)
    results = {r.node: r for r in collector.round(now=1_700_000_000)}
    assert results["right"].ok and results["right"].temps and results["open"].ok
    assert results["wrong"].error == ("authentication failed: the agent refused the token in %s (HTTP 401)"
                                      % targets[1]["token_file"])
    assert results["none"].error == ("authentication failed: the agent wants a token and this target has no "
                                     "token_file (HTTP 401)")
    assert "Connection refused" in results["dead"].error and AUTH_FAILED not in results["dead"].error
    status = {r["node"]: r for r in store.status(1_700_000_000)}
    assert {n for n, r in status.items() if r["auth_failed"]} == {"wrong", "none"}
    store.close()

    assert main(["status", "--db", str(tmp_path / "db")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.partition("\n\n")[0].splitlines()[1:]}
    assert {n: r[1] for n, r in rows.items()} == {"right": "up", "open": "up", "wrong": "AUTH-FAIL",
                                                  "none": "AUTH-FAIL", "dead": "DOWN"}
    assert "AUTH-FAIL wrong: authentication failed: the agent refused the token in %s" % targets[1]["token_file"] in out
    assert AGENT_TOKEN not in out and "x" * 32 not in out


def test_a_token_file_that_cannot_be_read_is_that_targets_error_only(locked_agent, tmp_path, caplog):
    (tmp_path / "a-directory").mkdir()
    bad = {"missing": str(tmp_path / "missing"), "empty": token_file(tmp_path, "empty", "\n"),
           "short": token_file(tmp_path, "short", "abc"), "a-directory": str(tmp_path / "a-directory")}
    targets = [{"node": name, "url": dead_url(), "token_file": path} for name, path in bad.items()]
    targets.append({"node": "good", "url": locked_agent,
                    "token_file": token_file(tmp_path, "good", AGENT_TOKEN)})
    with caplog.at_level(logging.ERROR, logger="vcamon.collector"):
        collector = Collector(Store(str(tmp_path / "db")), targets, interval=1.0)
    logged = {r.getMessage().split(":")[0] for r in caplog.records if r.levelno == logging.ERROR}
    assert logged == set(bad)                                            # one clear line per bad target, at start
    results = {r.node: r for r in collector.round(now=1_700_000_000)}
    assert results["good"].ok
    for name, words in (("missing", "No such file"), ("empty", "is empty"), ("short", "at least 16"),
                        ("a-directory", "Is a directory")):
        error = results[name].error
        assert error.startswith("authentication failed: no token to send (token file %s" % bad[name]), error
        assert words in error and "Connection refused" not in error      # nothing was sent without the token


def test_a_token_file_is_read_once_at_start(locked_agent, tmp_path):
    path = token_file(tmp_path, "token", AGENT_TOKEN)
    collector = Collector(Store(str(tmp_path / "db")), [{"node": "n", "url": locked_agent, "token_file": path}], 1.0)
    Path(path).write_text("y" * 32)
    assert collector.round(now=1_700_000_000)[0].ok


def test_the_token_is_not_sent_on_to_a_redirect(tmp_path):
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization")))
            if self.path == "/metrics":
                self.send_response(302)
                self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                body = b'vcamon_agent_info{node="n"} 1.0\n'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    with http_server(Handler) as base:
        target = {"node": "n", "url": base + "/metrics", "token_file": token_file(tmp_path, "t", AGENT_TOKEN)}
        assert scrape(target, 10, AGENT_TOKEN).ok
    assert seen == [("/metrics", "Bearer " + AGENT_TOKEN), ("/elsewhere", None)]


@pytest.mark.parametrize("token_file_value", ["", None, 3, ["a"]])
def test_a_token_file_that_is_not_a_path_is_a_clear_error(tmp_path, token_file_value):
    path = tmp_path / "targets.json"
    path.write_text(json.dumps([{"node": "a", "url": "u", "token_file": token_file_value}]))
    with pytest.raises(ValueError, match="target 0: 'token_file' must be a path"):
        load_targets(str(path))
