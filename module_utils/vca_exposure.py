# SPDX-License-Identifier: MIT
"""The fleet's listening sockets against its declared table (docs/EXPOSURE.md).

A found socket is {proto, address, port, process}: what `ss` shows on one machine
(vca_listeners). A declared row is one socket of the table evaluated for one machine
(vca_exposure): {machine, service, role, proto, address, port, clients, auth, reason, probe, metrics},
address an IP or "*" (a declared wildcard bind), port a number or "any", clients inventory
hosts or the words "lan" and "loopback". Standard library only: this runs as a module's helper.
"""

from __future__ import annotations

import ipaddress
import re

WILDCARD_ROW = "*"
ANY_PORT = "any"
PROTOS = ("tcp", "udp")


def normalise(address: str) -> str:
    """One spelling per address: no brackets, no scope, IPv4-mapped IPv6 as IPv4, compressed IPv6."""
    # the scope goes inside the brackets or, as ss prints it, after them: [fe80::1]%eth0
    a = str(address).strip().split("%", 1)[0]
    if a.startswith("["):
        a = a[1:].rstrip("]")
    if a in ("*", ""):
        return "*"
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return a
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


def is_wildcard(address: str) -> bool:
    return normalise(address) in ("*", "0.0.0.0", "::")


def check_row(row: dict) -> None:
    """ValueError naming the row when it cannot be compared with a socket."""
    where = "%s's %s" % (row.get("machine", "?"), row.get("service", "row"))
    missing = [k for k in ("machine", "service", "proto", "address", "port", "clients", "auth") if k not in row]
    if missing:
        raise ValueError("declared row %s lacks %s: %r" % (where, ", ".join(missing), row))
    if row["proto"] not in PROTOS:
        raise ValueError("declared row %s: proto must be tcp or udp, not %r" % (where, row["proto"]))
    port = row["port"]
    if port != ANY_PORT and not (str(port).isdigit() and not isinstance(port, bool) and 1 <= int(port) <= 65535):
        raise ValueError("declared row %s: port must be 1-65535 or 'any', not %r" % (where, port))
    if not str(row["address"]).strip():
        raise ValueError("declared row %s: an empty address (a wildcard bind is declared as '*')" % where)
    if not isinstance(row["clients"], (list, tuple)):
        raise ValueError("declared row %s: clients must be a list, not %r" % (where, row["clients"]))


def matches(socket: dict, row: dict) -> bool:
    if socket["proto"] != row["proto"]:
        return False
    if row["port"] != ANY_PORT and int(row["port"]) != int(socket["port"]):
        return False
    if row["address"] == WILDCARD_ROW:
        return True
    if is_wildcard(socket["address"]):
        return False          # a specific row never excuses a bind on every address
    return normalise(socket["address"]) == normalise(row["address"])


def _sock(machine: str, s: dict) -> dict:
    return {"machine": machine, "proto": s["proto"], "address": normalise(s["address"]), "port": int(s["port"]),
            "process": s.get("process")}


def _specificity(row: dict) -> tuple[bool, bool]:
    return (row["address"] == WILDCARD_ROW, row["port"] == ANY_PORT)


def audit(found: dict[str, list[dict]], rows: list[dict]) -> dict:
    """found: {machine: [socket]}; rows: the declared table. Only the machines in found are audited."""
    for row in rows:
        check_row(row)
    unlisted, wildcard, matched, missing = [], [], [], []
    lan = 0
    by_machine: dict[str, list[dict]] = {}
    for row in rows:
        by_machine.setdefault(row["machine"], []).append(row)
    for machine in sorted(found):
        mine = by_machine.get(machine, [])
        seen = set()
        sockets = found[machine] or []
        for s in sorted(sockets, key=lambda x: (x["proto"], int(x["port"]), normalise(x["address"]))):
            hits = [i for i, row in enumerate(mine) if matches(s, row)]
            if not hits:
                entry = _sock(machine, s)
                unlisted.append(entry)
                if is_wildcard(s["address"]):
                    wildcard.append(entry)
                continue
            seen.update(hits)
            # the most specific row speaks for the socket: 127.0.0.1:22 under a loopback row is not
            # open to the LAN because a wildcard row for port 22 also declares sshd
            row = mine[min(hits, key=lambda i: (_specificity(mine[i]), i))]
            matched.append(dict(_sock(machine, s), service=row["service"], clients=list(row["clients"]),
                                auth=row["auth"]))
            if "lan" in row["clients"]:
                lan += 1
        missing += [{k: row[k] for k in ("machine", "service", "proto", "address", "port")}
                    for i, row in enumerate(mine) if i not in seen]
    # declared counts the rows of the machines audited, as missing does: a node that is down is not
    # "declared, not found"
    summary = {"declared": sum(len(by_machine.get(m, [])) for m in found),
               "found": sum(len(v or []) for v in found.values()), "lan": lan,
               "unlisted": len(unlisted), "missing": len(missing)}
    return {"unlisted": unlisted, "wildcard": wildcard, "missing": missing, "matched": matched,
            "summary": summary, "ok": not unlisted}


def summary_line(summary: dict) -> str:
    return ("exposure: %(declared)d sockets declared, %(found)d found, %(lan)d open to the LAN, "
            "%(unlisted)d unlisted" % summary)


WHO = {"lan": "anyone on the LAN", "loopback": "this machine only"}


def _who(clients: list[str]) -> str:
    return ", ".join(WHO.get(c, c) for c in clients)


def _cell(text: object) -> str:
    """Text that cannot end its table cell or row: one line, its pipes escaped."""
    return re.sub(r"\s*[\r\n]+\s*", " ", str(text)).strip().replace("|", "\\|")


def _natural(text: str) -> list:
    """vca-node2 before vca-node10."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text) if part]


def _port_order(port: int | str) -> tuple[int, int]:
    return (1, 0) if port == ANY_PORT else (0, int(port))


def _listed(values: list[str]) -> str:
    """One value once; several, one a line (the machine and address cells of a folded line align)."""
    return values[0] if len(set(values)) == 1 else "<br>".join(values)


def render_markdown(rows: list[dict], inventory: str = "") -> str:
    """The declared table as Markdown, sorted by machine then port. Rows that differ only by machine
    and address (the same agent on every node, the same resolver on each link) are folded into one
    line that lists them, under its first machine."""
    folded: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r.get("role", ""), r["service"], r["proto"], str(r["port"]), tuple(r["clients"]), r["auth"],
               r.get("reason") or "")
        folded.setdefault(key, []).append(r)
    lines = []
    for members in folded.values():
        members.sort(key=lambda r: (_natural(r["machine"]), _natural(str(r["address"]))))
        first = members[0]
        lines.append((
            (_natural(first["machine"]), _port_order(first["port"]), first["proto"], first["service"]),
            "| %s | %s | %s | %s | %s | %s | %s | %s |" % (
                _listed([_cell(r["machine"]) for r in members]),
                _listed(["`%s`" % _cell(r["address"]) for r in members]),
                _cell(first["port"]), first["proto"],
                _cell(first["service"]) + (" (role %s)" % _cell(first["role"]) if first.get("role") else ""),
                _cell(_who(first["clients"])), _cell(first["auth"]), _cell(first.get("reason") or ""))))
    head = []
    if inventory:
        head += ["Evaluated for `%s`: %d sockets on %d machines." % (
            inventory, len(rows), len({r["machine"] for r in rows})), ""]
    table = ["| machine | address | port | protocol | service | who may connect | how it authenticates | reason |",
             "|---|---|---|---|---|---|---|---|"]
    return "\n".join(head + table + [line for _order, line in sorted(lines, key=lambda x: x[0])]) + "\n"
