"""The collector against real agents (on simulated trees) and a node that does not answer."""

from __future__ import annotations

import json
import socket

import pytest

from vcamon.collector import Collector, load_targets
from vcamon.hw.vca_sensors import read_all
from vcamon.store import Store


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
