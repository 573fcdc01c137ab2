"""The exposure audit's rules (module_utils/vca_exposure.py): found sockets against the declared table.
The listeners' reader and the port scan have their own tests (test_vca_listeners.py, test_vca_portscan.py)."""

from __future__ import annotations

import re

import pytest
from ansible.module_utils.vca_exposure import audit, is_wildcard, matches, normalise, render_markdown, summary_line


def row(machine="vca-node0", address="172.31.1.1", port=9478, proto="tcp", clients=("vca-host",), **kw):
    return {"machine": machine, "service": kw.pop("service", "vcamon agent"), "role": kw.pop("role", "vcamon"),
            "proto": proto, "address": address, "port": port, "clients": list(clients),
            "auth": kw.pop("auth", "a token"), "reason": kw.pop("reason", ""), "probe": {}, **kw}


def sock(address, port, proto="tcp", process=None):
    return {"proto": proto, "address": address, "port": port, "process": process}


@pytest.mark.parametrize("given, want", [("[::]", "::"), ("*", "*"), ("", "*"), ("[::ffff:127.0.0.1]", "127.0.0.1"),
                                         ("127.0.0.53%lo", "127.0.0.53"), ("[fe80::1%eth0]", "fe80::1"),
                                         ("0:0:0:0:0:0:0:1", "::1"), ("172.31.1.1", "172.31.1.1"),
                                         ("[fe80::1]%eth0", "fe80::1"), ("0.0.0.0%eth0", "0.0.0.0"),
                                         ("*%eth0", "*"), ("[2001:DB8:0:0::1]", "2001:db8::1"),
                                         ("[::ffff:0.0.0.0]", "0.0.0.0"), ("::", "::")])
def test_addresses_have_one_spelling(given, want):
    assert normalise(given) == want


def test_wildcards():
    assert all(is_wildcard(a) for a in ("0.0.0.0", "::", "[::]", "*", "::ffff:0.0.0.0", "[::]%eth0", "0:0::0"))
    assert not any(is_wildcard(a) for a in ("127.0.0.1", "::1", "172.31.1.254", "::ffff:127.0.0.1"))


def test_a_socket_matches_its_row_only():
    r = row()
    assert matches(sock("172.31.1.1", 9478), r)
    assert not matches(sock("172.31.1.1", 9479), r)                    # another port
    assert not matches(sock("172.31.1.1", 9478, "udp"), r)             # another protocol
    assert not matches(sock("127.0.0.1", 9478), r)                     # another address
    assert not matches(sock("0.0.0.0", 9478), r)                       # a specific row never excuses a wildcard
    assert matches(sock("0.0.0.0", 22), row(address="*", port=22))     # a declared wildcard covers both families
    assert matches(sock("::", 22), row(address="*", port=22))
    assert matches(sock("127.0.0.11", 40411, "udp"), row(address="127.0.0.11", port="any", proto="udp"))


def test_the_audit_names_what_is_unlisted_wildcard_and_missing():
    rows = [row(), row(address="*", port=22, service="sshd"), row(machine="vca-host", address="127.0.0.1", port=4369),
            row(machine="vca-host", address="172.19.0.2", port=9480, clients=("lan", "loopback"), service="page"),
            row(machine="vca-node4", address="172.31.5.1")]
    found = {"vca-node0": [sock("172.31.1.1", 9478), sock("0.0.0.0", 22), sock("::", 22),
                           sock("0.0.0.0", 8000, process="python3"), sock("127.0.0.1", 9999)],
             "vca-host": [sock("172.19.0.2", 9480)]}
    got = audit(found, rows)
    assert not got["ok"]
    assert {(s["machine"], s["address"], s["port"]) for s in got["unlisted"]} == \
        {("vca-node0", "127.0.0.1", 9999), ("vca-node0", "0.0.0.0", 8000)}
    assert [(s["address"], s["port"], s["process"]) for s in got["wildcard"]] == [("0.0.0.0", 8000, "python3")]
    assert [(m["machine"], m["port"]) for m in got["missing"]] == [("vca-host", 4369)]   # node4 was not audited
    assert got["summary"] == {"declared": 4, "found": 6, "lan": 1, "unlisted": 2, "missing": 1}
    assert summary_line(got["summary"]) == "exposure: 4 sockets declared, 6 found, 1 open to the LAN, 2 unlisted"
    clean = audit({"vca-node0": [sock("172.31.1.1", 9478), sock("0.0.0.0", 22)]}, rows)
    assert clean["ok"] and clean["unlisted"] == [] and clean["summary"]["lan"] == 0


def test_a_machine_with_no_rows_has_every_socket_unlisted():
    got = audit({"vca-node5": [sock("172.31.6.1", 1234)]}, [row()])
    assert [s["port"] for s in got["unlisted"]] == [1234] and got["missing"] == []


def test_a_socket_in_another_spelling_still_matches():
    assert matches(sock("[::ffff:172.31.1.1]", 9478), row())
    assert matches(sock("fe80::1", 5353, "udp"), row(address="[fe80::1]%eth0", port=5353, proto="udp"))
    assert matches(sock("::1", 9478), row(address="0:0:0:0:0:0:0:1"))
    assert matches(sock("*", 9100), row(address="*", port=9100))
    # a wildcard bind is declared as "*": a row that spells it 0.0.0.0 or :: excuses nothing
    assert not matches(sock("*", 9100), row(address="::", port=9100))
    assert not matches(sock("::", 22), row(address="::", port=22))
    assert not matches(sock("0.0.0.0", 22), row(address="0.0.0.0", port=22))


def test_a_wildcard_bind_under_a_specific_row_is_unlisted_and_the_row_missing():
    got = audit({"vca-node0": [sock("0.0.0.0", 9478, process="agent")]}, [row()])
    assert [(s["address"], s["port"], s["process"]) for s in got["unlisted"]] == [("0.0.0.0", 9478, "agent")]
    assert got["wildcard"] == got["unlisted"] and not got["ok"]
    assert [(m["service"], m["address"], m["port"]) for m in got["missing"]] == [("vcamon agent", "172.31.1.1", 9478)]


def test_a_row_of_any_port_is_found_by_any_socket_it_matches():
    dns = row(machine="vca-host", address="127.0.0.11", port="any", proto="udp", service="docker dns",
              clients=("loopback",))
    found = audit({"vca-host": [sock("127.0.0.11", 40411, "udp"), sock("127.0.0.11", 35001, "tcp")]},
                  [dns, dict(dns, proto="tcp")])
    assert found["ok"] and found["missing"] == []
    assert [(m["proto"], m["port"]) for m in found["matched"]] == [("tcp", 35001), ("udp", 40411)]
    assert all(m["service"] == "docker dns" and m["clients"] == ["loopback"] for m in found["matched"])
    gone = audit({"vca-host": []}, [dns])
    assert [m["port"] for m in gone["missing"]] == ["any"] and gone["ok"]


def test_the_most_specific_row_speaks_for_a_socket():
    rows = [row(machine="vca-host", address="*", port=22, service="sshd", clients=("lan", "loopback")),
            row(machine="vca-host", address="127.0.0.1", port=22, service="a loopback tunnel", clients=("loopback",))]
    got = audit({"vca-host": [sock("127.0.0.1", 22)]}, rows)
    assert [m["service"] for m in got["matched"]] == ["a loopback tunnel"]
    assert got["summary"]["lan"] == 0                  # on loopback: not open to the LAN
    assert got["missing"] == []                        # the wildcard row matched it too
    both = audit({"vca-host": [sock("127.0.0.1", 22), sock("0.0.0.0", 22)]}, rows)
    assert [m["service"] for m in both["matched"]] == ["sshd", "a loopback tunnel"] and both["summary"]["lan"] == 1


def test_the_summary_counts_sockets_and_rows():
    rows = [row(), row(address="*", port=22, service="sshd", clients=("lan",))]
    got = audit({"vca-node0": [sock("172.31.1.1", 9478), sock("0.0.0.0", 22), sock("::", 22)]}, rows)
    assert got["summary"] == {"declared": 2, "found": 3, "lan": 2, "unlisted": 0, "missing": 0} and got["ok"]
    first = got["matched"][0]
    assert (first["machine"], first["service"], first["address"], first["port"], first["auth"]) == \
        ("vca-node0", "sshd", "0.0.0.0", 22, "a token")


def test_the_summary_line_reads_as_the_note_says():
    assert summary_line({"declared": 14, "found": 14, "lan": 3, "unlisted": 0, "missing": 0}) == \
        "exposure: 14 sockets declared, 14 found, 3 open to the LAN, 0 unlisted"
    # the fleet report follows the line with ": " and the unlisted sockets: nothing else may come between
    assert summary_line({"declared": 2, "found": 1, "lan": 0, "unlisted": 1, "missing": 2}).endswith(", 1 unlisted")


@pytest.mark.parametrize("bad, message", [
    ({"proto": "sctp"}, "proto must be tcp or udp"), ({"port": 0}, "port must be 1-65535 or 'any'"),
    ({"port": "ssh"}, "port must be 1-65535"), ({"port": True}, "port must be 1-65535"),
    ({"address": " "}, "a wildcard bind is declared as"), ({"clients": "lan"}, "clients must be a list"),
    ({"service": None, "auth": None}, None)])
def test_a_row_it_cannot_compare_is_a_clear_error(bad, message):
    broken = dict(row(), **{k: v for k, v in bad.items() if v is not None})
    for k, v in bad.items():
        if v is None:
            del broken[k]
    message = message or "lacks service, auth"
    with pytest.raises(ValueError, match=message):
        audit({"vca-node0": [sock("172.31.1.1", 9478)]}, [row(), broken])


def test_a_port_spelt_as_a_string_still_compares():
    got = audit({"vca-node0": [sock("172.31.1.1", 9478)]}, [row(port="9478")])
    assert got["ok"] and got["missing"] == [] and len(got["matched"]) == 1


# -- the table ----------------------------------------------------------------------------------------
HEADER = ["machine", "address", "port", "protocol", "service", "who may connect", "how it authenticates", "reason"]


def table(md):
    """The table's rows as lists of cells (a pipe escaped as \\| stays in its cell)."""
    rows = [line for line in md.splitlines() if line.startswith("|")]
    cells = [[c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in rows]
    assert all(len(c) == len(HEADER) for c in cells), cells
    assert cells[0] == HEADER and set("".join(cells[1])) <= {"-"}
    return [dict(zip(HEADER, c, strict=True)) for c in cells[2:]]


def fleet():
    nodes = [("vca-node%d" % n, "172.31.%d.1" % (n + 1)) for n in (10, 0, 4, 2)]
    return [
        *(row(machine=m, address=a) for m, a in nodes),                                     # one agent on each node
        row(machine="vca-host", address="127.0.0.1", clients=("loopback",), auth="none: loopback only"),
        row(machine="vca-host", address="*", port=22, service="sshd (the host's)", role="common",
            clients=("lan", "loopback"), auth="SSH keys", reason="the owner's way in"),
        *(row(machine="vca-host", address="172.31.%d.254" % (n + 1), port=53, proto="udp", service="dnsmasq",
              role="vca_boot", clients=("vca-node0", "vca-node1"), auth="none") for n in (0, 1)),
        row(machine="vca-host", address="127.0.0.11", port="any", proto="udp", service="docker dns", role="inventory",
            clients=("loopback",), auth="none"),
        row(machine="vca-node2", address="*", port=22, service="sshd (a node's)", role="common", auth="SSH keys"),
    ]


def test_the_table_has_the_columns_and_one_line_per_socket_sorted_by_machine_then_port():
    got = table(render_markdown([r for r in fleet() if r["service"] != "vcamon agent" or r["machine"] == "vca-host"]
                                + [row(machine="vca-node2", address="172.31.3.1")]))
    assert [(r["machine"], r["port"], r["protocol"]) for r in got] == [
        ("vca-host", "22", "tcp"), ("vca-host", "53", "udp"), ("vca-host", "9478", "tcp"), ("vca-host", "any", "udp"),
        ("vca-node2", "22", "tcp"), ("vca-node2", "9478", "tcp")]
    sshd = got[0]
    assert sshd == {"machine": "vca-host", "address": "`*`", "port": "22", "protocol": "tcp",
                    "service": "sshd (the host's) (role common)",
                    "who may connect": "anyone on the LAN, this machine only", "how it authenticates": "SSH keys",
                    "reason": "the owner's way in"}
    assert got[2]["who may connect"] == "this machine only" and got[2]["reason"] == ""
    assert got[5]["who may connect"] == "vca-host"


def test_the_same_service_on_many_machines_is_one_line_that_lists_them_in_order():
    got = table(render_markdown(fleet()))
    agents = [r for r in got if r["service"] == "vcamon agent (role vcamon)"]
    assert [a["machine"] for a in agents] == ["vca-host", "vca-node0<br>vca-node2<br>vca-node4<br>vca-node10"]
    # the addresses in the same order as the machines, line for line
    assert agents[1]["address"] == "`172.31.1.1`<br>`172.31.3.1`<br>`172.31.5.1`<br>`172.31.11.1`"
    assert agents[0]["address"] == "`127.0.0.1`"                       # other clients, other auth: a line apart
    dns = next(r for r in got if r["service"].startswith("dnsmasq"))    # one machine, an address on each link
    assert (dns["machine"], dns["address"]) == ("vca-host", "`172.31.1.254`<br>`172.31.2.254`")
    assert dns["who may connect"] == "vca-node0, vca-node1"
    # a folded line sorts under its first machine
    assert [(r["machine"].split("<br>")[0], r["port"]) for r in got] == [
        ("vca-host", "22"), ("vca-host", "53"), ("vca-host", "9478"), ("vca-host", "any"),
        ("vca-node0", "9478"), ("vca-node2", "22")]


def test_lines_that_differ_in_more_than_machine_and_address_stay_apart():
    base = row(machine="vca-node0", address="172.31.1.1")
    for field, other in (("clients", ["vca-host", "lan"]), ("auth", "none"), ("reason", "asked for"), ("port", 9479),
                         ("proto", "udp"), ("service", "another agent"), ("role", "farm")):
        got = table(render_markdown([base, dict(base, machine="vca-node1", address="172.31.2.1", **{field: other})]))
        assert [r["machine"] for r in got] == ["vca-node0", "vca-node1"], field


def test_a_wildcard_on_many_machines_names_its_address_once():
    rows = [row(machine=m, address="*", port=22, service="sshd") for m in ("vca-node1", "vca-node0")]
    (line,) = table(render_markdown(rows))
    assert (line["machine"], line["address"]) == ("vca-node0<br>vca-node1", "`*`")


def test_the_inventory_is_named_above_the_table_when_given():
    md = render_markdown(fleet(), inventory="inventory/production")
    lines = md.splitlines()
    assert lines[:2] == ["Evaluated for `inventory/production`: 10 sockets on 5 machines.", ""]
    assert lines[2].startswith("| machine | address |")
    plain = render_markdown(fleet())
    assert plain.startswith("| machine | address |") and "Evaluated for" not in plain
    assert md.endswith("|\n") and md.splitlines()[2:] == plain.splitlines()
    assert table(render_markdown([])) == []


def test_no_text_breaks_the_table():
    rows = [row(reason="first line\nsecond | line", auth="a token\r\nin a header", service="a|b")]
    lines = render_markdown(rows).splitlines()
    assert len(lines) == 3
    (got,) = table("\n".join(lines))
    assert got["reason"] == "first line second | line" and got["how it authenticates"] == "a token in a header"
    assert got["service"] == "a|b (role vcamon)"
