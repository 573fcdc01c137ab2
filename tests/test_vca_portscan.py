"""The bounded TCP connect scan (module_utils/vca_portscan.py, library/vca_port_scan.py), on loopback only."""

from __future__ import annotations

import glob
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from ansible.module_utils import vca_portscan
from ansible.module_utils.vca_listeners import parse
from ansible.module_utils.vca_portscan import ScanTimeout, ports_of, raise_fd_limit, scan

from conftest import ROOT, run_module

HERE = "127.0.0.1"


def listening(backlog=64):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((HERE, 0))
    s.listen(backlog)
    return s


@pytest.fixture
def listener():
    with listening() as s:
        yield s.getsockname()[1]


@pytest.fixture
def full_backlog():
    """A port whose accept queue is full: Linux drops further SYNs, so a connect waits, as a dropping
    firewall makes it."""
    s = listening(0)
    port = s.getsockname()[1]
    held = []
    for _ in range(4):               # fill the queue (backlog 0 still admits one)
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex((HERE, port))
        held.append(c)
    time.sleep(0.2)
    yield port
    for c in held:
        c.close()
    s.close()


def free_port():
    with socket.socket() as s:
        s.bind((HERE, 0))
        return s.getsockname()[1]


def test_a_full_accept_queue_really_drops_a_connect_here(full_backlog):
    with socket.socket() as c:
        c.settimeout(0.5)
        with pytest.raises(TimeoutError):
            c.connect((HERE, full_backlog))


def test_ports_are_parsed_and_bounded():
    assert ports_of("1-3,5") == [1, 2, 3, 5] and ports_of([22, "80-81"]) == [22, 80, 81] and ports_of(7) == [7]
    assert ports_of("1-65535")[-1] == 65535 and len(ports_of("1-65535")) == 65535
    for bad in ("0-10", "65536", "", "5-1", "-", []):
        with pytest.raises(ValueError, match="ports"):
            ports_of(bad)
    with pytest.raises(ValueError, match="not a port or a range of ports: 'ssh'"):
        ports_of("22,ssh")


def test_open_closed_and_filtered(listener, full_backlog):
    closed = free_port()
    got = scan([HERE], [listener, closed, full_backlog], timeout_s=0.5)
    t = got["targets"][HERE]
    assert t == {"open": [listener], "closed": 1, "filtered": 1, "scanned": 3}, got
    assert got["connects"] == 3 and got["confirmed"] == {}


def test_an_open_port_is_sent_nothing():
    with listening() as s:
        port = s.getsockname()[1]
        got = scan([HERE], [port])
        conn, _ = s.accept()
        with conn:
            conn.settimeout(5)
            assert conn.recv(16) == b""        # the scanner closed it without a byte
    assert got["targets"][HERE]["open"] == [port]


def test_a_connect_that_meets_itself_is_closed(monkeypatch):
    """From one of this machine's own ports to the same port (TCP's simultaneous open): nobody listens there.
    A sweep of every local port meets it now and then; here it is made to, by binding the source port."""
    real_socket = vca_portscan.new_socket
    port = free_port()

    def to_itself(target, to_port):
        sock = real_socket(target, to_port)
        sock.bind((target, to_port))
        return sock

    monkeypatch.setattr(vca_portscan, "new_socket", to_itself)
    got = scan([HERE], [port], timeout_s=5)
    assert got["targets"][HERE] == {"open": [], "closed": 1, "filtered": 0, "scanned": 1}


def test_a_sweep_of_every_port_finds_exactly_what_listens_here():
    """Every port of 127.0.0.1: what the scan finds open is what ss says listens there, ours included
    (other jobs may open or close theirs meanwhile: what changed between the two readings is let be)."""
    def listeners(reachable=("127.0.0.1", "0.0.0.0", "*")):
        """{port: whether its accept queue is full (then a SYN is dropped: filtered, rightly)}"""
        if shutil.which("ss") is None:
            return {}
        out = subprocess.run(["ss", "-H", "-l", "-t", "-n"], capture_output=True, text=True, check=True).stdout
        return {s["port"]: int(line.split()[2]) > int(line.split()[3])
                for line in out.splitlines() for s in parse(line) if s["address"] in reachable}

    def maybe():
        # a socket on :: answers 127.0.0.1 too, unless it was made IPv6-only: ss does not say which
        return set(listeners(("127.0.0.1", "0.0.0.0", "*", "::")))

    with listening() as a, listening() as b:
        ours = {a.getsockname()[1], b.getsockname()[1]}
        closed = free_port()
        before, could = listeners(), maybe()
        got = scan([HERE], "1-65535", concurrency=2048, timeout_s=2.0, confirm={HERE: sorted(ours)})
        after, could = listeners(), could | maybe()
    here = got["targets"][HERE]
    found = set(here["open"])
    assert here["scanned"] == 65535 and got["connects"] == 65535 + 2
    assert here["closed"] + here["filtered"] + len(found) == 65535 and here["open"] == sorted(found)
    assert ours <= found and closed not in found
    if before or after:
        # nothing that never listened is open; nothing that listened all along (queue not full) is missed
        assert found <= could, found - could
        steady = {p for p in set(before) & set(after) if not before[p] and not after[p]}
        assert steady <= found, steady - found


def test_the_bound_on_connects_refuses_before_anything_is_sent():
    with listening() as s:
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=r"131070 connects asked for, more than max_connects \(100000\): nothing"):
            scan([HERE, "127.0.0.2"], "1-65535", max_connects=100000)
        with pytest.raises(ValueError, match="nothing was sent"):
            scan([HERE, "127.0.0.2"], [port], max_connects=1)
        with pytest.raises(ValueError, match="nothing was sent"):
            scan([HERE], [port], max_connects=1, confirm={HERE: [port]})     # the confirm's connects count too
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.accept()                          # nobody connected


@pytest.mark.parametrize("kwargs, message", [
    ({"targets": ["localhost"]}, "IP addresses"), ({"targets": ["172.31.1"]}, "IP addresses"),
    ({"targets": []}, "no targets"), ({"concurrency": 0}, "must be positive"), ({"timeout_s": 0}, "must be positive"),
    ({"max_duration_s": -1}, "must be positive"), ({"confirm_timeout_s": 0}, "must be positive"),
    ({"confirm": {"127.0.0.9": [22]}}, "not scanned"), ({"ports": "0"}, "1-65535")])
def test_bad_input_is_refused_clearly(kwargs, message):
    args = {"targets": [HERE], "ports": [22], **kwargs}
    with pytest.raises(ValueError, match=message):
        scan(args.pop("targets"), args.pop("ports"), **args)


def test_the_time_bound_stops_a_scan_with_what_it_found(listener, full_backlog):
    closed = free_port()
    with pytest.raises(ScanTimeout, match="max_duration_s") as e:
        scan([HERE], [listener, closed, full_backlog], timeout_s=60, max_duration_s=3)
    partial = e.value.partial
    assert partial["targets"][HERE] == {"open": [listener], "closed": 1, "filtered": 0, "scanned": 2}
    assert partial["connects"] == 3                    # the third was begun, never answered


def test_one_bound_on_concurrency_across_every_target_and_the_connects_made(full_backlog):
    # one connect at a time, the first waits: the second target's never begins (a bound per target would let it)
    with pytest.raises(ScanTimeout) as e:
        scan([HERE, "127.0.0.2"], [full_backlog], concurrency=1, timeout_s=60, max_duration_s=2)
    partial = e.value.partial
    assert partial["connects"] == 1 and partial["concurrency"] == 1
    assert partial["targets"]["127.0.0.2"]["scanned"] == 0 and partial["targets"][HERE]["scanned"] == 0


def test_confirm_probes_a_declared_port_again_and_its_answer_stands(monkeypatch, full_backlog):
    late = free_port()                  # nobody listens there during the sweep; someone does by the confirm
    opened = []
    real_probe = vca_portscan.probe

    def probe(target, port, timeout):
        if timeout == 5.0 and not opened:       # the confirm's probe, after the sweep
            opened.append(listening_on(late))
        return real_probe(target, port, timeout)

    monkeypatch.setattr(vca_portscan, "probe", probe)
    try:
        got = scan([HERE], [late, full_backlog], timeout_s=0.3, confirm={HERE: [late]}, confirm_timeout_s=5.0)
    finally:
        for s in opened:
            s.close()
    assert got["confirmed"] == {"%s:%d" % (HERE, late): {"sweep": "closed", "final": "open", "changed": True}}
    assert got["targets"][HERE] == {"open": [late], "closed": 0, "filtered": 1, "scanned": 2}


def listening_on(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((HERE, port))
    s.listen(8)
    return s


def test_a_confirmed_port_that_did_not_change_says_so(listener):
    got = scan([HERE], [listener], confirm={HERE: [listener]})
    assert got["confirmed"] == {"%s:%d" % (HERE, listener): {"sweep": "open", "final": "open", "changed": False}}


def test_a_probe_that_breaks_is_not_silently_dropped(monkeypatch, full_backlog):
    """The second target's connect breaks while the first's waits (dropped): the error comes out, and the
    connect begun before it is closed, not left open behind the scan."""
    real_socket = vca_portscan.new_socket
    made = []

    def new_socket(target, port):
        if target == "127.0.0.2":
            raise RuntimeError("a probe broke")
        made.append(real_socket(target, port))
        return made[-1]

    monkeypatch.setattr(vca_portscan, "new_socket", new_socket)
    with pytest.raises(RuntimeError, match="a probe broke"):
        scan([HERE, "127.0.0.2"], [full_backlog], timeout_s=30)
    assert len(made) == 1 and made[0].fileno() == -1


def test_the_open_file_limit_is_raised_or_the_concurrency_lowered(monkeypatch):
    calls = []
    monkeypatch.setattr(resource, "setrlimit", lambda what, limits: calls.append(limits))
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 1 << 20))
    assert raise_fd_limit(4096) == 4096 and calls == [(4096 + 256, 1 << 20)]
    calls.clear()
    monkeypatch.setattr(resource, "getrlimit", lambda what: (1024, 1024))
    assert raise_fd_limit(4096) == 1024 - 256
    got = scan([HERE], [free_port()], concurrency=4096)
    assert got["concurrency"] == 768 and "allows 768 connects at a time, not 4096" in got["note"]

    def refuse(what, limits):
        raise ValueError("not permitted")
    monkeypatch.setattr(resource, "setrlimit", refuse)
    monkeypatch.setattr(resource, "getrlimit", lambda what: (2048, resource.RLIM_INFINITY))
    assert raise_fd_limit(4096) == 2048 - 256


def python310():
    """A Python 3.10 (Ubuntu 22.04's) to run the scan under, if this machine has one."""
    pyenv = os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10")
    found = [shutil.which("python3.10"), *sorted(glob.glob(pyenv))]
    for candidate in filter(None, found):
        run = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 10))"],
                             capture_output=True, text=True, check=False)
        if run.returncode == 0 and run.stdout.strip() == "True":
            return candidate
    return None


@pytest.mark.skipif(sys.version_info[:2] == (3, 10), reason="this interpreter is 3.10: the other tests cover it")
def test_filtered_ports_and_the_time_bound_on_python_3_10(full_backlog, listener):
    """The scan as Ubuntu 22.04's Python runs it on a node or host."""
    interpreter = python310()
    if interpreter is None:
        pytest.skip("no Python 3.10 here")
    script = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, sys.argv[1])
        from vca_portscan import ScanTimeout, scan
        listener, dropped = int(sys.argv[2]), int(sys.argv[3])
        out = {"scan": scan(["127.0.0.1"], [listener, dropped], timeout_s=0.5)["targets"]["127.0.0.1"]}
        try:
            scan(["127.0.0.1"], [listener, dropped], timeout_s=60, max_duration_s=2)
        except ScanTimeout as e:
            out["timeout"] = e.partial["targets"]["127.0.0.1"]
        print(json.dumps(out))
    """)
    run = subprocess.run([interpreter, "-c", script, str(ROOT / "module_utils"), str(listener), str(full_backlog)],
                         capture_output=True, text=True, check=False, timeout=60)
    assert run.returncode == 0, run.stderr
    got = json.loads(run.stdout)
    assert got["scan"] == {"open": [listener], "closed": 0, "filtered": 1, "scanned": 2}
    assert got["timeout"] == {"open": [listener], "closed": 0, "filtered": 0, "scanned": 1}


def test_the_module_scans_and_says_what_it_found(listener, capsys):
    got = run_module("vca_port_scan", {"targets": [HERE], "ports": str(listener), "timeout_s": 1.0,
                                       "confirm": {HERE: [listener]}}, capsys)
    assert not got.get("failed") and got["changed"] is False, got
    assert got["targets"][HERE]["open"] == [listener]
    assert got["confirmed"]["%s:%d" % (HERE, listener)]["final"] == "open"
    ports = [listener, "%d-%d" % (listener, listener)]
    ranged = run_module("vca_port_scan", {"targets": [HERE], "ports": ports}, capsys)
    assert ranged["targets"][HERE]["scanned"] == 1


def test_the_module_fails_clearly(full_backlog, capsys):
    bad = run_module("vca_port_scan", {"targets": [HERE], "ports": "1-65535", "max_connects": 10}, capsys)
    assert bad["failed"] and "nothing was sent" in bad["msg"]
    name = run_module("vca_port_scan", {"targets": ["localhost"], "ports": "22"}, capsys)
    assert name["failed"] and "IP addresses" in name["msg"]
    late = run_module("vca_port_scan", {"targets": [HERE], "ports": [full_backlog], "timeout_s": 60,
                                        "max_duration_s": 1}, capsys)
    assert late["failed"] and "max_duration_s" in late["msg"]
    assert late["targets"][HERE] == {"open": [], "closed": 0, "filtered": 0, "scanned": 0} and late["connects"] == 1
