"""The fleet's one page, written by the fleet: what runs, the numbers that matter, what is open.

- What runs: every vcamon agent, the systemd services each agent reports (its --unit patterns), and every
  service that exports metrics (the exposure table's rows, in fleet.json), scraped by the collector with
  the credential its service keeps.
- The numbers that matter: the newest GEMM, DMA and capacity records under records_dir (the bench
  playbooks publish each run there), every figure with its run's date and its own ``platform`` label.
- What is open: a VCA host down (several hosts: by its name, its unreachable nodes named in it, not each
  open), nodes down (not the inventory's dead ones: what runs shows those dead), throttle events in
  the last 24 h, services down, smem's failed documents, dead workers and stuck queue, the farm's failed
  and stuck jobs, LLM workers down, drained or leased.

fleet.json: {"services": [{"job": "smem", "node": "vca-host", "url": "http://127.0.0.1:8787/metrics",
"credential_file": "/etc/smem/metrics.token", "credential_json_key": null}], "records_dir": "/var/lib/vcamon/records"}
A credential file is the token itself, a JSON object (credential_json_key) or HAProxy's map of `name token`
lines (credential_map_key).
"""

from __future__ import annotations

import calendar
import json
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from prometheus_client.parser import text_string_to_metric_families

# The metrics what-is-open reads, by service; everything else a service exports is Prometheus' business.
READ = {
    "smem": {"smem_documents", "smem_worker_up", "smem_queue_oldest_due_age_seconds",
             "smem_queue_last_progress_age_seconds", "smem_lane_node_leased"},
    "farm": {"farm_jobs", "farm_job_last_progress_age_seconds"},
    "haproxy": {"haproxy_server_status"},
}
STUCK_QUEUE_S = 600        # the same bounds as the alerts (roles/prometheus/files/vcafleet-rules.yml)
STUCK_JOB_S = 900
RUN_DIR = re.compile(r"^(gemm|dma|capacity)-(\d{8}T\d{6}Z)$")


def load_config(path):
    """fleet.json, checked: a clear ValueError names what is wrong."""
    with open(path) as fh:
        config = json.load(fh)
    if not isinstance(config, dict) or not isinstance(config.get("services", []), list):
        raise ValueError("%s: expected {\"services\": [...], \"records_dir\": ...}" % path)
    for i, s in enumerate(config.get("services", [])):
        if not isinstance(s, dict) or not all(isinstance(s.get(k), str) and s[k] for k in ("job", "node", "url")):
            raise ValueError("%s: service %d needs 'job', 'node' and 'url'" % (path, i))
    return {"services": config.get("services", []), "records_dir": config.get("records_dir") or None}


def credential(service):
    """The token the service takes, read where its service keeps it (at each scrape: it may appear later)."""
    path = service.get("credential_file")
    if not path:
        return None
    text = Path(path).read_text()
    key = service.get("credential_json_key")
    if key:
        return str(json.loads(text)[key])
    map_key = service.get("credential_map_key")   # HAProxy's map: one `name token` a line
    if map_key:
        found = dict(line.split(None, 1) for line in text.splitlines() if len(line.split()) == 2)
        if map_key not in found:
            raise KeyError("%s has no line for %s" % (path, map_key))
        return found[map_key].strip()
    return text.strip()


def scrape_service(service, timeout=5.0):
    """{job, node, url, up, error, samples: [[name, labels, value], ...]} for one service."""
    out = {k: service[k] for k in ("job", "node", "url")}
    out.update(up=False, error=None, samples=[])
    try:
        request = urllib.request.Request(service["url"])
        token = credential(service)
        if token:
            request.add_unredirected_header("Authorization", "Bearer " + token)
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            text = resp.read().decode("utf-8")
        wanted = READ.get(service["job"], ())
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name in wanted:
                    out["samples"].append([s.name, s.labels, s.value])
        out["up"] = True
    except urllib.error.HTTPError as exc:
        exc.close()
        out["error"] = "HTTP %d" % exc.code
    except Exception as exc:  # one service's failure is its row's state, never the round's end
        out["error"] = "%s: %s" % (type(exc).__name__, exc)
    return out


def scrape_services(config, timeout=5.0, now=None, pool_map=map):
    """What the collector keeps (the store's meta 'fleet'): the services' state and where the records are."""
    return {"at": int(now or time.time()), "records_dir": config["records_dir"],
            "services": list(pool_map(lambda s: scrape_service(s, timeout), config["services"]))}


def _when(stamp):
    """'20261206T011500Z' -> epoch seconds."""
    return calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ"))


def _gflops(result):
    try:
        return float(result["record"]["results"][-1]["gflops"]), result["record"].get("platform", "unknown")
    except (KeyError, IndexError, TypeError, ValueError):
        return None, None


def _gemm(run):
    figures = []
    for f in sorted(run.glob("*.json")):
        r = json.loads(f.read_text())
        for side, key in (("OpenCL", "opencl"), ("CPU", "cpu")):
            value, platform = _gflops(r.get(key))
            if value is not None:
                figures.append({"what": "%s %s" % (r.get("host", f.stem), side), "value": round(value, 1),
                                "unit": "GFLOP/s", "platform": platform})
    return figures


def _dma(run):
    figures = []
    for f in sorted(run.glob("*.json")):
        if f.name == "ring.json":
            continue
        r = json.loads(f.read_text())
        record = (r.get("result") or {}).get("record")
        if not record:
            continue
        for engine in record.get("engines", []):
            mibps = [leg["mibps"] for leg in engine.get("legs", []) if leg.get("mibps") is not None]
            if mibps:
                figures.append({"what": "%s %s best leg" % (r.get("host", f.stem), engine.get("path", "engine")),
                                "value": round(max(mibps)), "unit": "MiB/s", "platform": record.get("platform")})
    return figures


def _capacity(run):
    record = json.loads((run / "record.json").read_text())
    return [{"what": leg["setup"], "value": round(leg["tok_s"], 1), "unit": "tok/s",
             "platform": leg.get("platform") or record.get("platform")}
            for leg in record.get("legs", []) if leg.get("tok_s") is not None]


def latest_records(records_dir):
    """The newest run of each kind: [{kind, run, at, platform, figures, error?}] (a run it cannot read says so)."""
    if not records_dir or not os.path.isdir(records_dir):
        return []
    newest = {}
    for entry in Path(records_dir).iterdir():
        m = RUN_DIR.match(entry.name)
        if m and entry.is_dir() and m.group(2) > newest.get(m.group(1), ("", None))[0]:
            newest[m.group(1)] = (m.group(2), entry)
    out = []
    for kind in ("gemm", "dma", "capacity"):
        if kind not in newest:
            continue
        stamp, run = newest[kind]
        item = {"kind": kind, "run": run.name, "at": _when(stamp), "figures": [], "platform": None}
        try:
            item["figures"] = {"gemm": _gemm, "dma": _dma, "capacity": _capacity}[kind](run)
            labels = sorted({f["platform"] or "unknown" for f in item["figures"]})
            item["platform"] = labels[0] if len(labels) == 1 else ("mixed: " + ", ".join(labels) if labels else None)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            item["error"] = "%s: %s" % (type(exc).__name__, exc)
        out.append(item)
    return out


def _samples(service, name):
    return [(labels, value) for n, labels, value in service["samples"] if n == name]


def _smem_open(s):
    items = [{"what": "failed documents", "where": "smem", "detail": "%d failed" % v}
             for labels, v in _samples(s, "smem_documents") if labels.get("status") == "failed" and v > 0]
    items += [{"what": "worker dead", "where": "smem " + labels.get("worker", "?"), "detail": ""}
              for labels, v in _samples(s, "smem_worker_up") if v == 0]
    ages = {n: v for n, _, v in s["samples"] if n.startswith("smem_queue_")}
    if min(ages.values(), default=0) > STUCK_QUEUE_S:
        items.append({"what": "queue stuck", "where": "smem",
                      "detail": "a due job has waited %d s" % ages["smem_queue_oldest_due_age_seconds"]})
    items += [{"what": "node leased", "where": labels.get("node", "?"),
               "detail": "smem's %s lane lends it out" % labels.get("lane", "?")}
              for labels, v in _samples(s, "smem_lane_node_leased") if v == 1]
    return items


def _farm_open(s):
    items = [{"what": "failed jobs", "where": "farm", "detail": "%d failed (farm status)" % v}
             for labels, v in _samples(s, "farm_jobs") if labels.get("state") == "failed" and v > 0]
    items += [{"what": "job stuck", "where": "farm job " + labels.get("job_id", "?"),
               "detail": "no progress for %d s" % v}
              for labels, v in _samples(s, "farm_job_last_progress_age_seconds") if v > STUCK_JOB_S]
    return items


def _haproxy_open(s):
    what = {"DOWN": "LLM worker down", "DRAIN": "worker drained", "MAINT": "worker drained"}
    return [{"what": what[labels["state"]], "where": labels.get("server", "?"),
             "detail": "HAProxy: %s" % labels["state"]}
            for labels, v in _samples(s, "haproxy_server_status")
            if v == 1 and labels.get("state") in what and labels.get("proxy") == "llm_workers"]


OPEN_BY_JOB = {"smem": _smem_open, "farm": _farm_open, "haproxy": _haproxy_open}


def host_states(nodes, hosts, dead=()):
    """Each VCA host as the page shows it (several hosts only; [] without): [{host, agent, up, state,
    error, nodes, unknown}]. A host whose agent does not answer (not an authentication failure: that
    agent was reached) is "down" when none of its live nodes answers either (they are reached through
    it), else only its agent is ("agent down"). Its nodes that do not answer are then unknown, not down
    each: one fault, said once, where the operator can act on it."""
    by_node = {n["node"]: n for n in nodes}
    out = []
    for host, parts in sorted(hosts.items()):
        agent = by_node.get(parts.get("agent")) or {"up": None, "error": None, "auth_failed": False}
        live = [by_node[n] for n in parts.get("nodes", []) if n in by_node and n not in dead]
        unreachable = agent["up"] is False and not agent.get("auth_failed")
        unknown = sorted(n["node"] for n in live if unreachable and n["up"] is False and not n.get("auth_failed"))
        state = ("up" if agent["up"] else "never seen" if agent["up"] is None
                 else "down" if unreachable and len(unknown) == len(live) else "agent down")
        out.append({"host": host, "agent": parts.get("agent"), "up": bool(agent["up"]), "state": state,
                    "error": agent["error"], "nodes": list(parts.get("nodes", [])), "unknown": unknown})
    return out


def machines_of(hosts):
    """{agent target or machine: its VCA host}: each host's agent and nodes, and the host by its own name
    (the name a service's row gives it)."""
    out = {host: host for host in hosts}
    out.update({name: host for host, parts in hosts.items() for name in [parts.get("agent"), *parts.get("nodes", [])]
                if name})
    return out


def label_nodes(nodes, hosts, dead=()):
    """The status rows, each with its VCA host and, when that host is down, unknown (its agent's vcactl
    line with it): grouped by host, the host's own agent first; unchanged without several hosts."""
    if not hosts:
        return nodes
    states = {h["host"]: h for h in host_states(nodes, hosts, dead)}
    host_of = machines_of(hosts)
    order = {host: i for i, host in enumerate(sorted(hosts))}
    out = []
    for n in nodes:
        host = host_of.get(n["node"])
        row = dict(n, vca_host=host, host_agent=bool(host) and hosts[host].get("agent") == n["node"])
        if host and n["node"] in states[host]["unknown"]:
            row.update(unknown=True, vca_state=None,
                       error="unknown: its host %s does not answer (%s)" % (host, states[host]["error"]))
        out.append(row)
    return sorted(out, key=lambda r: (order.get(r["vca_host"], len(order)), not r["host_agent"], r["node"]))


def open_items(nodes, services, units=None, dead=(), hosts=None):
    """What needs an owner's look, most serious first: [{what, where, detail}]. A node the inventory
    calls dead is known to be down: no open problem. With several VCA hosts (hosts: {host: {agent,
    nodes}}) a host whose agent does not answer is one item, by its name, and its nodes that do not
    answer either are named in it, not each an item of their own."""
    items, quiet = [], set()
    for h in host_states(nodes, hosts or {}, dead):
        quiet.add(h["agent"])
        quiet.update(h["unknown"])
        if h["state"] in ("down", "agent down"):
            detail = "agent: %s" % (h["error"] or "no answer")
            if h["unknown"]:
                detail += "; its nodes unknown: %s" % ", ".join(h["unknown"])
            items.append({"what": "host down" if h["state"] == "down" else "host agent down", "where": h["host"],
                          "detail": detail})
    items += [{"what": "node down", "where": n["node"],
               "detail": "vcactl: %s; agent: %s" % (n["vca_state"] or "-", n["error"] or "up")}
              for n in nodes if (n["vca_state"] == "link_down" or n["up"] is False) and n["node"] not in dead
              and n["node"] not in quiet]
    items += [{"what": "service not active", "where": "%s on %s" % (unit, node), "detail": state}
              for node, states in sorted((units or {}).items()) for unit, state in sorted(states.items())
              if state != "active"]
    items += [{"what": "service down", "where": "%s on %s" % (s["job"], s["node"]), "detail": s["error"]}
              for s in services if not s["up"]]
    for s in services:
        items += OPEN_BY_JOB.get(s["job"], lambda _: [])(s)
    items += [{"what": "throttle events", "where": n["node"], "detail": "%d in 24 h" % n["throttle_24h"]}
              for n in nodes if n["throttle_24h"] and n["node"] not in dead]
    return items


def dead_nodes(store):
    """The nodes the inventory calls dead (targets.json's "dead"), as the collector last recorded them."""
    return set(json.loads(store.meta("dead") or "[]"))


def vca_hosts(store):
    """{VCA host: {agent, nodes}} as the collector last recorded them; {} with one host."""
    return json.loads(store.meta("hosts") or "{}")


def _meta_json(store, key):
    """What the collector keeps as JSON in the store's meta table ('fleet', 'units'), or {}."""
    return json.loads(store.meta(key) or "{}")


def wait_for_round(store, since, timeout, poll=0.25):
    """True once the collector has stored a fleet round that began at or after `since`."""
    deadline = time.monotonic() + timeout
    while True:
        if _meta_json(store, "fleet").get("at", 0) >= since:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)


def view(store, now=None):
    """The three sections, as /api/fleet serves them and `vcamon fleet` prints them."""
    now = int(now or time.time())
    dead = dead_nodes(store)
    hosts = vca_hosts(store)
    raw = store.status(now)
    nodes = label_nodes(raw, hosts, dead)
    scraped = _meta_json(store, "fleet")
    services = scraped.get("services", [])
    runs = [dict({"service": "vcamon agent", "node": n["node"], "up": bool(n["up"]) and n["node"] not in dead,
                  "dead": n["node"] in dead, "unknown": bool(n.get("unknown")),
                  "error": "dead (the inventory's dead group)" if n["node"] in dead else n["error"]},
                 **({"vca_host": n.get("vca_host")} if hosts else {})) for n in nodes]
    units = _meta_json(store, "units")
    runs += [{"service": unit.removesuffix(".service"), "node": node, "up": state == "active",
              "error": None if state == "active" else state}
             for node in sorted(units) for unit, state in sorted(units[node].items())]
    runs += [{"service": "%s metrics :%s" % (s["job"], urlparse(s["url"]).port), "node": s["node"], "up": s["up"],
              "error": s["error"]} for s in services]
    if hosts:
        where = machines_of(hosts)
        runs = [dict(r, vca_host=r.get("vca_host") or where.get(r["node"])) for r in runs]
    agents_at = store.last_round()
    return {"now": now, "scraped_at": scraped.get("at"), "agents_at": agents_at, "runs": runs,
            "hosts": host_states(raw, hosts, dead), "numbers": latest_records(scraped.get("records_dir")),
            "open": open_items(raw, services, units, dead, hosts)}


def _day(ts):
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts)) + " UTC" if ts else "-"


def text(view):
    """`vcamon fleet`: the page's three sections as text."""
    lines = ["what runs (agents scraped %s, services %s):" % (_day(view.get("agents_at")), _day(view["scraped_at"]))]
    if view.get("hosts"):
        lines[0:0] = ["hosts: " + ", ".join("%s %s" % (h["host"], "up" if h["state"] == "up" else h["state"].upper())
                                            for h in view["hosts"])]
    width = max([len(r["service"]) for r in view["runs"]] + [7])
    hosted = any("vca_host" in r for r in view["runs"])
    host_width = max([len(r.get("vca_host") or "") for r in view["runs"]] + [4])
    for r in view["runs"]:
        state = ("up" if r["up"] else "dead" if r.get("dead") else "unknown (its host does not answer)"
                 if r.get("unknown") else "DOWN (%s)" % (r["error"] or "no answer"))
        host = "%-*s  " % (host_width, r.get("vca_host") or "-") if hosted else ""
        lines.append("  %-*s  %s%-10s  %s" % (width, r["service"], host, r["node"], state))
    lines.append("numbers that matter (the newest bench records):")
    if not view["numbers"]:
        lines.append("  no bench record yet (ansible-playbook playbooks/bench/gemm.yml, dma.yml, capacity.yml)")
    for run in view["numbers"]:
        lines.append("  %s, %s, platform: %s" % (run["kind"], _day(run["at"]), run["platform"] or "-"))
        if run.get("error"):
            lines.append("    unreadable: %s" % run["error"])
        if not run["figures"] and not run.get("error"):
            lines.append("    no figure (see %s/table.md)" % run["run"])
        for f in run["figures"]:
            lines.append("    %-32s %10s %-8s %s" % (f["what"], f["value"], f["unit"], f["platform"] or "-"))
    lines.append("what is open:")
    if not view["open"]:
        lines.append("  nothing")
    for item in view["open"]:
        lines.append("  %-17s %-28s %s" % (item["what"], item["where"], item["detail"] or ""))
    return "\n".join(lines)
