"""The SQLite store: down rows, events, caps, rollups, retention, queries, platform, migration."""

from __future__ import annotations

import csv
import io
import json
import sqlite3

import pytest

from vcamon import store as store_module
from vcamon.store import DAY_S, ROLLUP_S, Scrape, Store

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
    # one span (the two 30 s apart): both deltas, the hottest temperature (Core 2's at the time)
    assert [(e["ts"], e["until_ts"], e["subject"], e["delta"], e["temperature_c"]) for e in ev] == [
        (T0 + 30, T0 + 60, "core 0:2", 5, 92.0),
    ]


def test_a_node_throttling_all_day_writes_a_row_an_hour_not_one_a_scrape(store):
    day = [T0 + 60 * i for i in range(1440)]            # a scrape a minute for 24 h, throttling at each
    for i, ts in enumerate(day):
        store.record_round(ts, [up("n", throttle={"package 0": i})])
    ev = store.events(0, kinds=["throttle"])
    assert len(ev) == 24 and sum(e["delta"] for e in ev) == len(day) - 1
    assert all(e["until_ts"] - e["ts"] < 3600 for e in ev)
    status = {r["node"]: r for r in store.status(day[-1])}
    assert status["n"]["throttle_24h"] == len(day) - 1


def test_throttle_events_apart_by_more_than_the_gap_are_two_spans(store):
    for ts, count in ((T0, 1), (T0 + 10, 2), (T0 + 20, 4), (T0 + 500, 9)):
        store._record_counters(ts, up("n", throttle={"package 0": count}))
    ev = store.events(0, kinds=["throttle"])
    assert [(e["ts"], e["until_ts"], e["delta"]) for e in ev] == [(T0 + 10, T0 + 20, 3), (T0 + 500, T0 + 500, 5)]


def test_cap_changes_are_events_and_status_shows_the_cap_in_force(store):
    store.record_round(T0, [up("n")])
    store.record_round(T0 + 30, [up("n", limits={"long_term": 35.0, "short_term": 40.0})])
    caps = [(e["subject"], e["value"]) for e in store.events(0, kinds=["cap"])]
    assert caps == [("long_term", 35.0), ("short_term", 40.0)]
    (row,) = store.status(T0 + 40)
    assert (row["pl1_w"], row["pl2_w"], row["up"], row["hottest_c"], row["power_w"]) == (35.0, 40.0, True, 50.0, 30.0)


def test_vcactl_states_land_on_the_named_nodes(store):
    store.record_round(T0, [up("host", vca_states={3: "link_down", 0: "net_device_ready"})],
                       vca_nodes={"host": {0: "vca-node0", 3: "vca-node3"}})
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
    assert lines[0] == "ts,iso_time,node,metric,label,value,resolution,platform"
    assert f"{T0}," in lines[1] and lines[1].endswith(",raw,unknown")   # up() sets no platform


def test_a_failed_round_leaves_nothing_half_written(store):
    store.record_round(T0, [up("n")])
    bad = up("m")
    bad.temps = {"Core 0": "not a number"}
    bad.power_w = object()                               # sqlite cannot bind this: the round fails
    with pytest.raises(sqlite3.Error):
        store.record_round(T0 + 30, [up("n"), bad])
    assert store.db.execute("SELECT count(*) FROM scrapes WHERE ts = ?", (T0 + 30,)).fetchone()[0] == 0


# The schema of vcamon 0.1.0, before the platform was recorded (store.py at the first release).
OLD_SCHEMA = """
CREATE TABLE series (id INTEGER PRIMARY KEY, node TEXT NOT NULL, metric TEXT NOT NULL,
    label TEXT NOT NULL DEFAULT '', UNIQUE (node, metric, label));
CREATE TABLE samples (series_id INTEGER NOT NULL REFERENCES series(id), ts INTEGER NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (series_id, ts)) WITHOUT ROWID;
CREATE TABLE rollups (series_id INTEGER NOT NULL REFERENCES series(id), ts INTEGER NOT NULL, min REAL NOT NULL,
    mean REAL NOT NULL, max REAL NOT NULL, n INTEGER NOT NULL, PRIMARY KEY (series_id, ts)) WITHOUT ROWID;
CREATE TABLE scrapes (node TEXT NOT NULL, ts INTEGER NOT NULL, up INTEGER NOT NULL, duration_ms REAL, error TEXT,
    PRIMARY KEY (node, ts)) WITHOUT ROWID;
CREATE TABLE events (id INTEGER PRIMARY KEY, ts INTEGER NOT NULL, node TEXT NOT NULL, kind TEXT NOT NULL,
    subject TEXT, delta INTEGER, value REAL, temperature_c REAL, detail TEXT);
CREATE INDEX events_ts ON events (ts);
CREATE TABLE caps (node TEXT NOT NULL, ts INTEGER NOT NULL, constraint_name TEXT NOT NULL, watts REAL,
    PRIMARY KEY (node, constraint_name, ts)) WITHOUT ROWID;
CREATE TABLE counters (node TEXT NOT NULL, counter TEXT NOT NULL, value INTEGER NOT NULL,
    PRIMARY KEY (node, counter)) WITHOUT ROWID;
CREATE TABLE nodes (node TEXT PRIMARY KEY, url TEXT, up INTEGER, since INTEGER, last_seen INTEGER,
    last_error TEXT, vca_state TEXT, vca_state_since INTEGER);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
INSERT INTO series VALUES (1, 'vca-node4', 'temp', 'Package id 0'), (2, 'vca-node4', 'power', '');
INSERT INTO samples VALUES (1, 1700000100, 71.5), (2, 1700000100, 30.25), (1, 1700000130, 72.0);
INSERT INTO rollups VALUES (1, 1699999800, 60.0, 65.0, 70.0, 10);
INSERT INTO scrapes VALUES ('vca-node4', 1700000100, 1, 3.5, NULL), ('vca-node3', 1700000100, 0, 10.0, 'timed out');
INSERT INTO events VALUES (1, 1700000100, 'vca-node3', 'down', NULL, NULL, NULL, NULL, 'timed out');
INSERT INTO caps VALUES ('vca-node4', 1700000100, 'long_term', 35.0);
INSERT INTO counters VALUES ('vca-node4', 'core 0:0', 4);
INSERT INTO nodes VALUES ('vca-node4', 'http://a:9478/metrics', 1, 1700000100, 1700000130, NULL, 'net_device_ready',
    1700000100), ('vca-node3', 'http://b:9478/metrics', 0, 1700000100, NULL, 'timed out', 'link_down', 1700000100);
INSERT INTO meta VALUES ('rolled_up_to', '1700000100');
"""
OLD_TABLES = ("series", "samples", "rollups", "scrapes", "events", "caps", "counters", "nodes", "meta")
OLD_NODE_COLUMNS = "node, url, up, since, last_seen, last_error, vca_state, vca_state_since"
OLD_EVENT_COLUMNS = "id, ts, node, kind, subject, delta, value, temperature_c, detail"


def old_database(path):
    con = sqlite3.connect(path)
    con.executescript(OLD_SCHEMA)
    con.close()


def dump(db):
    columns = {"nodes": OLD_NODE_COLUMNS, "events": OLD_EVENT_COLUMNS}
    return {t: sorted(db.execute("SELECT %s FROM %s" % (columns.get(t, "*"), t)).fetchall()) for t in OLD_TABLES}


def test_a_database_of_the_old_schema_is_migrated_once_and_keeps_every_row(tmp_path):
    path = str(tmp_path / "old.db")
    old_database(path)
    con = sqlite3.connect(path)
    before = dump(con)
    con.close()

    store = Store(path)
    assert store.migrated == ["nodes.platform", "events.until_ts"]
    assert dump(store.db) == before                      # nothing lost, nothing changed
    store.record_round(1_700_000_160, [up("vca-node4", platform="lab")])
    store.close()

    again = Store(path)                                  # a second open changes nothing
    assert again.migrated == []
    status = {r["node"]: r for r in again.status(1_700_000_170)}
    assert status["vca-node4"]["platform"] == "lab" and status["vca-node4"]["vca_state"] == "net_device_ready"
    assert status["vca-node3"]["platform"] is None and status["vca-node3"]["error"] == "timed out"
    out = io.StringIO()
    again.export_csv(out, 1_699_999_000, 1_700_000_200, node="vca-node4")
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    by_ts = {(r["ts"], r["metric"]): r["platform"] for r in rows}
    assert by_ts[("1699999800", "temp")] == "unknown"    # rollup and samples stored before the platform was
    assert by_ts[("1700000100", "power")] == "unknown"
    assert by_ts[("1700000160", "power")] == "lab"
    assert len(rows) == 1 + 3 + 3                        # the old rollup, the old raw samples, the new round
    again.close()


def test_the_platform_is_recorded_per_sample_and_node(store):
    store.record_round(T0, [up("a", platform="lab"), up("b", platform="hardware"), up("c")])
    store.record_round(T0 + 30, [up("a", platform="lab"), up("b", platform="hardware"), up("c", platform="bogus")])
    store.record_round(T0 + 60, [up("a", platform="hardware"), down("b"), up("c", platform="unknown")])
    assert store.db.execute("SELECT node, ts, platform FROM platforms ORDER BY node, ts").fetchall() == [
        ("a", T0, "lab"), ("a", T0 + 60, "hardware"), ("b", T0, "hardware"), ("c", T0, "unknown")]
    status = {r["node"]: r["platform"] for r in store.status(T0 + 70)}
    assert status == {"a": "hardware", "b": "hardware", "c": "unknown"}   # b is down: its last platform
    rows = list(store.export_rows(T0, T0 + 60, node="a"))
    assert [(r["ts"], r["platform"]) for r in rows if r["metric"] == "power"] == [
        (T0, "lab"), (T0 + 30, "lab"), (T0 + 60, "hardware")]
    assert store.chart("a", T0, T0 + 20)["platforms"] == ["lab"]
    assert store.chart("a", T0, T0 + 90)["platforms"] == ["hardware", "lab"]
    out = io.StringIO()
    store.export_json(out, T0, T0 + 60, node="b")
    assert {r["platform"] for r in json.loads(out.getvalue())} == {"hardware"}
    store.rollup(T0 + ROLLUP_S)                         # one bucket with both of a's platforms
    store.prune(T0 + 30 * DAY_S)
    mean = [r for r in store.export_rows(T0 - 1, T0 + 60, node="a") if r["metric"] == "power"]
    assert [(r["resolution"], r["platform"]) for r in mean] == [("5m", "mixed")]


def test_a_migration_another_process_finished_first_is_not_applied_twice(tmp_path, monkeypatch):
    path = str(tmp_path / "old.db")
    old_database(path)
    first = Store(path)                                  # the other process: it migrates the file
    assert first.migrated == ["nodes.platform", "events.until_ts"]
    db = store_module.connect(path)
    real = store_module._columns
    looks = []

    def stale_then_real(con, table):                     # our first look happened before the other's ALTER
        looks.append(table)
        return real(con, table) - {"platform"} if len(looks) == 1 else real(con, table)

    monkeypatch.setattr(store_module, "_columns", stale_then_real)
    assert store_module.migrate(db) == []                # looked again under the write lock: nothing to add
    assert len(looks) == 1 + len(store_module.MIGRATIONS)   # the stale look, then each table under the lock
    db.close()
    first.close()
