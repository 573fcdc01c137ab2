"""The exposure audit's rules (module_utils/vca_exposure.py), the listeners' parser and the port scan."""

from __future__ import annotations

import socket
import time

import pytest
from ansible.module_utils.vca_exposure import audit, is_wildcard, matches, normalise, render_markdown, summary_line
from ansible.module_utils.vca_listeners import parse, persistent
from ansible.module_utils.vca_portscan import ScanTimeout, ports_of, scan

from conftest import run_module


def row(machine="vca-node0", address="172.31.1.1", port=9478, proto="tcp", clients=("vca-host",), **kw):
    return {"machine": machine, "service": kw.pop("service", "vcamon agent"), "role": kw.pop("role", "vcamon"),
            "proto": proto, "address": address, "port": port, "clients": list(clients),
            "auth": kw.pop("auth", "a token"), "reason": kw.pop("reason", ""), "probe": {}, **kw}


def sock(address, port, proto="tcp", process=None):
    return {"proto": proto, "address": address, "port": port, "process": process}


@pytest.mark.parametrize("given, want", [("[::]", "::"), ("*", "*"), ("", "*"), ("[::ffff:127.0.0.1]", "127.0.0.1"),
                                         ("127.0.0.53%lo", "127.0.0.53"), ("[fe80::1%eth0]", "fe80::1"),
                                         ("0:0:0:0:0:0:0:1", "::1"), ("172.31.1.1", "172.31.1.1")])
def test_addresses_have_one_spelling(given, want):
    assert normalise(given) == want


def test_wildcards():
    assert all(is_wildcard(a) for a in ("0.0.0.0", "::", "[::]", "*", "::ffff:0.0.0.0"))
    assert not any(is_wildcard(a) for a in ("127.0.0.1", "::1", "172.31.1.254"))


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
    assert [(s["machine"], s["address"], s["port"]) for s in got["unlisted"]] == \
        [("vca-node0", "127.0.0.1", 9999), ("vca-node0", "0.0.0.0", 8000)] or \
        {(s["machine"], s["address"], s["port"]) for s in got["unlisted"]} == \
        {("vca-node0", "127.0.0.1", 9999), ("vca-node0", "0.0.0.0", 8000)}
    assert [(s["address"], s["port"], s["process"]) for s in got["wildcard"]] == [("0.0.0.0", 8000, "python3")]
    assert [(m["machine"], m["port"]) for m in got["missing"]] == [("vca-host", 4369)]   # node4 was not audited
    assert got["summary"] == {"declared": 4, "found": 6, "lan": 1, "unlisted": 2, "missing": 1}
    assert summary_line(got["summary"]) == ("exposure: 4 sockets declared, 6 found, 1 open to the LAN, 2 unlisted, "
                                            "1 declared but not found")
    clean = audit({"vca-node0": [sock("172.31.1.1", 9478), sock("0.0.0.0", 22)]}, rows)
    assert clean["ok"] and clean["unlisted"] == [] and clean["summary"]["lan"] == 0


def test_a_machine_with_no_rows_has_every_socket_unlisted():
    got = audit({"vca-node5": [sock("172.31.6.1", 1234)]}, [row()])
    assert [s["port"] for s in got["unlisted"]] == [1234] and got["missing"] == []


def test_the_table_folds_one_service_on_many_machines():
    rows = [row(), row(machine="vca-node4", address="172.31.5.1"),
            row(machine="vca-host", address="127.0.0.1", clients=("loopback",)),
            row(machine="vca-host", address="*", port=22, service="sshd", role="common", clients=("lan", "loopback"),
                reason="the owner's | way in")]
    md = render_markdown(rows, inventory="inventory/production")
    lines = md.splitlines()
    assert lines[0] == "Evaluated for `inventory/production`: 4 sockets on 3 machines."
    agents = [line for line in lines if "vcamon agent" in line]
    assert len(agents) == 2                                             # the nodes' folded, the host's apart
    assert "vca-node0 `172.31.1.1`<br>vca-node4 `172.31.5.1`" in agents[1] or \
        "vca-node0 `172.31.1.1`<br>vca-node4 `172.31.5.1`" in agents[0]
    assert any("this machine only" in a for a in agents)
    sshd = next(line for line in lines if "sshd" in line)
    assert "anyone on the LAN, this machine only" in sshd and "the owner's / way in" in sshd
    assert all(line.count("|") == 8 for line in lines if line.startswith("|"))


SS = """\
udp UNCONN 0      0      127.0.0.11:60402 0.0.0.0:*
tcp LISTEN 0      4096    127.0.0.1:4369  0.0.0.0:* users:(("systemd",pid=1,fd=43))
tcp LISTEN 0      128       0.0.0.0:22    0.0.0.0:* users:(("sshd",pid=39,fd=3))
tcp LISTEN 0      128          [::]:22       [::]:* users:(("sshd",pid=39,fd=4))
udp UNCONN 0      0    127.0.0.53%lo:53      0.0.0.0:* users:(("systemd-resolve",pid=5,fd=13))
tcp LISTEN 0      5    [fe80::1%eth0]:8080    [::]:*
tcp LISTEN 0      5    [::ffff:127.0.0.1]:8000    *:*
tcp LISTEN 0      5               *:9100        *:*
"""


def test_ss_lines_are_read_whatever_their_address():
    got = parse(SS)
    assert [(s["proto"], s["address"], s["port"], s["process"]) for s in got] == [
        ("udp", "127.0.0.11", 60402, None), ("tcp", "127.0.0.1", 4369, "systemd"), ("tcp", "0.0.0.0", 22, "sshd"),
        ("tcp", "::", 22, "sshd"), ("udp", "127.0.0.53", 53, "systemd-resolve"), ("tcp", "fe80::1", 8080, None),
        ("tcp", "127.0.0.1", 8000, None), ("tcp", "*", 9100, None)]
    assert parse("tcp ESTAB 0 0 10.0.0.1:22 10.0.0.2:5000\n") == []      # a connection is not a listener


def test_only_what_every_reading_shows_persists():
    first = [*parse(SS), sock("0.0.0.0", 41000, "udp")]      # a resolver's query socket, gone by the next reading
    second = parse(SS)
    kept, transient = persistent([first, second])
    assert len(kept) == len(second) and [(s["address"], s["port"]) for s in transient] == [("0.0.0.0", 41000)]
    assert persistent([]) == ([], [])


def test_the_module_finds_a_listener_here_with_the_real_ss(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        got = run_module("vca_listeners", {"snapshots": 2, "interval_s": 0.1}, capsys)
    assert not got.get("failed"), got
    assert {"proto": "tcp", "address": "127.0.0.1", "port": port} in [
        {k: x[k] for k in ("proto", "address", "port")} for x in got["sockets"]]


# -- the scan, on loopback only ---------------------------------------------------------------------
@pytest.fixture
def listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


@pytest.fixture
def full_backlog():
    """A port whose accept queue is full: Linux drops further SYNs, so a connect waits, as a dropping
    firewall makes it."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(0)
    port = s.getsockname()[1]
    held = []
    for _ in range(4):               # fill the queue (backlog 0 still admits one or two)
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        held.append(c)
    time.sleep(0.2)
    yield port
    for c in held:
        c.close()
    s.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ports_are_parsed_and_bounded():
    assert ports_of("1-3,5") == [1, 2, 3, 5] and ports_of([22, "80-81"]) == [22, 80, 81]
    for bad in ("0-10", "65536", "", "5-1"):
        with pytest.raises(ValueError):
            ports_of(bad)


def test_open_closed_and_filtered(listener, full_backlog):
    closed = free_port()
    got = scan(["127.0.0.1"], [listener, closed, full_backlog], timeout_s=0.5)
    t = got["targets"]["127.0.0.1"]
    assert t["open"] == [listener] and t["closed"] == 1 and t["filtered"] == 1, got


def test_a_sweep_of_every_port_finds_the_listener_and_not_a_closed_port(listener):
    closed = free_port()
    got = scan(["127.0.0.1"], "1-65535", concurrency=2048, timeout_s=2.0)
    here = got["targets"]["127.0.0.1"]
    assert here["scanned"] == 65535 and got["connects"] == 65535
    assert listener in here["open"] and closed not in here["open"]
    assert here["open"] == sorted(here["open"])   # (other processes' listeners here may be open too)


def test_the_bounds_hold_before_and_while_it_runs(full_backlog):
    with pytest.raises(ValueError, match="nothing was sent"):
        scan(["127.0.0.1", "127.0.0.2"], "1-65535", max_connects=100000)
    with pytest.raises(ValueError, match="IP addresses"):
        scan(["localhost"], [22])
    with pytest.raises(ScanTimeout) as e:
        scan(["127.0.0.1"], [full_backlog] * 1, timeout_s=30, max_duration_s=0.5)
    assert e.value.partial["targets"]["127.0.0.1"]["scanned"] == 0


def test_confirm_probes_a_declared_port_again(listener, full_backlog):
    got = scan(["127.0.0.1"], [listener, full_backlog], timeout_s=0.3, confirm={"127.0.0.1": [listener]},
               confirm_timeout_s=2.0)
    assert got["confirmed"] == {"127.0.0.1:%d" % listener: {"sweep": "open", "final": "open"}}
    with pytest.raises(ValueError, match="not scanned"):
        scan(["127.0.0.1"], [listener], confirm={"127.0.0.9": [22]})


def test_the_module_scans_and_says_what_it_found(listener, capsys):
    got = run_module("vca_port_scan", {"targets": ["127.0.0.1"], "ports": str(listener), "timeout_s": 1.0}, capsys)
    assert not got.get("failed") and got["targets"]["127.0.0.1"]["open"] == [listener], got
    bad = run_module("vca_port_scan", {"targets": ["127.0.0.1"], "ports": "1-65535", "max_connects": 10}, capsys)
    assert bad["failed"] and "nothing was sent" in bad["msg"]
