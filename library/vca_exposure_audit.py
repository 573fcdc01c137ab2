#!/usr/bin/python
# SPDX-License-Identifier: MIT
DOCUMENTATION = r"""
module: vca_exposure_audit
short_description: Compare the fleet's listening sockets with its declared table, or render the table
description:
  - With O(action=audit), every socket found on a machine (M(vca_listeners)) must match a row the table
    declares for that machine (M(vca_exposure)); same protocol, same port (or a row of port C(any)), the same
    address, or a row of address C(*). A socket on a wildcard address matches only a row that declares the
    wildcard. Declared sockets that were not found are listed too. Nothing is changed; the module does not
    fail; the playbook decides (playbooks/exposure.yml fails on any unlisted socket).
  - With O(action=render), the table as Markdown (docs/EXPOSURE.md).
  - A declared address that is a name is replaced by what it resolved to on its machine (O(resolved)).
options:
  action:
    description: audit or render.
    type: str
    choices: [audit, render]
    default: audit
  rows:
    description: The declared table, M(vca_exposure)'s C(sockets).
    type: list
    elements: dict
    required: true
  found:
    description: Per machine, the sockets M(vca_listeners) found (its C(sockets)). Machines left out are not audited.
    type: dict
    default: {}
  resolved:
    description: A declared name and C(getent ahosts NAME)'s output on its machine.
    type: dict
    default: {}
  inventory:
    description: For O(action=render), the inventory the table was evaluated for (named in the text).
    type: str
    default: ""
author: vcafleet
"""

EXAMPLES = r"""
- name: Compare what listens with the table
  vca_exposure_audit:
    rows: "{{ declared.sockets }}"
    found: {vca-host: "{{ hostvars['vca-host'].listeners.sockets }}"}
  register: audit
"""

RETURN = r"""
audit:
  description: unlisted, wildcard, missing, matched, summary and ok (module_utils/vca_exposure.py).
  returned: action audit
  type: dict
summary_line:
  description: One line, as the fleet report ends with it (module_utils/vca_exposure.py summary_line).
  returned: action audit
  type: str
markdown:
  description: The table as Markdown.
  returned: action render
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_exposure import audit, render_markdown, summary_line


def resolve(rows, resolved):
    """Rows whose address is a name, once per address that name resolved to on its machine."""
    out = []
    for row in rows:
        got = resolved.get(row["address"])
        if got is None:
            out.append(row)
            continue
        addresses = sorted({line.split()[0] for line in got.splitlines() if line.strip()})
        out += [dict(row, address=a, declared_as=row["address"]) for a in addresses]
    return out


def main():
    module = AnsibleModule(
        argument_spec={
            "action": {"type": "str", "choices": ["audit", "render"], "default": "audit"},
            "rows": {"type": "list", "elements": "dict", "required": True},
            "found": {"type": "dict", "default": {}},
            "resolved": {"type": "dict", "default": {}},
            "inventory": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        if p["action"] == "render":
            module.exit_json(changed=False, markdown=render_markdown(p["rows"], inventory=p["inventory"]))
        result = audit(p["found"], resolve(p["rows"], p["resolved"]))
    except (ValueError, KeyError) as e:
        module.fail_json(msg="vca_exposure_audit: %s" % e)
    module.exit_json(changed=False, audit=result, summary_line=summary_line(result["summary"]))


if __name__ == "__main__":
    main()
