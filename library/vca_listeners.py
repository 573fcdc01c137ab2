#!/usr/bin/python
# SPDX-License-Identifier: MIT
DOCUMENTATION = r"""
module: vca_listeners
short_description: The machine's listening TCP and UDP sockets, the ones that persist
description:
  - Runs C(ss -H -l -t -u -n -p) O(snapshots) times, O(interval_s) apart, and returns the sockets every
    reading showed (C(sockets)) and those only some did (C(transient); a resolver's or a client's
    short-lived unconnected UDP socket). Addresses are normalised (no brackets or scope, IPv4-mapped IPv6
    as IPv4, C(*) for ss's own wildcard).
  - C(process) is the name ss shows, or null where it cannot see the owner (another user's process
    inside a container).
  - Reads only; never changed.
options:
  snapshots:
    description: How many readings (at least 1).
    type: int
    default: 2
  interval_s:
    description: Seconds between readings.
    type: float
    default: 1.0
author: vcafleet
"""

EXAMPLES = r"""
- name: What listens here
  vca_listeners:
  register: listeners
"""

RETURN = r"""
sockets:
  description: "[{proto, address, port, process}], in every reading."
  returned: always
  type: list
  elements: dict
transient:
  description: The sockets only some readings showed.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_listeners import parse, read_persistent


def main():
    module = AnsibleModule(argument_spec={"snapshots": {"type": "int", "default": 2},
                                          "interval_s": {"type": "float", "default": 1.0}},
                           supports_check_mode=True)
    ss = module.get_bin_path("ss", required=True)

    def read():
        rc, out, err = module.run_command([ss, "-H", "-l", "-t", "-u", "-n", "-p"],
                                          environ_update={"LANG": "C", "LC_ALL": "C"})
        if rc != 0:
            module.fail_json(msg="ss failed (rc %d): %s" % (rc, (err or out).strip()))
        return parse(out)

    try:
        sockets, transient = read_persistent(read, module.params["snapshots"], module.params["interval_s"])
    except ValueError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, sockets=sockets, transient=transient)


if __name__ == "__main__":
    main()
