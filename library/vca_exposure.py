#!/usr/bin/python
# SPDX-License-Identifier: MIT
DOCUMENTATION = r"""
module: vca_exposure
short_description: The fleet's declared listening sockets, evaluated from the roles and the inventory
description:
  - Reads every role's C(meta/exposure.yml) (a list C(sockets)) and evaluates each socket for each
    machine it lives on, with that machine's variables over the role's C(defaults/main.yml); the same
    values the role itself uses when it binds the socket. Then the inventory's own rows
    (C(vca_exposure_extra) of the host the task runs for; the lab's, or a LAN opening an owner adds).
  - A socket declaration has C(service), C(machines) (inventory hosts it listens on), C(proto) (tcp or
    udp), C(address) (an address, a list of them, or C(*) for a declared wildcard bind), C(port) (or
    C(any)), C(clients) (inventory hosts allowed to connect, or the words C(lan) and C(loopback)),
    C(auth) (how it authenticates), and optionally C(reason), C(probe) (how the exposure test shows
    a request without the credential refused) and C(metrics) (what Prometheus scrapes there: C(job),
    C(path) (default C(/metrics)), C(credential_file) (a file on the scraping host holding the bearer
    token alone) and, when that file is a JSON object of tokens, C(credential_json_key), or when it is a
    map of C(name token) lines (HAProxy's), C(credential_map_key)).
  - The host's firewall (role vca_boot), docs/EXPOSURE.md and the exposure audit
    (playbooks/exposure.yml) are all made from this one table.
  - Runs on the controller only (an action plugin); it contacts nothing.
options:
  roles_path:
    description: Directories of roles to read; default the configured roles path.
    type: list
    elements: path
  extra_var:
    description: The inventory variable holding extra rows.
    type: str
    default: vca_exposure_extra
author: vcafleet
"""

EXAMPLES = r"""
- name: The declared sockets
  vca_exposure:
  register: exposure
"""

RETURN = r"""
sockets:
  description: >-
    One row per machine, address and port: machine, role, service, proto, address, port, clients,
    auth, reason, probe, metrics.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"roles_path": {"type": "list", "elements": "path"},
                                          "extra_var": {"type": "str", "default": "vca_exposure_extra"}},
                           supports_check_mode=True)
    module.fail_json(msg="vca_exposure runs on the controller (action_plugins/vca_exposure.py): call it as a task")


if __name__ == "__main__":
    main()
