#!/usr/bin/python
# SPDX-License-Identifier: MIT
DOCUMENTATION = r"""
module: vca_port_scan
short_description: A bounded, concurrent TCP connect scan of some addresses, from this machine
description:
  - Connects to every port of O(ports) on every address of O(targets), up to O(concurrency) at once
    across all of them, and says which were open (connected; closed at once, nothing sent), closed
    (refused) and filtered (no answer within O(timeout_s), or unreachable; a firewall that drops).
  - Bounded before anything is sent (O(max_connects)) and while it runs (O(max_duration_s), then the module
    fails with what it had found).
  - O(confirm) lists ports expected open; each is probed again alone with O(confirm_timeout_s), and that
    answer stands (a busy machine cannot make a declared port look filtered).
  - Targets are IP addresses only. Scan only machines you own (the lab's, or your fleet).
  - Changes nothing; it runs in check mode too.
options:
  targets:
    description: IP addresses.
    type: list
    elements: str
    required: true
  ports:
    description: Ports, as a list or a string of ranges (C(1-65535), C(22,80)).
    type: raw
    default: 1-65535
  concurrency:
    description: Connects in flight at once, across every target (lowered to what the open-file limit allows).
    type: int
    default: 4096
  timeout_s:
    description: How long one connect may wait for an answer.
    type: float
    default: 1.0
  max_connects:
    description: The most connects one run may make.
    type: int
    default: 2000000
  max_duration_s:
    description: The most seconds one run may take.
    type: float
    default: 600
  confirm:
    description: "{target: [ports]} to probe again alone after the sweep."
    type: dict
    default: {}
  confirm_timeout_s:
    description: The timeout of those probes.
    type: float
    default: 3.0
author: vcafleet
"""

EXAMPLES = r"""
- name: The fleet as the LAN sees it
  vca_port_scan:
    targets: [192.168.1.20, 172.31.1.1]
    ports: 1-65535
    confirm: {192.168.1.20: [22]}
  register: scan
"""

RETURN = r"""
targets:
  description: "{address: {open: [ports], closed: n, filtered: n, scanned: n}}"
  returned: always
  type: dict
connects:
  description: Connects made (begun, where the scan ran out of time), the confirm's included.
  returned: always
  type: int
duration_s:
  description: Seconds the scan took.
  returned: always
  type: float
concurrency:
  description: Connects at once, as run.
  returned: always
  type: int
note:
  description: Why the concurrency is lower than asked for (the open-file limit).
  returned: when it is
  type: str
confirmed:
  description: >-
    {'address:port': {sweep, final, changed}} for the confirmed ports; C(final) is the state the result
    counts, C(changed) whether it differs from the sweep's.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_portscan import ScanTimeout, scan


def main():
    module = AnsibleModule(
        argument_spec={
            "targets": {"type": "list", "elements": "str", "required": True},
            "ports": {"type": "raw", "default": "1-65535"},
            "concurrency": {"type": "int", "default": 4096},
            "timeout_s": {"type": "float", "default": 1.0},
            "max_connects": {"type": "int", "default": 2000000},
            "max_duration_s": {"type": "float", "default": 600},
            "confirm": {"type": "dict", "default": {}},
            "confirm_timeout_s": {"type": "float", "default": 3.0},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        result = scan(p["targets"], p["ports"], concurrency=p["concurrency"], timeout_s=p["timeout_s"],
                      max_connects=p["max_connects"], max_duration_s=p["max_duration_s"], confirm=p["confirm"],
                      confirm_timeout_s=p["confirm_timeout_s"])
    except ValueError as e:
        module.fail_json(msg=str(e))
    except ScanTimeout as e:
        module.fail_json(msg=str(e), **e.partial)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
