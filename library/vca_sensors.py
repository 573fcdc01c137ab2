#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_sensors
short_description: Read a node's temperatures, package power, RAPL limits and throttle counters
description:
  - Reads coretemp hwmon (matched by name, not hwmonN), the RAPL package zone
    (matched by name C(package-0)) and the thermal_throttle counters through the
    shared safe sysfs reader rooted at O(sysfs_root).
  - Package power is measured from two energy readings O(sample_seconds) apart,
    modulo the counter range so that a wrap is not a negative spike.
  - C(platform) is C(hardware) only on VCA evidence found under O(sysfs_root): on a
    node C(class/vca) together with the Xeon E3-1585L v5 (C(model name) in
    C(/proc/cpuinfo)) or the Iris Pro P580 (PCI 8086:193a under C(bus/pci/devices));
    on the host the PCI functions the plx87xx driver binds (PLX 10b5:87a0/87a1/87b0/87b1,
    Intel 8086:2953-2956/2958-295a). It is C(lab) where the simulator's marker file
    C(vcasim) sits at the tree's root, and C(unknown) otherwise: a coretemp driver
    alone proves nothing. C(platform_evidence) says what was found.
  - Read-only; never changes anything.
options:
  sysfs_root:
    description: Root of the sysfs tree (C(vca_sysfs_root)); the lab points it at the simulator.
    type: path
    default: /sys
  sample_seconds:
    description: Seconds between the two energy readings; 0 skips the power reading.
    type: float
    default: 1.0
author: vcafleet
"""

EXAMPLES = r"""
- name: Read the node's sensors
  vca_sensors:
    sysfs_root: "{{ vca_sysfs_root }}"
  register: sensors
"""

RETURN = r"""
sensors:
  description: platform (lab|hardware|unknown), platform_evidence (lab_marker, class_vca, cpu_model,
    p580, vca_pci), temperatures_c, package_temp_c, hottest_core_c, package_power_w,
    limits (by constraint name, watts and seconds), rapl_enabled, throttle (core and package counters).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_sensors import read_all
from ansible.module_utils.vca_sysfs import UnsafeSysfsPath


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            sample_seconds=dict(type="float", default=1.0),
        ),
        supports_check_mode=True,
    )
    if module.params["sample_seconds"] < 0:
        module.fail_json(msg="sample_seconds must be >= 0, got %s" % module.params["sample_seconds"])
    try:
        sensors = read_all(module.params["sysfs_root"], module.params["sample_seconds"])
    except (UnsafeSysfsPath, OSError, ValueError) as exc:
        module.fail_json(msg="reading sensors under %s failed: %s" % (module.params["sysfs_root"], exc))
    module.exit_json(changed=False, sensors=sensors)


if __name__ == "__main__":
    main()
