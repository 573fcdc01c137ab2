#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_status
short_description: VCA node states from vcactl status, as facts
description:
  - Runs C(vcactl status) (C locale) and returns one record per node, keyed by
    the global node number (card * 3 + cpu).
  - Also reads C(class/vca/*/state) under O(sysfs_root) through the shared safe
    sysfs reader (on the host, one entry per node device; on a node, C(vca)).
  - An unknown state string is reported with C(state_class=unknown), not as an error.
  - Read-only.
options:
  vcactl:
    description: The vcactl binary; found on PATH (and /usr/sbin) when not given.
    type: path
  use_vcactl:
    description: Run vcactl; false reads only sysfs (on a node, which has no vcactl).
    type: bool
    default: true
  sysfs_root:
    description: Root of the sysfs tree (C(vca_sysfs_root)).
    type: path
    default: /sys
author: vcafleet
"""

EXAMPLES = r"""
- name: Read the node states
  vca_status:
  register: status
"""

RETURN = r"""
ansible_facts:
  description:
    - C(vca_node_status), {node number as string -> {node, card, cpu, state, state_class, known, link}} from vcactl.
    - C(vca_sysfs_state), {device name -> {state, state_class, known}} from class/vca/*/state.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_sysfs import Sysfs, UnsafeSysfsPath
from ansible.module_utils.vcactl import parse_status, sysfs_states


def vcactl_states(module):
    vcactl = module.params["vcactl"] or module.get_bin_path(
        "vcactl", required=True, opt_dirs=["/usr/sbin", "/usr/local/sbin"]
    )
    module.run_command_environ_update = dict(LANG="C", LC_ALL="C", LC_MESSAGES="C")
    rc, out, err = module.run_command([vcactl, "status"])
    if rc != 0:
        module.fail_json(msg="vcactl status failed (rc=%d): %s" % (rc, (err or out).strip()), rc=rc)
    records = parse_status(out)
    if not records:
        module.fail_json(msg="vcactl status printed no node lines", stdout=out)
    return dict((str(r["node"]), r) for r in records)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            vcactl=dict(type="path"),
            use_vcactl=dict(type="bool", default=True),
            sysfs_root=dict(type="path", default="/sys"),
        ),
        supports_check_mode=True,
    )
    nodes = vcactl_states(module) if module.params["use_vcactl"] else {}
    try:
        sysfs = sysfs_states(Sysfs(module.params["sysfs_root"]))
    except (UnsafeSysfsPath, OSError) as exc:
        module.fail_json(msg="reading class/vca under %s failed: %s" % (module.params["sysfs_root"], exc))
    module.exit_json(changed=False, ansible_facts=dict(vca_node_status=nodes, vca_sysfs_state=sysfs))


if __name__ == "__main__":
    main()
