#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_governor
short_description: Set the cpufreq governor of every CPU of a node
description:
  - Reads every CPU's C(cpufreq/scaling_governor) under O(sysfs_root) and writes
    O(governor) where it differs. Every CPU is checked against its
    C(scaling_available_governors) before the first write, so a governor the
    driver does not offer fails and changes nothing.
  - A node with no cpufreq at all fails, naming the directory.
  - Each write is read back. Supports check mode.
  - Not persistent by itself: role node_base's boot unit applies it at every boot.
options:
  governor:
    description: The governor to run, e.g. C(performance).
    type: str
    default: performance
  sysfs_root:
    description: Root of the sysfs tree (C(vca_sysfs_root)).
    type: path
    default: /sys
  node:
    description: Name used in messages (the inventory host).
    type: str
    default: this node
author: vcafleet
"""

EXAMPLES = r"""
- name: Every CPU runs the performance governor
  vca_governor:
    governor: performance
    sysfs_root: "{{ vca_sysfs_root }}"
    node: "{{ inventory_hostname }}"
"""

RETURN = r"""
governors:
  description: The governor of each CPU afterwards (or before, in check mode).
  returned: success
  type: dict
changes:
  description: One line per CPU changed, C(cpuN: before -> after).
  returned: always
  type: list
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_governor import GovernorError, apply, governors, plan
from ansible.module_utils.vca_sysfs import Sysfs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            governor=dict(type="str", default="performance"),
            sysfs_root=dict(type="path", default="/sys"),
            node=dict(type="str", default="this node"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    sysfs = Sysfs(p["sysfs_root"])
    try:
        changes = plan(sysfs, p["governor"], p["node"])
        if changes and not module.check_mode:
            apply(sysfs, changes, p["governor"], p["node"])
        lines = ["%s: %s -> %s" % (cpu, before, p["governor"]) for cpu, _, before in changes]
        module.exit_json(changed=bool(changes), changes=lines, governors=governors(sysfs))
    except (GovernorError, OSError) as exc:
        module.fail_json(msg=str(exc), changes=[])


if __name__ == "__main__":
    main()
