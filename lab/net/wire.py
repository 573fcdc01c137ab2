#!/usr/bin/env python3
"""Wire the lab's machines as a VCA card wires its nodes (lab only; run as root on the Docker machine).

On a card every node has its own point-to-point virtual ethernet link to the host: node n's eth0 at
172.31.(n+1).1/24, MTU 65521, its default route and nameserver the host's end of that link. The lab's
node containers run with no Docker network at all; this script gives each one that link, a veth pair
whose other end sits in the lab host's container. The host container is on the lab's LAN network
(Docker's), which is its uplink; the neighbour container on the same LAN gets a route to
172.31.0.0/16 through the host's LAN address, as anyone on an owner's LAN would add one.

    wire.py --host CONTAINER [--neighbour CONTAINER --lan-address IP] \
            --link NODE_CONTAINER,NODE_IP,HOST_IP,HOST_IFNAME ...

Idempotent: a link already there with both ends and their addresses is left alone. A container that
restarted lost its end (a network namespace dies with its container, and a veth with its peer), so
the link is made again. Prints one JSON object: {"changed": [what was done, ...]}.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import subprocess
import sys

MTU = 65521          # the VCA virtual ethernet's MTU (the node image sets it on eth0)
NODE_IFNAME = "eth0"
PREFIX = 24
FLEET = "172.31.0.0/16"


def run(*argv: str, check: bool = True) -> str:
    p = subprocess.run(argv, check=False, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise SystemExit("wire.py: %s: %s" % (" ".join(argv), (p.stderr or p.stdout).strip()))
    return p.stdout


def pid_of(container: str) -> str:
    pid = run("docker", "inspect", "-f", "{{.State.Pid}}", container).strip()
    if pid in ("", "0"):
        raise SystemExit("wire.py: container %s is not running" % container)
    return pid


def in_ns(pid: str, *argv: str, check: bool = True) -> str:
    return run("nsenter", "-t", pid, "-n", *argv, check=check)


def has_address(pid: str, ifname: str, address: str) -> bool:
    out = in_ns(pid, "ip", "-j", "addr", "show", "dev", ifname, check=False)
    try:
        links = json.loads(out or "[]")
    except ValueError:
        return False
    return any(a.get("local") == address and a.get("prefixlen") == PREFIX and "UP" in link.get("flags", [])
               for link in links for a in link.get("addr_info", []))


def link(host_pid: str, node: str, node_ip: str, host_ip: str, host_ifname: str) -> list[str]:
    node_pid = pid_of(node)
    if has_address(node_pid, NODE_IFNAME, node_ip) and has_address(host_pid, host_ifname, host_ip):
        return []
    # whatever is left of an old link (one end outlives a restart of the other's container only
    # until the kernel notices; a half is never reused)
    in_ns(node_pid, "ip", "link", "del", NODE_IFNAME, check=False)
    in_ns(host_pid, "ip", "link", "del", host_ifname, check=False)
    tag = hashlib.sha256(node.encode()).hexdigest()[:8]
    a, b = "vw%sn" % tag, "vw%sh" % tag        # temporary names in this machine's namespace (<= 15)
    run("ip", "link", "del", a, check=False)
    run("ip", "link", "add", a, "mtu", str(MTU), "type", "veth", "peer", "name", b, "mtu", str(MTU))
    run("ip", "link", "set", a, "netns", node_pid)
    run("ip", "link", "set", b, "netns", host_pid)
    in_ns(node_pid, "ip", "link", "set", a, "name", NODE_IFNAME, "up")
    in_ns(node_pid, "ip", "addr", "add", "%s/%d" % (node_ip, PREFIX), "dev", NODE_IFNAME)
    in_ns(node_pid, "ip", "route", "replace", "default", "via", host_ip, "dev", NODE_IFNAME)
    in_ns(host_pid, "ip", "link", "set", b, "name", host_ifname, "up")
    in_ns(host_pid, "ip", "addr", "add", "%s/%d" % (host_ip, PREFIX), "dev", host_ifname)
    # The node image's /etc/resolv.conf names the host's end of the link (roles/node_image); a
    # container's is Docker's file, written here to say the same.
    run("docker", "exec", node, "sh", "-c", "printf 'nameserver %s\\n' > /etc/resolv.conf" % host_ip)
    return ["%s: eth0 %s/%d <-> %s %s/%d" % (node, node_ip, PREFIX, host_ifname, host_ip, PREFIX)]


def neighbour_route(container: str, via: str) -> list[str]:
    pid = pid_of(container)
    routes = json.loads(in_ns(pid, "ip", "-j", "route", "show", FLEET) or "[]")
    if any(r.get("gateway") == via for r in routes):
        return []
    in_ns(pid, "ip", "route", "replace", FLEET, "via", via)
    return ["%s: %s via %s" % (container, FLEET, via)]


def parse_link(value: str) -> tuple[str, str, str, str]:
    parts = value.split(",")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError("--link is NODE_CONTAINER,NODE_IP,HOST_IP,HOST_IFNAME: %r" % value)
    node, node_ip, host_ip, ifname = parts
    for ip in (node_ip, host_ip):
        if ipaddress.ip_address(ip) not in ipaddress.ip_network(FLEET):
            raise argparse.ArgumentTypeError("%s is not in %s" % (ip, FLEET))
    if ipaddress.ip_interface("%s/%d" % (node_ip, PREFIX)).network != \
            ipaddress.ip_interface("%s/%d" % (host_ip, PREFIX)).network:
        raise argparse.ArgumentTypeError("%s and %s are not on one /%d" % (node_ip, host_ip, PREFIX))
    if not 0 < len(ifname) <= 15:
        raise argparse.ArgumentTypeError("interface name %r: 1 to 15 characters" % ifname)
    return node, node_ip, host_ip, ifname


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", required=True, help="the lab host's container")
    ap.add_argument("--link", action="append", type=parse_link, default=[])
    ap.add_argument("--neighbour", help="the LAN neighbour's container")
    ap.add_argument("--lan-address", help="the host's address on the LAN (the neighbour's route)")
    args = ap.parse_args(argv)
    if bool(args.neighbour) != bool(args.lan_address):
        ap.error("--neighbour and --lan-address go together")
    host_pid = pid_of(args.host)
    changed = []
    for spec in args.link:
        changed += link(host_pid, *spec)
    if args.neighbour:
        changed += neighbour_route(args.neighbour, args.lan_address)
    print(json.dumps({"changed": changed}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
