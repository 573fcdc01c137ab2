"""Where the agent and the page listen: an address or a name the inventory gives, loopback when none."""

from __future__ import annotations

import ipaddress
import logging
import socket

LOG = logging.getLogger("vcamon.net")
WILDCARDS = ("0.0.0.0", "::", "[::]")


def bind_address(listen, default_host="127.0.0.1"):
    """'addr:port' (addr an IPv4 address or a name) -> (IPv4 address, port); no address = default_host.

    A name is resolved here, once, to the address it has now: in the lab the
    collector scrapes a node by its container name, and the agent binds to
    what that name resolves to on the lab network (the same answer the
    collector gets from the lab's DNS). A wildcard is honoured, with a warning.
    """
    host, _, port = listen.rpartition(":")
    host = host or default_host
    if host in WILDCARDS:
        LOG.warning("%s: listening on every address; anyone who reaches this machine can connect", listen)
        return "0.0.0.0", int(port)
    return socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_STREAM)[0][4][0], int(port)


def is_loopback(address):
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False
