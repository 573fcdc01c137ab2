"""The collector's SQLite file: raw samples, 5-minute rollups, scrapes, events, caps.

One file in WAL mode. Each scrape round is one transaction, so a collector
killed mid-write leaves the last whole round and nothing half-written.
The schema is documented in apps/vcamon/README.md. A database made by an
older vcamon is brought up to this schema when it is opened (MIGRATIONS:
columns added in place, once; nothing is dropped or rewritten).
"""

from __future__ import annotations

import csv
import json
import logging
import sqlite3
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

LOG = logging.getLogger("vcamon.store")
ROLLUP_S = 300
DAY_S = 86400
# Where a node's figures come from, as its agent reports it (the sensors reader's result["platform"]).
# Anything else an agent says, or nothing (an older agent), is stored as unknown.
PLATFORMS = ("hardware", "lab", "unknown")
# How a scrape error starts when the collector could not authenticate to the agent (a 401, or no token to
# send): `vcamon status` and the page show such a node as an authentication failure, not as merely down.
AUTH_FAILED = "authentication failed"

SCHEMA = """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    node TEXT NOT NULL,
    metric TEXT NOT NULL,          -- temp | power
    label TEXT NOT NULL DEFAULT '', -- coretemp label for temp ('Core 0', 'Package id 0')
    UNIQUE (node, metric, label)
);
CREATE TABLE IF NOT EXISTS samples (
    series_id INTEGER NOT NULL REFERENCES series(id),
    ts INTEGER NOT NULL,           -- unix seconds
    value REAL NOT NULL,
    PRIMARY KEY (series_id, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollups (
    series_id INTEGER NOT NULL REFERENCES series(id),
    ts INTEGER NOT NULL,           -- start of the 5-minute bucket
    min REAL NOT NULL,
    mean REAL NOT NULL,
    max REAL NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (series_id, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS scrapes (
    node TEXT NOT NULL,
    ts INTEGER NOT NULL,
    up INTEGER NOT NULL,           -- 1 answered, 0 did not
    duration_ms REAL,
    error TEXT,
    PRIMARY KEY (node, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    node TEXT NOT NULL,
    kind TEXT NOT NULL,            -- throttle | down | up | cap | state
    subject TEXT,                  -- core '0:2' / 'package 0'; constraint; vcactl state
    delta INTEGER,                 -- throttle count increase
    value REAL,                    -- cap watts
    temperature_c REAL,            -- at the time of a throttle event (the span's hottest)
    detail TEXT,                   -- the error of a down event
    until_ts INTEGER               -- a throttle span's last event (MIGRATIONS)
);
CREATE INDEX IF NOT EXISTS events_ts ON events (ts);
CREATE TABLE IF NOT EXISTS caps (
    node TEXT NOT NULL,
    ts INTEGER NOT NULL,           -- when this limit was first seen in force
    constraint_name TEXT NOT NULL, -- long_term (PL1) | short_term (PL2)
    watts REAL,
    PRIMARY KEY (node, constraint_name, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    node TEXT NOT NULL,
    counter TEXT NOT NULL,         -- 'core 0:2' | 'package 0'
    value INTEGER NOT NULL,
    PRIMARY KEY (node, counter)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY,
    url TEXT,
    up INTEGER,
    since INTEGER,                 -- when up last changed
    last_seen INTEGER,
    last_error TEXT,
    vca_state TEXT,                -- from the host agent's vcactl status
    vca_state_since INTEGER,
    platform TEXT                  -- hardware | lab | unknown: what the agent last said (MIGRATIONS)
);
CREATE TABLE IF NOT EXISTS platforms (
    node TEXT NOT NULL,
    ts INTEGER NOT NULL,           -- first round the agent reported this platform
    platform TEXT NOT NULL,        -- hardware | lab | unknown; in force until the node's next row
    PRIMARY KEY (node, ts)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""

# Columns added since the first schema: (table, column, declaration). Applied at open when missing.
MIGRATIONS = (
    ("nodes", "platform", "TEXT"),
    ("events", "until_ts", "INTEGER"),
)
# Throttle events of one counter are one row per span, not one per scrape (a node throttling all day
# wrote ~86,000 rows, kept a year): an event within THROTTLE_GAP_S of its span's last one extends it,
# and a span is closed after THROTTLE_SPAN_S, so the rows of the last 24 h still count what they say.
THROTTLE_GAP_S = 120
THROTTLE_SPAN_S = 3600


@dataclass
class Scrape:
    """One agent's answer in one round: parsed samples or the error."""

    node: str
    url: str = ""
    ok: bool = False
    duration_ms: float | None = None
    error: str | None = None
    temps: dict = field(default_factory=dict)        # label -> C
    power_w: float | None = None
    limits: dict = field(default_factory=dict)       # constraint -> W
    throttle: dict = field(default_factory=dict)     # 'core 0:2' / 'package 0' -> count
    vca_states: dict = field(default_factory=dict)   # vcactl node index -> state (host agent only)
    platform: str | None = None                      # hardware | lab | unknown (vcamon_platform_info)
    units: dict = field(default_factory=dict)        # service -> ActiveState (vcamon_unit_state)


def connect(path, timeout=30.0):
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA foreign_keys=ON")
    return db


def _columns(db, table):
    return {row[1] for row in db.execute("PRAGMA table_info(%s)" % table)}


def migrate(db):
    """Add the columns an older database lacks (MIGRATIONS); a no-op on a current one.

    Checked and altered inside one write transaction, so two processes opening
    the same old file at once add each column once.
    """
    if all(column in _columns(db, table) for table, column, _ in MIGRATIONS):
        return []
    done = []
    db.execute("BEGIN IMMEDIATE")
    try:
        for table, column, decl in MIGRATIONS:
            if column not in _columns(db, table):
                db.execute("ALTER TABLE %s ADD COLUMN %s %s" % (table, column, decl))
                done.append("%s.%s" % (table, column))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    return done


def platforms_during(log, lo, hi):
    """The platforms in force at some time in [lo, hi) from one node's (times, platforms) log.

    Before the node's first row (samples stored before vcamon recorded the
    platform) it is unknown.
    """
    times, names = log or ((), ())
    i = bisect_right(times, lo) - 1
    found = {names[i] if i >= 0 else "unknown"}
    found.update(names[i + 1:bisect_left(times, hi)])
    return found


def one_platform(found):
    return next(iter(found)) if len(found) == 1 else "mixed"


def throttle_temperature(scrape, counter):
    """The temperature that goes with a throttle counter: its core's, or the package's."""
    kind, _, ident = counter.partition(" ")
    if kind == "core":
        return scrape.temps.get("Core %s" % ident.split(":")[-1])
    return scrape.temps.get("Package id %s" % ident)


class Store:
    def __init__(self, path, raw_days=14, rollup_days=365):
        self.path = path
        self.raw_days = raw_days
        self.rollup_days = rollup_days
        self.db = connect(path)
        self.db.executescript(SCHEMA)
        self.migrated = migrate(self.db)
        if self.migrated:
            LOG.info("%s: added %s", path, ", ".join(self.migrated))
        self._series = {}

    def close(self):
        self.db.close()

    def series_id(self, node, metric, label=""):
        key = (node, metric, label)
        if key not in self._series:
            self.db.execute("INSERT OR IGNORE INTO series (node, metric, label) VALUES (?, ?, ?)", key)
            self._series[key] = self.db.execute(
                "SELECT id FROM series WHERE node = ? AND metric = ? AND label = ?", key).fetchone()[0]
        return self._series[key]

    def record_round(self, ts, scrapes, vca_nodes=None):
        """Store one scrape round atomically. vca_nodes maps the agent that reports vcactl lines (a VCA
        host's) to {vcactl node index: inventory name}: each host numbers its own nodes from 0."""
        ts = int(ts)
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            for s in scrapes:
                self._record_node(ts, s)
            for s in scrapes:
                names = (vca_nodes or {}).get(s.node, {})
                for index, state in s.vca_states.items():
                    if index in names:
                        self._record_vca_state(ts, names[index], state)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def _record_node(self, ts, s):
        db = self.db
        db.execute("INSERT OR REPLACE INTO scrapes (node, ts, up, duration_ms, error) VALUES (?, ?, ?, ?, ?)",
                   (s.node, ts, int(s.ok), s.duration_ms, s.error))
        row = db.execute("SELECT up FROM nodes WHERE node = ?", (s.node,)).fetchone()
        was_up = None if row is None else row[0]
        if row is None:
            db.execute("INSERT INTO nodes (node, url, up, since) VALUES (?, ?, ?, ?)", (s.node, s.url, int(s.ok), ts))
        if not s.ok:
            db.execute("UPDATE nodes SET up = 0, last_error = ?, url = ? WHERE node = ?", (s.error, s.url, s.node))
            if was_up != 0:
                db.execute("UPDATE nodes SET since = ? WHERE node = ?", (ts, s.node))
                db.execute("INSERT INTO events (ts, node, kind, detail) VALUES (?, ?, 'down', ?)",
                           (ts, s.node, s.error))
            return
        platform = s.platform if s.platform in PLATFORMS else "unknown"
        db.execute("UPDATE nodes SET up = 1, last_seen = ?, last_error = NULL, url = ?, platform = ? WHERE node = ?",
                   (ts, s.url, platform, s.node))
        self._record_platform(ts, s.node, platform)
        if was_up == 0:
            db.execute("UPDATE nodes SET since = ? WHERE node = ?", (ts, s.node))
            db.execute("INSERT INTO events (ts, node, kind) VALUES (?, ?, 'up')", (ts, s.node))
        rows = [(self.series_id(s.node, "temp", label), ts, value) for label, value in s.temps.items()]
        if s.power_w is not None:
            rows.append((self.series_id(s.node, "power"), ts, s.power_w))
        db.executemany("INSERT OR REPLACE INTO samples (series_id, ts, value) VALUES (?, ?, ?)", rows)
        self._record_counters(ts, s)
        self._record_caps(ts, s)

    def _record_platform(self, ts, node, platform):
        row = self.db.execute("SELECT platform FROM platforms WHERE node = ? ORDER BY ts DESC LIMIT 1",
                              (node,)).fetchone()
        if row is None or row[0] != platform:
            self.db.execute("INSERT OR REPLACE INTO platforms (node, ts, platform) VALUES (?, ?, ?)",
                            (node, ts, platform))

    def _record_counters(self, ts, s):
        db = self.db
        last = dict(db.execute("SELECT counter, value FROM counters WHERE node = ?", (s.node,)).fetchall())
        for counter, raw in s.throttle.items():
            value = int(raw)
            before = last.get(counter)
            if before is not None and value != before:
                # A counter below its last value was reset by a reboot: all of it is new.
                delta = value - before if value > before else value
                if delta > 0:
                    self._throttle_event(ts, s.node, counter, delta, throttle_temperature(s, counter))
            if value != before:
                db.execute("INSERT OR REPLACE INTO counters (node, counter, value) VALUES (?, ?, ?)",
                           (s.node, counter, value))

    def _throttle_event(self, ts, node, counter, delta, temperature):
        span = self.db.execute(
            "SELECT id, ts, coalesce(until_ts, ts) FROM events WHERE node = ? AND kind = 'throttle' AND subject = ? "
            "ORDER BY ts DESC, id DESC LIMIT 1", (node, counter)).fetchone()
        if span and ts - span[2] <= THROTTLE_GAP_S and ts - span[1] < THROTTLE_SPAN_S:
            self.db.execute("UPDATE events SET delta = delta + ?, until_ts = ?, temperature_c = "
                            "CASE WHEN temperature_c IS NULL OR ? > temperature_c THEN ? ELSE temperature_c END "
                            "WHERE id = ?", (delta, ts, temperature, temperature, span[0]))
        else:
            self.db.execute("INSERT INTO events (ts, node, kind, subject, delta, temperature_c, until_ts) "
                            "VALUES (?, ?, 'throttle', ?, ?, ?, ?)", (ts, node, counter, delta, temperature, ts))

    def _record_caps(self, ts, s):
        db = self.db
        for name, watts in s.limits.items():
            row = db.execute("SELECT watts FROM caps WHERE node = ? AND constraint_name = ? "
                             "ORDER BY ts DESC LIMIT 1", (s.node, name)).fetchone()
            if row is None or row[0] != watts:
                db.execute("INSERT OR REPLACE INTO caps (node, ts, constraint_name, watts) VALUES (?, ?, ?, ?)",
                           (s.node, ts, name, watts))
                if row is not None:
                    db.execute("INSERT INTO events (ts, node, kind, subject, value) VALUES (?, ?, 'cap', ?, ?)",
                               (ts, s.node, name, watts))

    def _record_vca_state(self, ts, node, state):
        db = self.db
        row = db.execute("SELECT vca_state FROM nodes WHERE node = ?", (node,)).fetchone()
        if row is None:
            db.execute("INSERT INTO nodes (node) VALUES (?)", (node,))
        if row is None or row[0] != state:
            db.execute("UPDATE nodes SET vca_state = ?, vca_state_since = ? WHERE node = ?", (state, ts, node))
            if row is not None and row[0] is not None:
                db.execute("INSERT INTO events (ts, node, kind, subject) VALUES (?, ?, 'state', ?)", (ts, node, state))

    # -- upkeep -------------------------------------------------------------

    def last_round(self):
        """When the newest scrape round began (epoch s), or None before the first."""
        return self.db.execute("SELECT max(ts) FROM scrapes").fetchone()[0]

    def meta(self, key, default=None):
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def set_meta(self, key, value):
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def platform_log(self, node=None):
        """{node: (times, platforms)}: when each node's platform changed, oldest first."""
        sql, args = "SELECT node, ts, platform FROM platforms", ()
        if node:
            sql, args = sql + " WHERE node = ?", (node,)
        log = {}
        for n, ts, platform in self.db.execute(sql + " ORDER BY node, ts", args):
            times, names = log.setdefault(n, ([], []))
            times.append(ts)
            names.append(platform)
        return log

    def rollup(self, now):
        """Fold every finished 5-minute bucket of raw samples into rollups (min/mean/max)."""
        end = int(now) // ROLLUP_S * ROLLUP_S
        start = int(self.meta("rolled_up_to", 0))
        if end <= start:
            return 0
        self.db.execute("BEGIN IMMEDIATE")
        try:
            cur = self.db.execute(
                "INSERT OR REPLACE INTO rollups (series_id, ts, min, mean, max, n) "
                "SELECT series_id, ts / ? * ?, min(value), avg(value), max(value), count(*) "
                "FROM samples WHERE ts >= ? AND ts < ? GROUP BY series_id, ts / ?",
                (ROLLUP_S, ROLLUP_S, start, end, ROLLUP_S))
            self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('rolled_up_to', ?)", (str(end),))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        return cur.rowcount

    def prune(self, now):
        """Drop raw samples and scrapes past raw_days, rollups and events past rollup_days."""
        raw_cut = int(now) - self.raw_days * DAY_S
        old_cut = int(now) - self.rollup_days * DAY_S
        rolled = int(self.meta("rolled_up_to", 0))
        self.db.execute("BEGIN IMMEDIATE")
        try:
            # Raw rows are only dropped once they are in a rollup.
            self.db.execute("DELETE FROM samples WHERE ts < ?", (min(raw_cut, rolled),))
            self.db.execute("DELETE FROM scrapes WHERE ts < ?", (raw_cut,))
            self.db.execute("DELETE FROM rollups WHERE ts < ?", (old_cut,))
            self.db.execute("DELETE FROM events WHERE ts < ?", (old_cut,))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    # -- queries ------------------------------------------------------------

    def status(self, now=None, throttle_window_s=DAY_S):
        now = int(now or time.time())
        out = []
        for node, up, since, last_seen, last_error, vca_state, platform in self.db.execute(
                "SELECT node, up, since, last_seen, last_error, vca_state, platform FROM nodes ORDER BY node"):
            latest = dict(self.db.execute(
                "SELECT s.metric || ':' || s.label, v.value FROM series s JOIN samples v ON v.series_id = s.id "
                "WHERE s.node = ? AND v.ts = (SELECT max(ts) FROM samples WHERE series_id = s.id)",
                (node,)).fetchall())
            temps = [v for k, v in latest.items() if k.startswith("temp:")]
            caps = dict(self.db.execute(
                "SELECT constraint_name, watts FROM caps c WHERE node = ? AND ts = "
                "(SELECT max(ts) FROM caps WHERE node = c.node AND constraint_name = c.constraint_name)",
                (node,)).fetchall())
            throttled = self.db.execute(
                "SELECT coalesce(sum(delta), 0) FROM events WHERE node = ? AND kind = 'throttle' "
                "AND coalesce(until_ts, ts) >= ?",
                (node, now - throttle_window_s)).fetchone()[0]
            out.append({
                "node": node, "up": None if up is None else bool(up), "since": since, "last_seen": last_seen,
                "error": last_error, "vca_state": vca_state, "platform": platform,
                "auth_failed": not up and (last_error or "").startswith(AUTH_FAILED),
                "hottest_c": max(temps) if temps else None, "power_w": latest.get("power:"),
                "pl1_w": caps.get("long_term"), "pl2_w": caps.get("short_term"), "throttle_24h": throttled,
            })
        return out

    def events(self, since, node=None, kinds=None, until=None):
        sql = ("SELECT ts, node, kind, subject, delta, value, temperature_c, detail, until_ts FROM events "
               "WHERE coalesce(until_ts, ts) >= ?")
        args = [int(since)]
        if until is not None:
            sql += " AND ts <= ?"
            args.append(int(until))
        if node:
            sql += " AND node = ?"
            args.append(node)
        if kinds:
            sql += " AND kind IN (%s)" % ",".join("?" * len(kinds))
            args.extend(kinds)
        cols = ("ts", "node", "kind", "subject", "delta", "value", "temperature_c", "detail", "until_ts")
        return [dict(zip(cols, row, strict=True)) for row in self.db.execute(sql + " ORDER BY ts, id", args)]

    EXPORT_COLUMNS = ("ts", "iso_time", "node", "metric", "label", "value", "resolution", "platform")

    def export_rows(self, since, until=None, node=None):
        """Raw samples (and rollup means where raw ones are gone), oldest first, each with its platform.

        A raw sample's platform is the one its node's agent reported in that
        round; a 5-minute mean's is "mixed" when the platform changed inside
        the bucket.
        """
        until = int(until or time.time()) + 1
        where = "s.node = ?" if node else "1"
        args = [node] if node else []
        log = self.platform_log(node)
        oldest_raw = self.db.execute("SELECT min(ts) FROM samples").fetchone()[0] or until
        for table, col, res, width in (("rollups", "mean", "5m", ROLLUP_S), ("samples", "value", "raw", 1)):
            hi = oldest_raw if table == "rollups" else until
            for ts, n, metric, label, value in self.db.execute(
                    "SELECT v.ts, s.node, s.metric, s.label, v.%s FROM %s v JOIN series s ON s.id = v.series_id "
                    "WHERE %s AND v.ts >= ? AND v.ts < ? ORDER BY v.ts, s.node, s.metric, s.label"
                    % (col, table, where), [*args, int(since), hi]):
                yield {"ts": ts, "iso_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts)), "node": n,
                       "metric": metric, "label": label, "value": round(value, 3), "resolution": res,
                       "platform": one_platform(platforms_during(log.get(n), ts, ts + width))}

    def export_csv(self, fh, since, until=None, node=None):
        """export_rows as CSV (ts,iso_time,node,metric,label,value,resolution,platform); returns the row count."""
        writer = csv.writer(fh)
        writer.writerow(self.EXPORT_COLUMNS)
        rows = 0
        for row in self.export_rows(since, until, node):
            writer.writerow([row[c] for c in self.EXPORT_COLUMNS])
            rows += 1
        return rows

    def export_json(self, fh, since, until=None, node=None):
        """export_rows as one JSON array of objects, written as it is read; returns the row count."""
        rows = 0
        fh.write("[")
        for row in self.export_rows(since, until, node):
            fh.write(",\n" if rows else "\n")
            fh.write(json.dumps(row))
            rows += 1
        fh.write("\n]\n")
        return rows

    def chart(self, node, start, end, max_points=720):
        """Aligned series for one node's charts, at most about max_points per series.

        Raw samples while they fit (6 hours at 30 s); beyond that the 5-minute
        rollups, merged into wider buckets in SQL when the range needs it
        (weighted mean; a chart is a few hundred pixels wide).
        """
        start, end = int(start), int(end)
        span = max(1, end - start)
        raw_step = 30
        step = 1
        if span <= max_points * raw_step:
            resolution = "raw"
            sql = ("SELECT s.metric, s.label, v.ts, v.value FROM samples v JOIN series s ON s.id = v.series_id "
                   "WHERE s.node = ? AND v.ts BETWEEN ? AND ? ORDER BY v.ts")
            args = (node, start, end)
        else:
            step = -(-span // (max_points * ROLLUP_S)) * ROLLUP_S
            resolution = "%dm" % (step // 60)
            sql = ("SELECT s.metric, s.label, v.ts / ? * ?, sum(v.mean * v.n) / sum(v.n) FROM rollups v "
                   "JOIN series s ON s.id = v.series_id WHERE s.node = ? AND v.ts BETWEEN ? AND ? "
                   "GROUP BY v.series_id, v.ts / ? ORDER BY 3")
            args = (step, step, node, start, end, step)
        by_ts, labels = {}, set()
        for metric, label, ts, value in self.db.execute(sql, args):
            key = "power" if metric == "power" else label
            labels.add(key)
            by_ts.setdefault(ts, {})[key] = round(value, 2)
        times = sorted(by_ts)
        data = {key: [by_ts[t].get(key) for t in times] for key in sorted(labels)}
        platforms = []                   # of the samples shown: every platform in force during them
        if times:
            platforms = sorted(platforms_during(self.platform_log(node).get(node), times[0], times[-1] + step))
        caps = self.db.execute(
            "SELECT ts, constraint_name, watts FROM caps WHERE node = ? AND ts <= ? ORDER BY ts",
            (node, end)).fetchall()
        limits = {}
        for name in ("long_term", "short_term"):
            steps = [(ts, w) for ts, n, w in caps if n == name]
            line, i, current = [], 0, None
            for t in times:
                while i < len(steps) and steps[i][0] < t + step:   # the cap in force during the bucket
                    current = steps[i][1]
                    i += 1
                line.append(current)
            limits[name] = line
        return {
            "node": node, "from": start, "to": end, "resolution": resolution, "t": times,
            "temps": {k: v for k, v in data.items() if k != "power"}, "power": data.get("power", []),
            "pl1": limits["long_term"], "pl2": limits["short_term"], "platforms": platforms,
            "events": self.events(start, node, ["throttle", "down", "up", "cap"], until=end),
        }
