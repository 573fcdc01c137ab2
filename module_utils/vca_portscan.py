# SPDX-License-Identifier: MIT
"""A bounded, concurrent TCP connect scan (non-blocking sockets on one selector; no raw sockets, no nmap).

Each connect ends open (connected: closed at once, nothing sent), closed (refused: the target
answered RST) or filtered (no answer within the timeout, or unreachable: a firewall that drops).
A firewall that drops costs one timeout per port, so the connects run side by side, as many as
`concurrency` across every target at once, and the whole scan is bounded in connects (before any
is made) and in time. A port the caller expects open can be probed again alone, with a longer
timeout (`confirm`), so that a busy machine cannot make a declared port look filtered.
Standard library only: this runs on the scanning machine (the lab's neighbour).
"""

from __future__ import annotations

import errno
import ipaddress
import resource
import selectors
import socket
import time
from collections import deque

IN_PROGRESS = {errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK, errno.EALREADY}


class ScanTimeout(Exception):
    def __init__(self, message, partial):
        super().__init__(message)
        self.partial = partial


def ports_of(spec):
    """'1-65535', '22,80', 22 or a list of them -> sorted unique ports, each 1..65535 (ValueError)."""
    items = spec if isinstance(spec, (list, tuple)) else [spec]
    ports = set()
    for item in items:
        for raw in str(item).split(","):
            part = raw.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            try:
                lo, hi = int(lo), int(hi or lo)
            except ValueError:
                raise ValueError("not a port or a range of ports: %r" % part) from None
            if not 1 <= lo <= hi <= 65535:
                raise ValueError("ports must be within 1-65535: %r" % part)
            ports.update(range(lo, hi + 1))
    if not ports:
        raise ValueError("no ports to scan")
    return sorted(ports)


def raise_fd_limit(wanted):
    """The concurrency the open-file limit allows: the soft limit is raised towards wanted + 256."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + 256
    if soft < need:
        new = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return max(1, min(wanted, soft - 256))


def new_socket(target, port):
    """A non-blocking TCP socket for one connect to target:port (a test binds its source port)."""
    sock = socket.socket(socket.AF_INET6 if ":" in target else socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


def _answer(sock, err):
    """What a finished connect says: err is its SO_ERROR (0: it connected)."""
    if err:
        return "closed" if err == errno.ECONNREFUSED else "filtered"
    try:
        here, there = sock.getsockname(), sock.getpeername()
    except OSError:           # connected, then reset at once: something listened
        return "open"
    # a connect from this machine to one of its own ephemeral ports can meet itself (TCP's
    # simultaneous open): nobody listens there
    return "closed" if tuple(here[:2]) == tuple(there[:2]) else "open"


class _OutOfTime(Exception):
    pass


def _sweep(pairs, concurrency, timeout, states, *, made, deadline):
    """Connect to each (target, port), at most concurrency at once, each given timeout seconds; an open
    port is closed at once with nothing sent. Non-blocking sockets on one selector: a connect costs a
    socket and two system calls, so a sweep of every port is bound by the answers, not by Python."""
    selector = selectors.DefaultSelector()
    oldest_first = deque()        # [started, sock, target, port, finished]: the first to time out is first
    live = {}
    pairs = iter(pairs)
    more = True

    def finish(entry, state):
        entry[4] = True
        selector.unregister(entry[1])
        del live[entry[1].fileno()]
        entry[1].close()
        states[entry[2]][entry[3]] = state

    def begin(target, port):
        sock = new_socket(target, port)
        made[0] += 1
        err = sock.connect_ex((target, port))
        if err not in IN_PROGRESS:   # answered at once (loopback, an unreachable network)
            states[target][port] = _answer(sock, err)
            sock.close()
            return
        entry = [time.monotonic(), sock, target, port, False]
        selector.register(sock, selectors.EVENT_WRITE, entry)
        live[sock.fileno()] = entry
        oldest_first.append(entry)

    try:
        while True:
            while more and len(live) < concurrency:
                pair = next(pairs, None)
                more = pair is not None
                if more:
                    begin(*pair)
            if not live and not more:
                return
            while oldest_first and oldest_first[0][4]:
                oldest_first.popleft()
            now = time.monotonic()
            if now >= deadline:
                raise _OutOfTime()
            wake = min(oldest_first[0][0] + timeout, deadline) if oldest_first else deadline
            for key, _events in selector.select(max(0.0, wake - now)):
                finish(key.data, _answer(key.data[1], key.data[1].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
            now = time.monotonic()
            while oldest_first and (oldest_first[0][4] or oldest_first[0][0] + timeout <= now):
                entry = oldest_first.popleft()
                if not entry[4]:
                    finish(entry, "filtered")
    finally:                  # out of time, or a connect that broke: nothing is left open behind it
        for entry in list(live.values()):
            selector.unregister(entry[1])
            entry[1].close()
        selector.close()


def probe(target, port, timeout):
    """One connect, given timeout seconds: open, closed or filtered."""
    got = {target: {}}
    _sweep([(target, port)], 1, timeout, got, made=[0], deadline=float("inf"))
    return got[target][port]


def _result(targets, states, connects, started, *, concurrency, confirmed, note):
    out = {"targets": {}, "connects": connects, "duration_s": round(time.monotonic() - started, 2),
           "concurrency": concurrency, "confirmed": confirmed}
    for t in targets:
        seen = states[t]
        out["targets"][t] = {"open": sorted(p for p, s in seen.items() if s == "open"),
                             "closed": sum(1 for s in seen.values() if s == "closed"),
                             "filtered": sum(1 for s in seen.values() if s == "filtered"),
                             "scanned": len(seen)}
    if note:
        out["note"] = note
    return out


def scan(targets, ports, *, concurrency=4096, timeout_s=1.0, max_connects=2000000, max_duration_s=600.0,
         confirm=None, confirm_timeout_s=3.0):
    targets = list(dict.fromkeys(targets))
    if not targets:
        raise ValueError("no targets to scan")
    for t in targets:
        try:
            ipaddress.ip_address(t)
        except ValueError:
            raise ValueError("targets must be IP addresses, not %r (a name could resolve anywhere)" % t) from None
    ports = ports_of(ports)
    confirm = {str(t): ports_of(p) for t, p in (confirm or {}).items() if p}
    unknown = sorted(set(confirm) - set(targets))
    if unknown:
        raise ValueError("confirm names targets that are not scanned: %s" % ", ".join(unknown))
    connects = len(targets) * len(ports) + sum(len(p) for p in confirm.values())
    if connects > max_connects:
        raise ValueError("%d connects asked for, more than max_connects (%d): nothing was sent"
                         % (connects, max_connects))
    if concurrency < 1 or timeout_s <= 0 or max_duration_s <= 0 or confirm_timeout_s <= 0:
        raise ValueError("concurrency, timeout_s, max_duration_s and confirm_timeout_s must be positive")
    allowed = raise_fd_limit(concurrency)
    note = ("the open-file limit allows %d connects at a time, not %d" % (allowed, concurrency)
            if allowed < concurrency else "")
    states = {t: {} for t in targets}
    confirmed = {}
    made = [0]            # connects begun, also when the scan runs out of time
    started = time.monotonic()

    def result():
        return _result(targets, states, made[0], started, concurrency=allowed, confirmed=confirmed, note=note)

    deadline = started + max_duration_s
    try:
        _sweep(((t, p) for t in targets for p in ports), allowed, timeout_s, states, made=made, deadline=deadline)
        for target, wanted in confirm.items():
            for port in wanted:
                if time.monotonic() >= deadline:
                    raise _OutOfTime()
                before = states[target].get(port)
                made[0] += 1
                states[target][port] = probe(target, port, confirm_timeout_s)
                confirmed["%s:%d" % (target, port)] = {"sweep": before, "final": states[target][port],
                                                       "changed": before != states[target][port]}
    except _OutOfTime:
        raise ScanTimeout("the scan ran past max_duration_s (%s s)" % max_duration_s, result()) from None
    return result()
