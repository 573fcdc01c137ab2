#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_energy
short_description: Snapshot a machine's RAPL package energy counters (every socket's)
description:
  - Reads C(energy_uj) and C(max_energy_range_uj) of every RAPL zone named C(package-N) (package-0,
    package-1, ... on a machine of several sockets; found by name, never by index) through the shared
    safe sysfs reader rooted at O(sysfs_root),
    with the time of the reading and the machine's platform label (C(lab), C(hardware) or
    C(unknown), see M(vca_sensors)).
  - Two snapshots around a load give its energy: each package's difference, taken modulo its
    C(max_energy_range_uj) so that a counter wrap is not a negative figure, summed over the packages
    (see module_utils/vca_capacity.py).
  - A machine without a package zone, or with one unreadable, is not an error; C(energy_uj) is null
    and C(reason) says why,
    so that the benchmark reports no energy figure for it rather than zero.
  - Read-only; never changes anything.
options:
  sysfs_root:
    description: Root of the sysfs tree (C(vca_sysfs_root)); the lab points it at the simulator.
    type: path
    default: /sys
author: vcafleet
"""

EXAMPLES = r"""
- name: Energy counter before the load
  vca_energy:
    sysfs_root: "{{ vca_sysfs_root | default('/sys') }}"
  register: before
"""

RETURN = r"""
snapshot:
  description: t (epoch seconds), platform, zones ({powercap path of each package - {energy_uj,
    max_energy_range_uj}}, or null), zone, energy_uj and max_energy_range_uj (the first package's, or
    null without a counter), reason (why there is none, else null).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_capacity import energy_snapshot
from ansible.module_utils.vca_sysfs import Sysfs, UnsafeSysfsPath


def main():
    module = AnsibleModule(
        argument_spec=dict(sysfs_root=dict(type="path", default="/sys")),
        supports_check_mode=True,
    )
    try:
        snapshot = energy_snapshot(Sysfs(module.params["sysfs_root"]))
    except (UnsafeSysfsPath, OSError) as exc:
        module.fail_json(msg="reading the energy counter under %s failed: %s" % (module.params["sysfs_root"], exc))
    module.exit_json(changed=False, snapshot=snapshot)


if __name__ == "__main__":
    main()
