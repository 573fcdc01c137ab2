"""vcamon agent | collector | status | events | export."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from . import agent, collector, fleet
from .auth import read_token_file
from .store import Store
from .web import DEFAULT_LISTEN as WEB_LISTEN
from .web import parse_span

DEFAULT_DB = os.environ.get("VCAMON_DB", "/var/lib/vcamon/vcamon.db")
PLATFORM_NOTES = {
    "lab": "lab: figures from the lab simulator (lab/sim), not hardware",
    "unknown": "unknown: no evidence of VCA hardware was found (or not recorded); not hardware figures",
}


def _span(text):
    try:
        return parse_span(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _when(ts):
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _num(value, fmt):
    return "-" if value is None else fmt % value


def status_table(rows, now, hosts=()):
    """`vcamon status`: one row per node now. With several VCA hosts (rows labelled by fleet.label_nodes,
    hosts from fleet.host_states) each row names its host, and a host that does not answer is said
    below the table, its unreachable nodes unknown rather than down."""
    hosted = any("vca_host" in r for r in rows)
    head = (("host",) if hosted else ()) + (
        "node", "agent", "platform", "since", "vcactl", "hottest C", "package W", "PL1/PL2 W", "throttle 24h",
        "last seen")
    lines = [head]
    for r in rows:
        agent = ("unknown" if r.get("unknown") else "AUTH-FAIL" if r.get("auth_failed")
                 else {True: "up", False: "DOWN", None: "-"}[r["up"]])
        seen = "%d s ago" % (now - r["last_seen"]) if r["last_seen"] else "never"
        lines.append(((r.get("vca_host") or "-",) if hosted else ()) + (
            r["node"], agent, r.get("platform") or "-", _when(r["since"]), r["vca_state"] or "-",
            _num(r["hottest_c"], "%.1f"), _num(r["power_w"], "%.1f"),
            "%s/%s" % (_num(r["pl1_w"], "%g"), _num(r["pl2_w"], "%g")), str(r["throttle_24h"]), seen))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in lines]
    seen_platforms = {r.get("platform") for r in rows}
    notes = ["%s %s: its agent does not answer (%s)%s" % (
        h["host"], h["state"].upper(), h["error"] or "no answer",
        "; its nodes' state is unknown: " + ", ".join(h["unknown"]) if h["unknown"] else "")
        for h in hosts if h["state"] in ("down", "agent down")]
    notes += [note for platform, note in PLATFORM_NOTES.items() if platform in seen_platforms]
    notes += ["AUTH-FAIL %s: %s" % (r["node"], r["error"]) for r in rows if r.get("auth_failed")]
    out += ["", *notes] if notes else []
    return "\n".join(out)


def open_store(path):
    if not os.path.exists(path):
        sys.exit("vcamon: no database at %s (is vcamon-collector running? --db or VCAMON_DB to point elsewhere)" % path)
    return Store(path)


def parser():
    ap = argparse.ArgumentParser(prog="vcamon", description=__doc__)
    ap.add_argument("-v", "--verbose", action="store_true")
    sub = ap.add_subparsers(dest="command", required=True)

    a = sub.add_parser("agent", help="serve this machine's sensors in the Prometheus text format")
    a.add_argument("--listen", default=agent.DEFAULT_LISTEN,
                   help="addr:port (an address or a name; default %(default)s)")
    a.add_argument("--node", required=True, help="this machine's name (the inventory host)")
    a.add_argument("--sysfs-root", default="/sys")
    a.add_argument("--vcactl", help="path of vcactl: on the host, report every node's state")
    a.add_argument("--sample-interval", type=float, default=5.0,
                   help="seconds between energy readings; vcactl and the platform are read at most this often")
    a.add_argument("--token-file", help="a file holding this agent's token: every request must then carry it "
                   "(Authorization: Bearer), else 401")
    a.add_argument("--unit", action="append", dest="units", default=[],
                   help="a systemd service pattern whose units' state to report (repeat; e.g. 'smem*')")
    a.add_argument("--filesystem", action="append", dest="filesystems",
                   help="a mountpoint whose free space to report (repeat; default /)")

    c = sub.add_parser("collector", help="scrape the agents into SQLite and serve the web page")
    c.add_argument("--db", default=DEFAULT_DB)
    c.add_argument("--targets", required=True, help="targets.json: [{node, url, vca_node, token_file}]")
    c.add_argument("--interval", type=float, default=30.0)
    c.add_argument("--listen", default=WEB_LISTEN, help="web page addr:port (default %(default)s; '' for none)")
    c.add_argument("--web-token-file", help="a file holding the page's token: every request must then carry it")
    c.add_argument("--fleet", help="fleet.json: the services to scrape for the fleet page, and the bench records' "
                   "directory")
    c.add_argument("--raw-days", type=int, default=14)
    c.add_argument("--rollup-days", type=int, default=365)

    s = sub.add_parser("status", help="a table of every node now")
    s.add_argument("--db", default=DEFAULT_DB)

    f = sub.add_parser("fleet", help="the fleet page as text: what runs, the numbers that matter, what is open")
    f.add_argument("--db", default=DEFAULT_DB)
    f.add_argument("--json", action="store_true", help="the page's data as JSON")
    f.add_argument("--newer-than", type=int, metavar="EPOCH",
                   help="wait for a collector round that began at or after EPOCH (seconds) before reading")
    f.add_argument("--wait", type=float, default=30.0, help="how long --newer-than waits (default 30 s)")

    e = sub.add_parser("events", help="throttle, down/up, cap and vcactl state events")
    e.add_argument("--db", default=DEFAULT_DB)
    e.add_argument("--since", type=_span, default=_span("1d"), help="e.g. 30m, 6h, 1d, 2w (default 1d)")
    e.add_argument("--node")

    x = sub.add_parser("export", help="samples, each with its platform, as CSV or JSON")
    x.add_argument("--db", default=DEFAULT_DB)
    fmt = x.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--csv", action="store_true", help="CSV on stdout")
    fmt.add_argument("--json", action="store_true", help="a JSON array of objects on stdout")
    x.add_argument("--since", type=_span, default=_span("1d"))
    x.add_argument("--node")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    now = int(time.time())
    if args.command == "agent":
        try:
            token = read_token_file(args.token_file) if args.token_file else None
        except ValueError as exc:
            sys.exit("vcamon agent: %s" % exc)
        agent.serve(args.listen, args.node, args.sysfs_root, args.vcactl, args.sample_interval, token=token,
                    filesystems=args.filesystems or ["/"], units=args.units)
    elif args.command == "collector":
        os.makedirs(os.path.dirname(os.path.abspath(args.db)), exist_ok=True)
        try:
            token = read_token_file(args.web_token_file) if args.web_token_file else None
            collector.run(args.db, args.targets, args.interval, listen=args.listen or None,
                          raw_days=args.raw_days, rollup_days=args.rollup_days, web_token=token, fleet_path=args.fleet)
        except (OSError, ValueError) as exc:
            sys.exit("vcamon collector: %s" % exc)
    elif args.command == "status":
        store = open_store(args.db)
        dead, hosts = fleet.dead_nodes(store), fleet.vca_hosts(store)
        rows = store.status(now)
        print(status_table(fleet.label_nodes(rows, hosts, dead), now, fleet.host_states(rows, hosts, dead)))
    elif args.command == "fleet":
        store = open_store(args.db)
        if args.newer_than is not None and not fleet.wait_for_round(store, args.newer_than, args.wait):
            print("vcamon fleet: no collector round since %s within %.0f s; the page below is older"
                  % (time.strftime("%H:%M:%S", time.gmtime(args.newer_than)), args.wait), file=sys.stderr)
        page = fleet.view(store, int(time.time()))
        print(json.dumps(page, indent=1) if args.json else fleet.text(page))
    elif args.command == "events":
        for ev in open_store(args.db).events(now - args.since, args.node):
            extra = {"throttle": "+%s at %s C" % (ev["delta"], _num(ev["temperature_c"], "%.1f")),
                     "down": ev["detail"] or "", "cap": "%s W" % _num(ev["value"], "%g")}.get(ev["kind"], "")
            print("%s  %-10s %-8s %-12s %s" % (_when(ev["ts"]), ev["node"], ev["kind"], ev["subject"] or "", extra))
    elif args.command == "export":
        store = open_store(args.db)
        (store.export_json if args.json else store.export_csv)(sys.stdout, now - args.since, now, args.node)
    return 0
