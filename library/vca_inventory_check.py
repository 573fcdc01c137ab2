#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_inventory_check
short_description: Check that the inventory agrees with the VCA topology rule
description:
  - Node n is card n // 3, CPU n % 3, at the first address of the (n+1)th /24 of
    its host's node subnet (172.31.(n+1).1 in the default 172.31.0.0/16). Checks
    every node's C(vca_node), C(vca_card), C(vca_cpu) and C(vca_node_ip) against
    that rule, that node numbers are unique under each host, that card groups
    match C(vca_card), that the required groups are not empty, and that no dead
    node is in a service group.
  - With several VCA hosts, each node names its host with C(vca_host_name) (it may be
    left unset while there is one host), each host's C(vca_node_subnet) is a
    valid IPv4 network of /23 or wider, and no two hosts' node subnets overlap.
  - Fails with one line per problem, each naming the host (or group) and the field.
  - Reads only its arguments; changes nothing.
options:
  nodes:
    description:
      - Per node host the four topology variables and C(vca_host_name), keyed by inventory hostname.
      - The action plugin fills it from C(hostvars) of every host in C(vca_nodes) when not given.
    type: dict
  groups:
    description:
      - The inventory's groups, as Ansible's C(groups).
      - The action plugin fills it from the inventory when not given.
    type: dict
  vca_hosts:
    description:
      - Per VCA host its C(vca_node_subnet), keyed by inventory hostname; a host
        that is not here, or sets none, has 172.31.0.0/16.
      - The action plugin fills it from C(hostvars) of every host in C(vca_host) when not given.
    type: dict
    default: {}
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
fleet:
  description: Per VCA host its node subnet and the nodes that name it.
  returned: always
  type: dict
  sample: {vca-host: {node_subnet: 172.31.0.0/16, nodes: [vca-node0, vca-node1, vca-node2]}}
nodes_checked:
  description: How many node hosts were checked.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_topology import REQUIRED_GROUPS, SERVICE_GROUPS, inspect_inventory


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nodes=dict(type="dict", required=True),
            groups=dict(type="dict", required=True),
            vca_hosts=dict(type="dict", default={}),
            service_groups=dict(type="list", elements="str", default=list(SERVICE_GROUPS)),
            required_groups=dict(type="list", elements="str", default=list(REQUIRED_GROUPS)),
        ),
        supports_check_mode=True,
    )
    p = module.params
    errors, fleet = inspect_inventory(p["nodes"], p["groups"], p["service_groups"], p["required_groups"],
                                      p["vca_hosts"])
    result = dict(changed=False, errors=errors, fleet=fleet, nodes_checked=len(p["nodes"]))
    if errors:
        module.fail_json(msg="inventory does not match the VCA topology:\n" + "\n".join(errors), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
