"""Two VCA hosts' firewalls and routes, loaded into a real kernel: network namespaces for two hosts,
one node behind each, and a PC on the LAN; vca_boot's own templates rendered by ansible-playbook for
a two-host inventory, then nft and the routes unit's ip lines run in each host's namespace.

Checked by connecting: each declared cross-host flow connects, and arrives from the node's own
address (routed, not NATed); an undeclared one, the same port from another machine, and anything
from the LAN do not; a node's traffic to the LAN is still NATed. The namespace tests (marker
netns) need root with its capabilities on the machine itself: `make test` runs them in a step of
their own (scripts/test-all.sh, group image), not in the fresh-machine container, which has neither
the capabilities nor a writable /proc/sys.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ansible_playbook, role_play, role_template


# Network namespaces and nft: root on the machine itself (scripts/test-all.sh runs these in group image;
# the fresh-machine container has neither the capabilities nor a writable /proc/sys).
def netns_only(test):
    return pytest.mark.netns(pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and nft need root")(test))

LAN = {"vca-host": "10.231.77.1", "vcb-host": "10.231.77.2", "pc": "10.231.77.9"}
NODE = {"vca-node0": ("vca-host", "172.31.1.1"), "vcb-node0": ("vcb-host", "172.30.1.1")}
# The declared sockets (as vca_exposure would give them): an LLM worker on vcb's node for the front on
# vca-host, vcamon's agent on vcb's node for its own host only, the broker on vca-host's link end for
# both hosts' nodes, and a port on vca's node for vcb's node.
ROWS = [
    {"machine": "vcb-node0", "address": "*", "proto": "tcp", "port": 8420, "clients": ["vca-host"]},
    {"machine": "vcb-node0", "address": "*", "proto": "tcp", "port": 9478, "clients": ["vcb-host"]},
    {"machine": "vca-host", "address": "172.31.1.254", "proto": "tcp", "port": 5672,
     "clients": ["vca-node0", "vcb-node0"]},
    {"machine": "vca-node0", "address": "*", "proto": "tcp", "port": 7000, "clients": ["vcb-node0"]},
    # vcamon's agent on vcb-host, at its LAN address, for the monitor host only (roles/vcamon)
    {"machine": "vcb-host", "address": LAN["vcb-host"], "proto": "tcp", "port": 9478, "clients": ["vca-host"]},
]
def render_play(out: Path) -> str:
    """vca_boot's firewall and routes unit for each VCA host."""
    return json.dumps([role_play(
        "vca_host", "vca_boot",
        role_template("vca_boot", "etc/vcafleet/firewall.nft.j2", "%s/{{ inventory_hostname }}.nft" % out),
        role_template("vca_boot", "etc/systemd/system/vcafleet-routes.service.j2",
                      "%s/{{ inventory_hostname }}.routes" % out))])


def two_hosts() -> dict:
    return {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "vca_boot_uplink_interface": "lan0", "vca_boot_exposure": {"sockets": ROWS}},
        "children": {
            "vca_host": {"hosts": {"vca-host": {"vca_lan_address": LAN["vca-host"]},
                                   "vcb-host": {"vca_lan_address": LAN["vcb-host"],
                                                "vca_node_subnet": "172.30.0.0/16"}}},
            "vca_nodes": {"hosts": {n: {"vca_host_name": h, "vca_node": 0, "vca_card": 0, "vca_cpu": 0,
                                        "vca_node_ip": ip} for n, (h, ip) in NODE.items()}}}}}


def render(tmp_path: Path, inventory: dict) -> Path:
    """vca_boot's firewall and routes unit, rendered by ansible-playbook for each VCA host of inventory."""
    out = tmp_path / "rendered"
    out.mkdir()
    run = ansible_playbook(tmp_path, inventory, render_play(out))
    assert run.returncode == 0, run.stdout + run.stderr
    return out


def sh(*argv, ns=None, check=True):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + [str(a) for a in argv]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=30)


class Net:
    """Namespaces named after the machines, with this test's own prefix (two test runs never meet)."""

    def __init__(self):
        self.prefix = "vx%d" % (os.getpid() % 100000)
        self.made = []
        self.servers = []

    def ns(self, machine):
        return "%s-%s" % (self.prefix, machine)

    def add(self, machine):
        sh("ip", "netns", "add", self.ns(machine))
        self.made.append(self.ns(machine))
        sh("ip", "link", "set", "lo", "up", ns=self.ns(machine))

    def link(self, a, b, a_end, b_end):
        """A veth pair between two namespaces; each end is (interface name, address or None)."""
        tmp_a, tmp_b = "%sa%d" % (self.prefix, len(self.made)), "%sb%d" % (self.prefix, len(self.made))
        self.made.append(None)
        sh("ip", "link", "add", tmp_a, "type", "veth", "peer", "name", tmp_b)
        for tmp, machine, (name, addr) in ((tmp_a, a, a_end), (tmp_b, b, b_end)):
            sh("ip", "link", "set", tmp, "netns", self.ns(machine))
            sh("ip", "link", "set", tmp, "name", name, ns=self.ns(machine))
            if addr:
                sh("ip", "addr", "add", addr, "dev", name, ns=self.ns(machine))
            sh("ip", "link", "set", name, "up", ns=self.ns(machine))

    def lan(self, addresses: dict):
        """A LAN: namespace "lan" with a bridge, and each machine of addresses ({machine: its /24 address},
        a namespace added already) on it as lan0."""
        self.add("lan")
        sh("ip", "link", "add", "br0", "type", "bridge", ns=self.ns("lan"))
        sh("ip", "link", "set", "br0", "up", ns=self.ns("lan"))
        for machine, address in addresses.items():
            port = "p%d" % len(self.made)
            self.link(machine, "lan", ("lan0", address + "/24"), (port, None))
            sh("ip", "link", "set", port, "master", "br0", ns=self.ns("lan"))

    def serve(self, machine, address, port, log: Path):
        """A TCP listener that writes each client's address to log (one line per connection)."""
        code = ("import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                "s.bind((sys.argv[1],int(sys.argv[2])));s.listen()\nwhile True:\n c,a=s.accept()\n"
                " open(sys.argv[3],'a').write(a[0]+'\\n');c.close()\n")
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(machine), sys.executable, "-c", code,
                                 address, str(port), str(log)], start_new_session=True)
        self.servers.append(proc)

    def connects(self, machine, address, port, timeout=1.0) -> bool:
        code = ("import socket,sys\ntry:\n socket.create_connection((sys.argv[1],int(sys.argv[2])),"
                "timeout=float(sys.argv[3])).close();print('yes')\nexcept OSError:\n print('no')\n")
        return sh(sys.executable, "-c", code, address, port, timeout, ns=self.ns(machine)).stdout.strip() == "yes"

    def close(self):
        for proc in self.servers:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for name in self.made:
            if name:
                sh("ip", "netns", "del", name, check=False)


@pytest.fixture
def fleet(tmp_path):
    if not shutil.which("nft"):
        pytest.fail("nft is missing: scripts/host-packages.txt lists nftables for the unit tests")
    out = render(tmp_path, two_hosts())
    net = Net()
    try:
        for machine in ("vca-host", "vcb-host", "vca-node0", "vcb-node0", "pc"):
            net.add(machine)
        net.lan(LAN)
        for node, (host, ip) in NODE.items():
            link_end = ip.rsplit(".", 1)[0] + ".254"
            net.link(node, host, ("eth0", ip + "/24"), ("vcalink0", link_end + "/24"))
            sh("ip", "route", "add", "default", "via", link_end, ns=net.ns(node))
        # the PC reaches the nodes through their hosts (as docs/LAB.md's LAN neighbour does)
        sh("ip", "route", "add", "172.31.0.0/16", "via", LAN["vca-host"], ns=net.ns("pc"))
        sh("ip", "route", "add", "172.30.0.0/16", "via", LAN["vcb-host"], ns=net.ns("pc"))
        for host in ("vca-host", "vcb-host"):
            sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=net.ns(host))
            sh("nft", "-f", out / ("%s.nft" % host), ns=net.ns(host))
            for line in (out / ("%s.routes" % host)).read_text().splitlines():
                if line.startswith("ExecStart="):
                    sh(*line.split("=", 1)[1].split(), ns=net.ns(host))
        yield net, out, tmp_path
    finally:
        net.close()


def wait_for(path: Path, lines: int):
    for _ in range(100):
        if path.exists() and len(path.read_text().splitlines()) >= lines:
            return path.read_text().split()
        time.sleep(0.05)
    return path.read_text().split() if path.exists() else []


@netns_only
def test_each_host_routes_the_others_nodes_and_no_node_subnet_is_natted_between_hosts(fleet):
    _, out, _ = fleet
    routes_a = (out / "vca-host.routes").read_text()
    assert "ExecStart=/usr/sbin/ip route replace 172.30.0.0/16 via 10.231.77.2" in routes_a
    assert "172.31.0.0/16" not in routes_a
    assert "ip saddr 172.31.0.0/16 ip daddr != { 172.30.0.0/16 } oifname \"lan0\" masquerade" in \
        (out / "vca-host.nft").read_text()


@netns_only
def test_declared_cross_host_flows_connect_from_the_nodes_own_address(fleet):
    net, _, tmp = fleet
    net.serve("vcb-node0", "0.0.0.0", 8420, tmp / "worker.log")
    net.serve("vca-host", "172.31.1.254", 5672, tmp / "broker.log")
    net.serve("vca-node0", "0.0.0.0", 7000, tmp / "node.log")
    time.sleep(0.5)
    assert net.connects("vca-host", "172.30.1.1", 8420, timeout=5)       # the front to vcb's worker
    assert net.connects("vcb-node0", "172.31.1.254", 5672, timeout=5)    # vcb's node to the broker on vca-host
    assert net.connects("vca-node0", "172.31.1.254", 5672, timeout=5)    # vca's own node to it
    assert net.connects("vcb-node0", "172.31.1.1", 7000, timeout=5)      # node to node, across the hosts
    assert wait_for(tmp / "worker.log", 1) == [LAN["vca-host"]]
    assert sorted(wait_for(tmp / "broker.log", 2)) == ["172.30.1.1", "172.31.1.1"]   # not NATed
    assert wait_for(tmp / "node.log", 1) == ["172.30.1.1"]


@netns_only
def test_undeclared_flows_and_the_lan_do_not_connect(fleet):
    net, _, tmp = fleet
    net.serve("vcb-node0", "0.0.0.0", 8420, tmp / "worker.log")
    net.serve("vcb-node0", "0.0.0.0", 9478, tmp / "agent.log")
    net.serve("vca-node0", "0.0.0.0", 7000, tmp / "node.log")
    net.serve("vca-host", "172.31.1.254", 5672, tmp / "broker.log")
    time.sleep(0.5)
    assert net.connects("vcb-host", "172.30.1.1", 9478, timeout=5)       # declared for its own host: the control
    assert not net.connects("vca-host", "172.30.1.1", 9478)              # not for the other host
    assert not net.connects("vca-node0", "172.30.1.1", 8420)             # the worker is the front's, not a node's
    assert not net.connects("vcb-node0", "172.31.1.1", 7001)             # a port nobody declared
    for target, port in (("172.30.1.1", 8420), ("172.31.1.1", 7000), ("172.31.1.254", 5672)):
        assert not net.connects("pc", target, port)                      # the LAN reaches no node, no link end
    assert wait_for(tmp / "agent.log", 1) == ["172.30.1.254"]             # only the control got through
    assert not (tmp / "node.log").exists() and not (tmp / "worker.log").exists()


@netns_only
def test_a_hosts_socket_declared_for_another_host_takes_that_host_only(fleet):
    """vcamon's agent on vcb-host's LAN address: the monitor host (vca-host) connects, the LAN does not."""
    net, _, tmp = fleet
    net.serve("vcb-host", LAN["vcb-host"], 9478, tmp / "host-agent.log")
    net.serve("vcb-host", LAN["vcb-host"], 9479, tmp / "other.log")
    time.sleep(0.5)
    assert net.connects("vca-host", LAN["vcb-host"], 9478, timeout=5)
    assert not net.connects("pc", LAN["vcb-host"], 9478)
    assert net.connects("pc", LAN["vcb-host"], 9479, timeout=5)         # not the fleet's socket: not its call
    assert wait_for(tmp / "host-agent.log", 1) == [LAN["vca-host"]]


@netns_only
def test_a_nodes_traffic_to_the_lan_is_still_natted(fleet):
    net, _, tmp = fleet
    net.serve("pc", "0.0.0.0", 8000, tmp / "pc.log")
    time.sleep(0.5)
    assert net.connects("vcb-node0", LAN["pc"], 8000, timeout=5)
    assert wait_for(tmp / "pc.log", 1) == [LAN["vcb-host"]]


def test_one_host_renders_no_routes_and_the_ruleset_it_always_had(tmp_path):
    """The same template for a one-host inventory: no peer set, no exemption (byte-for-byte the old rules)."""
    inventory = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                 "vca_boot_uplink_interface": "lan0", "vca_boot_exposure": {"sockets": ROWS[2:3]}},
        "children": {"vca_host": {"hosts": {"vca-host": {}}},
                     "vca_nodes": {"hosts": {"vca-node0": {"vca_node": 0, "vca_card": 0, "vca_cpu": 0,
                                                           "vca_node_ip": "172.31.1.1"}}}}}}
    out = render(tmp_path, inventory)
    rules = (out / "vca-host.nft").read_text()
    assert "peer_host_to_node" not in rules and "daddr !=" not in rules
    assert 'ip saddr 172.31.0.0/16 oifname "lan0" masquerade' in rules
    assert "ExecStart" not in (out / "vca-host.routes").read_text()


def test_a_peer_is_routed_via_its_lan_address_by_the_fleets_one_rule(tmp_path):
    """No vca_lan_address on vcb-host: its IPv4 ansible_host, as fleet_host's lan_address answers for the
    agents too (one rule, tests/test_fleet_roles.py); with neither, the run stops naming vcb-host."""
    inventory = two_hosts()
    hosts = inventory["all"]["children"]["vca_host"]["hosts"]
    hosts["vcb-host"] = {"ansible_host": "192.0.2.22", "vca_node_subnet": "172.30.0.0/16"}
    out = render(tmp_path, inventory)
    routes = (out / "vca-host.routes").read_text()
    assert "ExecStart=/usr/sbin/ip route replace 172.30.0.0/16 via 192.0.2.22\n" in routes
    hosts["vcb-host"] = {"ansible_host": "vcb-host.example.lan", "vca_node_subnet": "172.30.0.0/16"}
    with pytest.raises(AssertionError, match="vcb-host has no address on the LAN: set vca_lan_address"):
        (tmp_path / "none").mkdir()
        render(tmp_path / "none", inventory)
