DOCUMENTATION = r"""
module: vca_evidence_bundle
short_description: Write the hardware evidence bundle (bundle.json, raw/, SUMMARY.md), with no secret in it
description:
  - Runs on the controller, last in C(playbooks/verify-hardware.yml). Each check is handed in as its kind
    and what its task returned; the verdict (pass, fail or skipped with its reason), the figures and
    their C(platform) label are made here (module_utils/vca_evidence.py), so a check that needs a card
    is C(skipped: needs hardware) anywhere else and never C(pass).
  - Every file it writes is scrubbed of private key blocks and of every secret found in O(secrets_paths).
  - In check mode nothing is written; C(would_run) lists the checks.
options:
  dir:
    description: The bundle's directory (C(evidence/<UTC date>-<host>)); made if absent.
    type: path
    required: true
  checks:
    description: "[{name, tag, kind, host, command, started, ended, output, expect?, expect_caps?, label?}]."
    type: list
    elements: dict
    required: true
  platforms:
    description: Per machine, M(vca_sensors)' C(platform) and C(platform_evidence).
    type: dict
    required: true
  host:
    description: The VCA host the bundle is about.
    type: str
    required: true
  inventory:
    description: The inventory it ran against (named in the bundle).
    type: str
    default: ""
  secrets_paths:
    description: Files and directories on the controller whose contents are secrets (the credentials).
    type: list
    elements: path
    default: []
author: vcafleet
"""

EXAMPLES = r"""
- name: The bundle
  vca_evidence_bundle:
    dir: evidence/2026-12-06-vca-host
    checks: "{{ vca_evidence_checks }}"
    platforms: "{{ vca_evidence_platforms }}"
    host: vca-host
    secrets_paths: [inventory/mysite/credentials]
"""

RETURN = r"""
counts:
  description: How many checks passed, failed and were skipped.
  returned: not in check mode
  type: dict
summary:
  description: SUMMARY.md's text.
  returned: not in check mode
  type: str
would_run:
  description: In check mode, each check's name, tag and command.
  returned: check mode
  type: list
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_evidence import build, secrets_from, summary


def main():
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "checks": {"type": "list", "elements": "dict", "required": True},
            "platforms": {"type": "dict", "required": True},
            "host": {"type": "str", "required": True},
            "inventory": {"type": "str", "default": ""},
            "secrets_paths": {"type": "list", "elements": "path", "default": [], "no_log": False},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=False, would_run=[{k: c.get(k) for k in ("name", "tag", "command")}
                                                   for c in p["checks"]])
    meta = {"host": p["host"], "inventory": p["inventory"], "generated_by": "playbooks/verify-hardware.yml",
            "generated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        bundle = build(p["checks"], p["platforms"], p["dir"], meta, secrets_from(p["secrets_paths"]))
    except (OSError, ValueError, KeyError) as exc:
        module.fail_json(msg="vca_evidence_bundle: %s: %s" % (type(exc).__name__, exc))
    module.exit_json(changed=True, counts=bundle["counts"], summary=summary(bundle), dir=p["dir"])


if __name__ == "__main__":
    main()
