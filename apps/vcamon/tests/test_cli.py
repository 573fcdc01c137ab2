"""vcamon status / events / export on a real database, with each node's platform."""

from __future__ import annotations

import json
import time

import pytest

from vcamon.cli import main
from vcamon.store import Scrape, Store


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "vcamon.db")
    store = Store(path)
    now = int(time.time())
    store.record_round(now - 60, [Scrape(node="vca-node4", ok=True, temps={"Core 0": 80.0}, power_w=34.9,
                                         limits={"long_term": 35.0, "short_term": 40.0}, throttle={"core 0:0": 1},
                                         platform="lab"),
                                  Scrape(node="vca-node3", ok=False, error="URLError: timed out")])
    store.record_round(now - 30, [Scrape(node="vca-node4", ok=True, temps={"Core 0": 91.0}, power_w=35.0,
                                         limits={"long_term": 35.0, "short_term": 40.0}, throttle={"core 0:0": 4},
                                         platform="lab"),
                                  Scrape(node="vca-node3", ok=False, error="URLError: timed out")])
    store.close()
    return path


def test_status_table(db, capsys):
    assert main(["status", "--db", db]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["node", "agent", "platform", "since"]
    node3 = next(line for line in out if line.startswith("vca-node3"))
    node4 = next(line for line in out if line.startswith("vca-node4"))
    assert "DOWN" in node3 and "never" in node3 and node3.split()[2] == "-"    # never answered: no platform
    assert " up " in node4 and "91.0" in node4 and "35/40" in node4 and node4.split()[2] == "lab"
    assert out[-2:] == ["", "lab: figures from the lab simulator (lab/sim), not hardware"]   # after the table


def test_events_since(db, capsys):
    main(["events", "--db", db, "--since", "1d"])
    out = capsys.readouterr().out
    assert "vca-node3  down" in out and "URLError" in out
    assert "throttle core 0:0" in out and "+3 at 91.0 C" in out


def test_events_bad_span_is_a_clear_error(db, capsys):
    with pytest.raises(SystemExit):
        main(["events", "--db", db, "--since", "yesterday"])
    assert "not a span" in capsys.readouterr().err


def test_export_csv(db, capsys):
    main(["export", "--csv", "--db", db, "--since", "1h", "--node", "vca-node4"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "ts,iso_time,node,metric,label,value,resolution,platform"
    assert len(lines) == 1 + 4 and all(",vca-node4," in line and line.endswith(",raw,lab") for line in lines[1:])


def test_export_json(db, capsys):
    main(["export", "--json", "--db", db, "--since", "1h"])
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4
    assert {(r["node"], r["platform"], r["resolution"]) for r in rows} == {("vca-node4", "lab", "raw")}
    assert {r["metric"] for r in rows} == {"temp", "power"} and {r["value"] for r in rows} >= {91.0, 35.0}


def test_export_needs_one_format(db, capsys):
    for argv in (["export", "--db", db], ["export", "--csv", "--json", "--db", db]):
        with pytest.raises(SystemExit):
            main(argv)


def test_missing_database_says_where_it_looked(tmp_path):
    with pytest.raises(SystemExit, match="no database at"):
        main(["status", "--db", str(tmp_path / "nope.db")])
