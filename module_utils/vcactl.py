# SPDX-License-Identifier: MIT
"""Parsing of `vcactl status` output into per-node records."""

from __future__ import annotations

import re

# Every state string the VCA 2.3.26 driver defines (the VCA_*_TEXT of vca_common.h), by class.
STATES = {
    "link_down": "dead",
    "bios_down": "off",
    "power_off": "off",
    "powering_down": "transition",
    "bios_up": "bios",
    "bios_ready": "bios",
    "flashing": "transition",
    "resetting": "transition",
    "booting": "transition",
    "os_rebooting": "transition",
    "waiting_for_boot": "transition",
    "busy": "transition",
    "done": "bios",
    "error": "error",
    "drv_probe_done": "transition",
    "drv_probe_error": "error",
    "dhcp_in_progress": "transition",
    "dhcp_done": "os",
    "dhcp_error": "error",
    "nfs_mount_done": "os",
    "nfs_mount_error": "error",
    "net_device_up": "os",
    "net_device_down": "error",
    "net_device_no_ip": "os",
    "os_ready": "os",
    "net_device_ready": "os",
}

STATUS_LINE = re.compile(r"^\s*Card:\s*(\d+)\s+Cpu:\s*(\d+)\s+STATE:\s*(\S+)\s*$")


def parse_status(text, nodes_per_card=3):
    """Records {node, card, cpu, state, state_class, known, link} per status line.

    An unknown state string is kept and reported as class 'unknown', never an error:
    a newer driver may add states this table does not know yet.
    """
    records = []
    for raw in text.splitlines():
        m = STATUS_LINE.match(raw)
        if not m:
            continue
        card, cpu, state = int(m.group(1)), int(m.group(2)), m.group(3)
        record = {"node": card * nodes_per_card + cpu, "card": card, "cpu": cpu}
        record.update(classify(state))
        record["link"] = "down" if state == "link_down" else ("up" if record["known"] else "unknown")
        records.append(record)
    return records


def classify(state):
    return {"state": state, "state_class": STATES.get(state, "unknown"), "known": state in STATES}


def sysfs_states(sysfs):
    """{device: classify(state)} for every class/vca/<device>/state; absent class -> {}."""
    found = {}
    for device in sysfs.listdir("class/vca"):
        state = sysfs.read_optional("class/vca/%s/state" % device)
        if state is not None:
            found[device] = classify(state)
    return found
