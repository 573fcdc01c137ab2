# SPDX-License-Identifier: MIT
"""The fleet's listening sockets against its declared table (docs/EXPOSURE.md).

A found socket is {proto, address, port, process}: what `ss` shows on one machine
(vca_listeners). A declared row is one socket of the table evaluated for one machine
(vca_exposure): {machine, service, role, proto, address, port, clients, auth, reason, probe},
address an IP or "*" (a declared wildcard bind), port a number or "any", clients inventory
hosts or the words "lan" and "loopback". Standard library only: this runs as a module's helper.
"""

from __future__ import annotations

import ipaddress

WILDCARD_ROW = "*"


def normalise(address):
    """One spelling per address: no brackets, no scope, IPv4-mapped IPv6 as IPv4, compressed IPv6."""
    a = str(address).strip()
    if a.startswith("[") and a.endswith("]"):
        a = a[1:-1]
    a = a.split("%", 1)[0]
    if a in ("*", ""):
        return "*"
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return a
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def is_wildcard(address):
    return normalise(address) in ("*", "0.0.0.0", "::")


def matches(socket, row):
    if socket["proto"] != row["proto"]:
        return False
    if row["port"] != "any" and int(row["port"]) != int(socket["port"]):
        return False
    if row["address"] == WILDCARD_ROW:
        return True
    if is_wildcard(socket["address"]):
        return False          # a specific row never excuses a bind on every address
    return normalise(socket["address"]) == normalise(row["address"])


def _sock(machine, s):
    return {"machine": machine, "proto": s["proto"], "address": normalise(s["address"]), "port": int(s["port"]),
            "process": s.get("process")}


def audit(found, rows):
    """found: {machine: [socket]}; rows: the declared table. Only the machines in found are audited."""
    unlisted, wildcard, matched, missing = [], [], [], []
    lan = 0
    by_machine = {}
    for row in rows:
        by_machine.setdefault(row["machine"], []).append(row)
    seen_rows = set()
    for machine in sorted(found):
        mine = by_machine.get(machine, [])
        for s in sorted(found[machine] or [], key=lambda x: (x["proto"], int(x["port"]), normalise(x["address"]))):
            hits = [i for i, row in enumerate(mine) if matches(s, row)]
            if not hits:
                entry = _sock(machine, s)
                unlisted.append(entry)
                if is_wildcard(s["address"]):
                    wildcard.append(entry)
                continue
            row = mine[hits[0]]
            seen_rows.update((machine, i) for i in hits)
            matched.append(dict(_sock(machine, s), service=row["service"], clients=row["clients"], auth=row["auth"]))
            if "lan" in row["clients"]:
                lan += 1
        for i, row in enumerate(mine):
            if (machine, i) not in seen_rows:
                missing.append({k: row[k] for k in ("machine", "service", "proto", "address", "port")})
    audited_rows = [r for r in rows if r["machine"] in found]
    summary = {"declared": len(audited_rows), "found": sum(len(v or []) for v in found.values()), "lan": lan,
               "unlisted": len(unlisted), "missing": len(missing)}
    return {"unlisted": unlisted, "wildcard": wildcard, "missing": missing, "matched": matched,
            "summary": summary, "ok": not unlisted}


def summary_line(summary):
    return ("exposure: %(declared)d sockets declared, %(found)d found, %(lan)d open to the LAN, "
            "%(unlisted)d unlisted" % summary) + (", %d declared but not found" % summary["missing"]
                                                 if summary["missing"] else "")


def _who(clients):
    words = {"lan": "anyone on the LAN", "loopback": "this machine only"}
    return ", ".join(words.get(c, c) for c in clients)


def render_markdown(rows, inventory=""):
    """The table. Rows that differ only by machine and address (the same agent on every node) are
    folded into one line that lists them."""
    folded = {}
    for r in sorted(rows, key=lambda r: (r["role"], r["service"], r["proto"], str(r["port"]).zfill(5),
                                         r["machine"], r["address"])):
        key = (r["role"], r["service"], r["proto"], str(r["port"]), _who(r["clients"]), r["auth"],
               r.get("reason") or "")
        folded.setdefault(key, []).append("%s `%s`" % (r["machine"], r["address"]))
    lines = ["| where (machine, address) | port | protocol | service | who may connect | how it authenticates"
             " | reason |", "|---|---|---|---|---|---|---|"]
    for (role, service, proto, port, who, auth, reason), where in folded.items():
        lines.append("| %s | %s | %s | %s (%s) | %s | %s | %s |" % (
            "<br>".join(where), port, proto, service, role, who, auth.replace("|", "/"), reason.replace("|", "/")))
    head = []
    if inventory:
        head += ["Evaluated for `%s`: %d sockets on %d machines." % (
            inventory, len(rows), len({r["machine"] for r in rows})), ""]
    return "\n".join(head + lines) + "\n"
