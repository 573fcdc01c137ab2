"""The SQLite store: down rows, events, caps, rollups, retention, queries."""

from __future__ import annotations

import io
import sqlite3

import pytest

from vcamon.store import DAY_S, Scrape, Store

T0 = 1_700_000_100 // 300 * 300


def up(node, temp=50.0, power=30.0, throttle=None, limits=None, **kw):
    return Scrape(node=node, ok=True, temps={"Package id 0": temp, "Core 2": temp - 1}, power_w=power,
                  throttle=throttle or {"core 0:2": 0, "package 0": 0},
                  limits=limits or {"long_term": 45.0, "short_term": 56.25}, **kw)


def down(node):
    return Scrape(node=node, ok=False, error="URLError: timed out")


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "vcamon.db"))
    yield s
    s.close()


def test_wal_mode(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_down_node_gets_rows_and_one_event_per_outage(store):
    for i in range(3):
        store.record_round(T0 + 30 * i, [up("vca-node0"), down("vca-node3")])
    store.record_round(T0 + 90, [up("vca-node0"), up("vca-node3")])
    rows = store.db.execute("SELECT ts, up FROM scrapes WHERE node = 'vca-node3' ORDER BY ts").fetchall()
    assert rows == [(T0, 0), (T0 + 30, 0), (T0 + 60, 0), (T0 + 90, 1)]
    kinds = [(e["node"], e["kind"], e["ts"]) for e in store.events(0)]
    assert kinds == [("vca-node3", "down", T0), ("vca-node3", "up", T0 + 90)]
    assert store.events(0, kinds=["down"])[0]["detail"] == "URLError: timed out"


def test_throttle_events_carry_delta_and_temperature_and_survive_a_reset(store):
    store.record_round(T0, [up("n", throttle={"core 0:2": 5, "package 0": 1})])
    store.record_round(T0 + 30, [up("n", temp=93.0, throttle={"core 0:2": 8, "package 0": 1})])
    store.record_round(T0 + 60, [up("n", throttle={"core 0:2": 2, "package 0": 1})])   # node rebooted
    ev = store.events(0, kinds=["throttle"])
    assert [(e["ts"], e["subject"], e["delta"], e["temperature_c"]) for e in ev] == [
        (T0 + 30, "core 0:2", 3, 92.0),          # Core 2's temperature at the time
        (T0 + 60, "core 0:2", 2, 49.0),
    ]


def test_cap_changes_are_events_and_status_shows_the_cap_in_force(store):
    store.record_round(T0, [up("n")])
    store.record_round(T0 + 30, [up("n", limits={"long_term": 35.0, "short_term": 40.0})])
    caps = [(e["subject"], e["value"]) for e in store.events(0, kinds=["cap"])]
    assert caps == [("long_term", 35.0), ("short_term", 40.0)]
    (row,) = store.status(T0 + 40)
    assert (row["pl1_w"], row["pl2_w"], row["up"], row["hottest_c"], row["power_w"]) == (35.0, 40.0, True, 50.0, 30.0)


def test_vcactl_states_land_on_the_named_nodes(store):
    store.record_round(T0, [up("host", vca_states={3: "link_down", 0: "net_device_ready"})],
                       vca_nodes={0: "vca-node0", 3: "vca-node3"})
    states = {r["node"]: r["vca_state"] for r in store.status(T0)}
    assert states == {"host": None, "vca-node0": "net_device_ready", "vca-node3": "link_down"}


def test_rollups_min_mean_max_then_raw_pruned_and_rollups_kept(tmp_path):
    store = Store(str(tmp_path / "r.db"), raw_days=1, rollup_days=365)
    for i in range(10):                                  # 10 samples over 300 s: one bucket
        store.record_round(T0 + 30 * i, [up("n", power=20.0 + i)])
    assert store.rollup(T0 + 300) == 3                   # one row per series: power and two temperatures
    mn, mean, mx, n = store.db.execute(
        "SELECT min, mean, max, n FROM rollups r JOIN series s ON s.id = r.series_id "
        "WHERE s.metric = 'power'").fetchone()
    assert (mn, mean, mx, n) == (20.0, 24.5, 29.0, 10)
    store.prune(T0 + 2 * DAY_S)
    assert store.db.execute("SELECT count(*) FROM samples").fetchone()[0] == 0
    assert store.db.execute("SELECT count(*) FROM rollups").fetchone()[0] == 3
    chart = store.chart("n", T0 - DAY_S, T0 + 3 * DAY_S)
    assert chart["resolution"] == "10m"             # four days in <= 720 points: two rollups per point
    assert chart["power"] == [24.5] and chart["pl1"] == [45.0]


def test_rollup_does_not_fold_an_unfinished_bucket(store):
    store.record_round(T0 + 10, [up("n")])
    assert store.rollup(T0 + 299) == 0
    assert store.db.execute("SELECT count(*) FROM rollups").fetchone()[0] == 0


def test_raw_samples_are_not_pruned_before_they_are_rolled_up(tmp_path):
    store = Store(str(tmp_path / "r.db"), raw_days=1)
    store.record_round(T0, [up("n")])
    store.prune(T0 + 3 * DAY_S)
    assert store.db.execute("SELECT count(*) FROM samples").fetchone()[0] == 3


def test_chart_is_aligned_with_caps_and_events(store):
    store.record_round(T0, [up("n", throttle={"core 0:2": 0, "package 0": 0})])
    store.record_round(T0 + 30, [up("n", temp=95.0, throttle={"core 0:2": 1, "package 0": 0},
                                    limits={"long_term": 35.0, "short_term": 40.0})])
    c = store.chart("n", T0, T0 + 60)
    assert c["resolution"] == "raw" and c["t"] == [T0, T0 + 30]
    assert c["temps"]["Package id 0"] == [50.0, 95.0]
    assert c["pl1"] == [45.0, 35.0] and c["pl2"] == [56.25, 40.0]
    assert [e["kind"] for e in c["events"]] == ["throttle", "cap", "cap"]


def test_export_csv(store):
    store.record_round(T0, [up("n")])
    out = io.StringIO()
    assert store.export_csv(out, T0 - 10, T0 + 10) == 3
    lines = out.getvalue().splitlines()
    assert lines[0] == "ts,iso_time,node,metric,label,value,resolution"
    assert f"{T0}," in lines[1] and lines[1].endswith(",raw")


def test_a_failed_round_leaves_nothing_half_written(store):
    store.record_round(T0, [up("n")])
    bad = up("m")
    bad.temps = {"Core 0": "not a number"}
    bad.power_w = object()                               # sqlite cannot bind this: the round fails
    with pytest.raises(sqlite3.Error):
        store.record_round(T0 + 30, [up("n"), bad])
    assert store.db.execute("SELECT count(*) FROM scrapes WHERE ts = ?", (T0 + 30,)).fetchone()[0] == 0
