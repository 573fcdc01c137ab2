# SPDX-License-Identifier: MIT
"""A bounded, concurrent TCP connect scan (asyncio; no raw sockets, no nmap).

Each connect ends open (connected: closed at once, nothing sent), closed (refused: the target
answered RST) or filtered (no answer within the timeout, or unreachable: a firewall that drops).
A firewall that drops costs one timeout per port, so the connects run side by side, as many as
`concurrency` across every target at once, and the whole scan is bounded in connects (before any
is made) and in time. A port the caller expects open can be probed again alone, with a longer
timeout (`confirm`), so that a busy machine cannot make a declared port look filtered.
Standard library only: this runs on the scanning machine (the lab's neighbour).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import resource
import time

# Python 3.10 (Ubuntu 22.04) raises asyncio's own TimeoutError from wait_for, not the builtin one
ASYNC_TIMEOUT = asyncio.TimeoutError


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


async def probe(target, port, timeout):
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(target, port), timeout)
    except ASYNC_TIMEOUT:
        return "filtered"
    except ConnectionRefusedError:
        return "closed"
    except OSError as e:
        return "closed" if e.errno == errno.ECONNREFUSED else "filtered"
    here, there = writer.get_extra_info("sockname"), writer.get_extra_info("peername")
    writer.close()
    try:
        await writer.wait_closed()
    except OSError:
        pass
    # a connect from this machine to one of its own ephemeral ports can meet itself (TCP's
    # simultaneous open): nobody listens there
    return "closed" if here and there and tuple(here[:2]) == tuple(there[:2]) else "open"


async def _sweep(targets, ports, concurrency, timeout, states, *, made):
    sem = asyncio.Semaphore(concurrency)

    async def one(target, port):
        async with sem:
            made[0] += 1
            states[target][port] = await probe(target, port, timeout)

    # created lazily, a batch at a time: half a million pending tasks would cost memory for nothing
    pending = set()
    try:
        for target in targets:
            for port in ports:
                pending.add(asyncio.ensure_future(one(target, port)))
                if len(pending) >= concurrency * 4:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    for task in done:
                        task.result()     # a probe that failed otherwise than by its port's answer
        if pending:
            done, pending = await asyncio.wait(pending)
            for task in done:
                task.result()
    finally:                  # out of time: nothing is left running behind the result
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


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

    async def run():
        await _sweep(targets, ports, allowed, timeout_s, states, made=made)
        for target, wanted in confirm.items():
            for port in wanted:
                before = states[target].get(port)
                made[0] += 1
                states[target][port] = await probe(target, port, confirm_timeout_s)
                confirmed["%s:%d" % (target, port)] = {"sweep": before, "final": states[target][port],
                                                       "changed": before != states[target][port]}

    def result():
        return _result(targets, states, made[0], started, concurrency=allowed, confirmed=confirmed, note=note)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(run(), max_duration_s))
    except ASYNC_TIMEOUT:
        raise ScanTimeout("the scan ran past max_duration_s (%s s)" % max_duration_s, result()) from None
    finally:
        loop.close()
    return result()
