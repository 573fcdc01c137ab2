#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_power_cap
short_description: Set a node's RAPL PL1/PL2 (watts) and time windows through the powercap sysfs
description:
  - Finds the package-0 zone and its constraints by name (C(long_term) = PL1,
    C(short_term) = PL2), never by index.
  - Every value is checked before anything is written; a power limit outside
    [1 W, constraint max_power_uw], a non-positive window or PL2 below PL1
    fails and changes nothing.
  - A locked limit (the zone's C(enabled) reads 0, or a write gives EACCES/EPERM)
    fails with the node and the file named.
  - Before the first write, the limits in force are recorded in O(stock_file);
    a value left null is brought back to that stock value, so removing a cap
    from the inventory restores the firmware's limit.
  - Supports check mode and diff (in watts and seconds).
options:
  sysfs_root:
    description: Root of the sysfs tree (C(vca_sysfs_root)).
    type: path
    default: /sys
  node:
    description: Name used in messages (the inventory host).
    type: str
    default: this node
  pl1_w:
    description: PL1 (long_term) in watts; null means stock.
    type: float
  pl2_w:
    description: PL2 (short_term) in watts; null means stock.
    type: float
  pl1_window_s:
    description: PL1 time window in seconds; null means stock.
    type: float
  pl2_window_s:
    description: PL2 time window in seconds; null means stock.
    type: float
  stock_file:
    description: Where the limits found before the first write are kept.
    type: path
    default: /etc/vcafleet/power-cap.stock.json
author: vcafleet
"""

EXAMPLES = r"""
- name: Cap card 1's nodes at PL1 35 W / PL2 40 W
  vca_power_cap:
    sysfs_root: "{{ vca_sysfs_root }}"
    node: "{{ inventory_hostname }}"
    pl1_w: 35
    pl2_w: 40
"""

RETURN = r"""
limits_w:
  description: PL1/PL2 in force afterwards (or that would be, in check mode), by constraint name, in watts and seconds.
  returned: success
  type: dict
changes:
  description: One line per value written (or that would be), in watts or seconds.
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_power_cap import (
    LIMITS,
    PowerCap,
    PowerCapError,
    describe,
    fmt_value,
    load_stock,
    save_stock,
    wanted,
)
from ansible.module_utils.vca_sysfs import Sysfs, UnsafeSysfsPath


def with_stock(want, stock):
    """Fill every value left null with the recorded stock value."""
    merged = {name: dict(fields) for name, fields in want.items()}
    for _, name in LIMITS:
        for field, value in (stock or {}).get(name, {}).items():
            if value is not None:
                merged.setdefault(name, {}).setdefault(field, value)
    return merged


def in_watts(limits):
    def scaled(micro):
        return None if micro is None else micro / 1e6

    return {
        name: {"power_limit_w": scaled(f.get("power_limit_uw")), "time_window_s": scaled(f.get("time_window_us"))}
        for name, f in limits.items()
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            node=dict(type="str", default="this node"),
            pl1_w=dict(type="float"),
            pl2_w=dict(type="float"),
            pl1_window_s=dict(type="float"),
            pl2_window_s=dict(type="float"),
            stock_file=dict(type="path", default="/etc/vcafleet/power-cap.stock.json"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        cap = PowerCap(Sysfs(p["sysfs_root"]), p["node"])
        before = cap.current()
        stock = load_stock(p["stock_file"])
        want = with_stock(wanted(p["pl1_w"], p["pl2_w"], p["pl1_window_s"], p["pl2_window_s"]), stock)
        changes = cap.plan(want)
        if changes and not module.check_mode:
            if stock is None:
                save_stock(p["stock_file"], before)
            cap.apply(changes)
    except PowerCapError as exc:
        module.fail_json(msg=str(exc))
    except (UnsafeSysfsPath, OSError, ValueError) as exc:
        module.fail_json(msg="%s: power caps under %s: %s" % (p["node"], p["sysfs_root"], exc))

    after = {name: dict(fields) for name, fields in before.items()}
    for name, field, _, value in changes:
        after[name][field] = value
    result = dict(
        changed=bool(changes),
        limits_w=in_watts(after),
        changes=["%s %s: %s -> %s" % (name, field, fmt_value(field, old), fmt_value(field, new))
                 for name, field, old, new in changes],
    )
    if module._diff:
        result["diff"] = dict(before=describe(before), after=describe(after),
                              before_header="%s RAPL" % p["node"], after_header="%s RAPL" % p["node"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
