# SPDX-License-Identifier: MIT
"""Listening sockets as `ss -H -l -t -u -n -p` prints them, and the ones that persist.

A UDP socket that is bound but unconnected shows in `ss -l` too: a resolver's query for an upstream,
a client's short exchange. Those come and go within milliseconds; a listener someone left running
does not. So a machine is read several times, a little apart, and only what every reading shows
counts as listening (persistent()). Standard library only: this runs on the nodes.
"""

from __future__ import annotations

import re
import time

from ansible.module_utils.vca_exposure import normalise

PROCESS = re.compile(r'users:\(\("([^"]*)"')


def split_address(text):
    """'0.0.0.0:22' / '[::]:22' / '*:22' / '127.0.0.53%lo:53' / '[fe80::1]%eth0:5353' -> (address, port)."""
    address, _, port = text.rpartition(":")
    if not address or not port.isdigit() or int(port) > 65535:
        raise ValueError("not an address and port: %r" % text)
    return normalise(address), int(port)


def parse(output):
    """Every socket line of ss -H -ltunp: [{proto, address, port, process}], in the order ss gave them."""
    found = []
    for line in output.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] not in ("tcp", "udp"):
            continue
        if fields[0] == "tcp" and fields[1] != "LISTEN":
            continue
        try:
            address, port = split_address(fields[4])
        except ValueError:
            raise ValueError("cannot read this line of ss: %r" % line) from None
        process = PROCESS.search(line)
        found.append({"proto": fields[0], "address": address, "port": port,
                      "process": process.group(1) if process else None})
    return found


def key(s):
    return (s["proto"], s["address"], s["port"])


def persistent(readings):
    """(sockets seen in every reading, sockets seen in some only), each sorted and deduplicated; a
    socket's process is the one a reading saw, if any did."""
    if not readings:
        return [], []
    counts, best = {}, {}
    for reading in readings:
        for s in {key(s): s for s in reading}.values():
            counts[key(s)] = counts.get(key(s), 0) + 1
            if best.get(key(s), {}).get("process") is None:
                best[key(s)] = s
    order = sorted(counts, key=lambda k: (k[0], k[2], k[1]))
    return ([best[k] for k in order if counts[k] == len(readings)],
            [best[k] for k in order if counts[k] < len(readings)])


def read_persistent(read, snapshots=2, interval_s=1.0, sleep=time.sleep):
    """persistent() of `snapshots` readings interval_s apart; read() returns one reading (parse()'s list)."""
    if snapshots < 1 or interval_s < 0:
        raise ValueError("snapshots must be at least 1 and interval_s not negative")
    readings = []
    for i in range(snapshots):
        if i:
            sleep(interval_s)
        readings.append(read())
    return persistent(readings)
