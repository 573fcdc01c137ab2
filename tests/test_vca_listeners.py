"""The listening-socket reader (module_utils/vca_listeners.py, library/vca_listeners.py): ss's lines, and
only the sockets that persist."""

from __future__ import annotations

import shutil
import socket
import subprocess

import pytest
from ansible.module_utils.vca_listeners import parse, persistent, read_persistent

from conftest import run_module

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

# as iproute2 really prints a bound interface: after the address, after its brackets too
SS_MORE = """\
udp UNCONN 0      0     0.0.0.0%eth0:68        0.0.0.0:* users:(("dhclient",pid=7,fd=6))
udp UNCONN 0      0  [fe80::a00:27ff:fe4e:66a1]%enp0s3:546  [::]:*
udp UNCONN 0      0           *%eth0:5353         *:*
tcp LISTEN 0      511   [2001:0db8:0:0::1]:443       [::]:* users:(("nginx",pid=81,fd=7),("nginx",pid=80,fd=7))
tcp LISTEN 0      128        [::1]:631         [::]:* users:(("cupsd",pid=9,fd=7))

tcp LISTEN 0      128    172.31.1.1:9478   0.0.0.0:* users:(("vcamon-agent",pid=300,fd=5))
"""


def key(s):
    return (s["proto"], s["address"], s["port"], s["process"])


def sock(address, port, proto="tcp", process=None):
    return {"proto": proto, "address": address, "port": port, "process": process}


def test_the_lab_lines_are_read_whatever_their_address():
    assert [key(s) for s in parse(SS)] == [
        ("udp", "127.0.0.11", 60402, None), ("tcp", "127.0.0.1", 4369, "systemd"), ("tcp", "0.0.0.0", 22, "sshd"),
        ("tcp", "::", 22, "sshd"), ("udp", "127.0.0.53", 53, "systemd-resolve"), ("tcp", "fe80::1", 8080, None),
        ("tcp", "127.0.0.1", 8000, None), ("tcp", "*", 9100, None)]


def test_scoped_specific_and_multi_process_lines():
    assert [key(s) for s in parse(SS_MORE)] == [
        ("udp", "0.0.0.0", 68, "dhclient"), ("udp", "fe80::a00:27ff:fe4e:66a1", 546, None),
        ("udp", "*", 5353, None), ("tcp", "2001:db8::1", 443, "nginx"), ("tcp", "::1", 631, "cupsd"),
        ("tcp", "172.31.1.1", 9478, "vcamon-agent")]


def test_what_is_not_a_listener_is_left_out():
    assert parse("tcp ESTAB 0 0 10.0.0.1:22 10.0.0.2:5000\n") == []          # a connection
    assert parse("Netid State Recv-Q Send-Q Local Address:Port Peer Address:Port\n\n") == []   # a header
    assert parse("") == []


@pytest.mark.parametrize("line", ["tcp LISTEN 0 128 0.0.0.0:ssh 0.0.0.0:*",        # a name: -n was lost
                                  "udp UNCONN 0 0 127.0.0.1 0.0.0.0:*",
                                  "tcp LISTEN 0 128 0.0.0.0:70000 0.0.0.0:*"])
def test_a_line_it_cannot_read_is_a_clear_error_not_a_socket_lost(line):
    with pytest.raises(ValueError, match="cannot read this line of ss"):
        parse(line + "\n" + SS)


def test_only_what_every_reading_shows_persists():
    first = [*parse(SS), sock("0.0.0.0", 41000, "udp")]      # a resolver's query socket, gone by the next reading
    second = parse(SS)
    kept, transient = persistent([first, second])
    assert sorted(map(key, kept)) == sorted(set(map(key, second)))
    assert [(s["address"], s["port"]) for s in transient] == [("0.0.0.0", 41000)]
    assert persistent([]) == ([], [])


def test_persistent_sockets_are_sorted_deduplicated_and_keep_a_process_seen_once():
    one = [sock("127.0.0.1", 80), sock("0.0.0.0", 22), sock("0.0.0.0", 22), sock("::", 22)]
    two = [sock("::", 22), sock("0.0.0.0", 22, process="sshd"), sock("127.0.0.1", 80), sock("127.0.0.1", 53, "udp")]
    kept, transient = persistent([one, two])
    assert [key(s) for s in kept] == [("tcp", "0.0.0.0", 22, "sshd"), ("tcp", "::", 22, None),
                                      ("tcp", "127.0.0.1", 80, None)]
    assert [key(s) for s in transient] == [("udp", "127.0.0.1", 53, None)]


def test_readings_are_taken_apart_and_bounded():
    readings = iter([[sock("127.0.0.1", 1)], [sock("127.0.0.1", 1)], [sock("127.0.0.1", 1), sock("127.0.0.1", 2)]])
    slept = []
    kept, transient = read_persistent(lambda: next(readings), 3, 0.25, sleep=slept.append)
    assert slept == [0.25, 0.25]                              # between readings, not before the first
    assert [s["port"] for s in kept] == [1] and [s["port"] for s in transient] == [2]
    for bad in ((0, 1.0), (2, -1.0)):
        with pytest.raises(ValueError, match="snapshots"):
            read_persistent(lambda: [], *bad, sleep=slept.append)


needs_ss = pytest.mark.skipif(shutil.which("ss") is None, reason="no ss here")


def real_ss():
    out = subprocess.run(["ss", "-H", "-l", "-t", "-u", "-n", "-p"], capture_output=True, text=True, check=True,
                         env={"LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}).stdout
    return parse(out)


@needs_ss
def test_a_listener_closed_between_real_readings_is_not_persistent():
    tcp, udp = socket.socket(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    udp.bind(("127.0.0.1", 0))
    gone, stays = ("tcp", "127.0.0.1", tcp.getsockname()[1]), ("udp", "127.0.0.1", udp.getsockname()[1])

    def read():
        got = real_ss()
        tcp.close()                  # after the first reading: gone by the second
        return got

    try:
        kept, transient = read_persistent(read, 2, 0, sleep=lambda _s: None)
    finally:
        tcp.close()
        udp.close()
    kept, transient = ({(s["proto"], s["address"], s["port"]) for s in x} for x in (kept, transient))
    assert gone in transient and gone not in kept
    assert stays in kept and stays not in transient


@needs_ss
def test_the_module_finds_a_listener_here_with_the_real_ss(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        got = run_module("vca_listeners", {"snapshots": 2, "interval_s": 0.1}, capsys)
    assert not got.get("failed"), got
    assert got["changed"] is False
    assert {"proto": "tcp", "address": "127.0.0.1", "port": port} in [
        {k: x[k] for k in ("proto", "address", "port")} for x in got["sockets"]]
    assert got["sockets"] == sorted(got["sockets"], key=lambda x: (x["proto"], x["port"], x["address"]))


@needs_ss
def test_the_module_refuses_no_readings(capsys):
    got = run_module("vca_listeners", {"snapshots": 0}, capsys)
    assert got["failed"] and "snapshots must be at least 1" in got["msg"]
