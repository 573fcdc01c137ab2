#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_inventory_check
short_description: Check that the inventory agrees with the VCA topology rule
description:
  - Node n is card n // 3, CPU n % 3, at 172.31.(n+1).1. Checks every node's
    C(vca_node), C(vca_card), C(vca_cpu) and C(vca_node_ip) against that rule,
    that node numbers are unique, that card groups match C(vca_card), that the
    required groups are not empty, and that no dead node is in a service group.
  - Fails with one line per problem, each naming the host (or group) and the field.
  - Reads only its arguments; changes nothing.
options:
  nodes:
    description:
      - Per node host the four topology variables, keyed by inventory hostname.
      - The action plugin fills it from C(hostvars) of every host in C(vca_nodes) when not given.
    type: dict
  groups:
    description:
      - The inventory's groups, as Ansible's C(groups).
      - The action plugin fills it from the inventory when not given.
    type: dict
  service_groups:
    description: Groups that run services; a dead node may be in none of them.
    type: list
    elements: str
    default: [smem_interactive, smem_background, farm]
  required_groups:
    description: Groups that must not be empty.
    type: list
    elements: str
    default: [vca_host, vca_nodes, smem_interactive, smem_background, farm]
author: vcafleet
"""

EXAMPLES = r"""
- name: Validate the inventory against the topology rule
  vca_inventory_check:
"""

RETURN = r"""
errors:
  description: One line per inconsistency (empty when the inventory is valid).
  returned: always
  type: list
  elements: str
nodes_checked:
  description: How many node hosts were checked.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_topology import REQUIRED_GROUPS, SERVICE_GROUPS, check_inventory


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nodes=dict(type="dict", required=True),
            groups=dict(type="dict", required=True),
            service_groups=dict(type="list", elements="str", default=list(SERVICE_GROUPS)),
            required_groups=dict(type="list", elements="str", default=list(REQUIRED_GROUPS)),
        ),
        supports_check_mode=True,
    )
    p = module.params
    errors = check_inventory(p["nodes"], p["groups"], p["service_groups"], p["required_groups"])
    result = dict(changed=False, errors=errors, nodes_checked=len(p["nodes"]))
    if errors:
        module.fail_json(msg="inventory does not match the VCA topology:\n" + "\n".join(errors), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
