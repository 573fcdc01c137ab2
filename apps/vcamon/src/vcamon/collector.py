"""The collector: scrape every agent each interval into the store; keep going when one is down.

A target with a token_file is sent that token (Authorization: Bearer). The file is read once, at start; one
that cannot be read is that target's error (an authentication failure, every round) and no other target's.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from . import fleet
from .auth import read_token_file
from .store import AUTH_FAILED, Scrape, Store
from .web import start_web

LOG = logging.getLogger("vcamon.collector")


def load_targets(path):
    """targets.json: [{"node": "vca-node0", "url": "http://...:9478/metrics", "vca_node": 0, "token_file": ...}].

    With several VCA hosts every target names its host ("vca_host"): a node its own, a host's agent (the
    one target of that host without "vca_node") itself."""
    with open(path) as fh:
        targets = json.load(fh)
    problems = []
    if not isinstance(targets, list):
        raise ValueError("%s: expected a list of targets" % path)
    for i, t in enumerate(targets):
        if not isinstance(t, dict) or not t.get("node") or not t.get("url"):
            problems.append("%s: target %d needs 'node' and 'url'" % (path, i))
        elif "token_file" in t and not (isinstance(t["token_file"], str) and t["token_file"]):
            problems.append("%s: target %d: 'token_file' must be a path" % (path, i))
        elif not isinstance(t.get("dead", False), bool):
            problems.append("%s: target %d: 'dead' must be true or false" % (path, i))
        elif "vca_host" in t and not (isinstance(t["vca_host"], str) and t["vca_host"]):
            problems.append("%s: target %d: 'vca_host' must be a host's name" % (path, i))
    names = [t.get("node") for t in targets if isinstance(t, dict)]
    problems += ["%s: node %s listed twice" % (path, n) for n in sorted({n for n in names if names.count(n) > 1})]
    if not problems:
        problems += host_problems(path, targets)
    if problems:
        raise ValueError("; ".join(problems))
    return targets


def host_problems(path, targets):
    """What is wrong with the targets' VCA hosts: all or none name one, one agent per host, a vcactl
    node number once per host (each host numbers its own nodes from 0)."""
    named = [t for t in targets if "vca_host" in t]
    if not named:
        return []
    if len(named) != len(targets):
        return ["%s: targets %s name no vca_host, the others do: with several VCA hosts every target names its "
                "host" % (path, ", ".join(t["node"] for t in targets if "vca_host" not in t))]
    problems = []
    agents, numbers = {}, {}
    for t in targets:
        if t.get("vca_node") is None:
            agents.setdefault(t["vca_host"], []).append(t["node"])
        else:
            numbers.setdefault((t["vca_host"], t["vca_node"]), []).append(t["node"])
    problems += ["%s: VCA host %s has %d agents (%s); a host has one" % (path, h, len(a), ", ".join(a))
                 for h, a in sorted(agents.items()) if len(a) > 1]
    problems += ["%s: VCA host %s has no agent target (a target of that host without vca_node)" % (path, h)
                 for h in sorted({t["vca_host"] for t in targets} - set(agents))]
    problems += ["%s: vca_node %s of host %s is given to %s" % (path, n, h, " and ".join(nodes))
                 for (h, n), nodes in sorted(numbers.items(), key=str) if len(nodes) > 1]
    return problems


def vca_hosts(targets):
    """{VCA host: {"agent": its own agent's target, "nodes": [its nodes' targets]}}, {} without vca_host."""
    hosts = {}
    for t in targets:
        if t.get("vca_host"):
            host = hosts.setdefault(t["vca_host"], {"agent": None, "nodes": []})
            if t.get("vca_node") is None:
                host["agent"] = t["node"]
            else:
                host["nodes"].append(t["node"])
    return hosts


def vca_node_names(targets):
    """{agent target: {vcactl node number: inventory node}}: a target without vca_node (a host's agent)
    reports its own host's nodes' vcactl lines; with one host (no vca_host) every number is that host's."""
    numbered = {}
    for t in targets:
        if t.get("vca_node") is not None:
            numbered.setdefault(t.get("vca_host"), {})[t["vca_node"]] = t["node"]
    return {t["node"]: numbered.get(t.get("vca_host"), {}) for t in targets if t.get("vca_node") is None}


def parse(node, text, url=""):
    """An agent's exposition text into a Scrape (only the metrics vcamon stores)."""
    s = Scrape(node=node, url=url, ok=True)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, sample.value
            if name == "vcamon_temperature_celsius":
                s.temps[labels["sensor"]] = value
            elif name == "vcamon_package_power_watts":
                s.power_w = value
            elif name == "vcamon_power_limit_watts":
                s.limits[labels["constraint"]] = value
            elif name == "vcamon_throttle_events_total":
                s.throttle["%s %s" % (labels["scope"], labels["id"])] = int(value)
            elif name == "vcamon_vca_node_state" and value == 1:
                s.vca_states[int(labels["vca_node"])] = labels["state"]
            elif name == "vcamon_unit_state" and value == 1:
                s.units[labels["unit"]] = labels["state"]
            elif name == "vcamon_platform_info" and value == 1:
                s.platform = labels["platform"]
    return s


def target_token(target):
    """(token, None) for a target: its token_file's token, or None without one; (None, error) when unreadable."""
    if not target.get("token_file"):
        return None, None
    try:
        return read_token_file(target["token_file"]), None
    except ValueError as exc:
        return None, "%s: no token to send (%s; read at start: restart the collector once it is fixed)" % (
            AUTH_FAILED, exc)


def _refused(target, token):
    if token:
        return "%s: the agent refused the token in %s (HTTP 401)" % (AUTH_FAILED, target["token_file"])
    return "%s: the agent wants a token and this target has no token_file (HTTP 401)" % AUTH_FAILED


def scrape(target, timeout, token=None, token_error=None):
    start = time.monotonic()
    if token_error:
        return Scrape(node=target["node"], url=target["url"], ok=False, error=token_error, duration_ms=0.0)
    request = urllib.request.Request(target["url"])
    if token:
        request.add_unredirected_header("Authorization", "Bearer " + token)   # never sent on to a redirect
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            text = resp.read().decode("utf-8")
        result = parse(target["node"], text, target["url"])
    except urllib.error.HTTPError as exc:
        exc.close()
        error = _refused(target, token) if exc.code == 401 else "HTTPError: %s" % exc
        result = Scrape(node=target["node"], url=target["url"], ok=False, error=error)
    except Exception as exc:  # any failure is the node's state for this round, not the collector's end
        result = Scrape(node=target["node"], url=target["url"], ok=False, error="%s: %s" % (type(exc).__name__, exc))
    result.duration_ms = round((time.monotonic() - start) * 1000, 1)
    return result


class Collector:
    def __init__(self, store, targets, interval=30.0, timeout=None, *, upkeep_every=60.0, fleet_config=None):
        self.store = store
        self.fleet_config = fleet_config
        self.targets = targets
        self.interval = float(interval)
        self.timeout = timeout or max(1.0, min(10.0, self.interval * 0.8))
        self.upkeep_every = upkeep_every
        self.vca_nodes = vca_node_names(targets)
        self.dead = sorted(t["node"] for t in targets if t.get("dead"))
        self.hosts = vca_hosts(targets)
        self.tokens = {t["node"]: target_token(t) for t in targets}
        for node, (_, error) in sorted(self.tokens.items()):
            if error:
                LOG.error("%s: %s", node, error)
        self.pool = ThreadPoolExecutor(max_workers=max(1, min(16, len(targets))))
        self.stop = threading.Event()
        self._last_upkeep = 0.0

    def round(self, now=None):
        now = time.time() if now is None else now
        results = list(self.pool.map(lambda t: scrape(t, self.timeout, *self.tokens[t["node"]]), self.targets))
        self.store.record_round(now, results, self.vca_nodes)
        # what runs where, for the fleet page: the services each reachable agent reported this round
        self.store.set_meta("units", json.dumps({r.node: r.units for r in results if r.ok and r.units}))
        # the inventory's dead nodes: still scraped (recorded down), shown dead rather than as a problem
        self.store.set_meta("dead", json.dumps(self.dead))
        # several VCA hosts: which agent is each host's own and which nodes are its (none with one host)
        self.store.set_meta("hosts", json.dumps(self.hosts))
        if self.fleet_config is not None:
            # the agents' pool: a slow service delays no other, and no second pool is kept
            scraped = fleet.scrape_services(self.fleet_config, self.timeout, now, self.pool.map)
            self.store.set_meta("fleet", json.dumps(scraped))
        if now - self._last_upkeep >= self.upkeep_every:
            self.store.rollup(now)
            self.store.prune(now)
            self._last_upkeep = now
        return results

    def run(self, wait=None):
        """Rounds every interval until stop is set. wait(delay) sleeps until the next one and is true
        when a round is asked for sooner (the service's: SIGUSR1); by default stop ends the sleep."""
        wait = wait or self.stop.wait
        LOG.info("collecting %d targets every %.1f s into %s", len(self.targets), self.interval, self.store.path)
        next_at = time.time()
        while not self.stop.is_set():
            try:
                for r in self.round():
                    if not r.ok:
                        LOG.debug("%s down: %s", r.node, r.error)
            except Exception:
                LOG.exception("scrape round failed; continuing")
            next_at += self.interval
            delay = next_at - time.time()
            if delay < 0:           # fell behind (a slow disk): skip, do not burst
                next_at = time.time()
                delay = 0
            if wait(delay):
                next_at = time.time()


def round_asked(delay):
    """Sleep up to delay s; true when SIGUSR1 came (blocked, so it waits pending for this call)."""
    return signal.sigtimedwait({signal.SIGUSR1}, delay) is not None


def run(db_path, targets_path, interval, *, listen=None, raw_days=14, rollup_days=365, web_token=None,
        fleet_path=None):
    # `systemctl kill -s USR1 vcamon-collector` asks for a round now (the fleet report does). Blocked
    # first, before any thread starts (threads inherit the mask), and taken with sigtimedwait: no
    # handler runs between two bytecodes, and one sent during the start waits instead of killing.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    targets = load_targets(targets_path)
    fleet_config = fleet.load_config(fleet_path) if fleet_path else None
    store = Store(db_path, raw_days, rollup_days)
    collector = Collector(store, targets, interval, fleet_config=fleet_config)
    if listen:
        start_web(listen, db_path, token=web_token)
    collector.run(wait=round_asked)
