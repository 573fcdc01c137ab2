#!/usr/bin/python
# SPDX-License-Identifier: MIT
DOCUMENTATION = r"""
---
module: vca_image_store
short_description: The host's store of built node images, with candidate, good and previous
description:
  - One store for the fleet; each build lives under its build_id (the builder's
    content name for it), and three links name the C(candidate) being rolled
    out, the C(good) image that passed the verifier on every live node and the
    C(previous) good one, kept for rollback.
  - C(state=present) moves a finished build (O(src), a C(vca-image build --out)
    directory) into the store after checking its sha256, and makes it the candidate.
  - C(state=candidate) makes an existing build (O(build_id)) the candidate.
  - C(state=promoted) makes O(build_id) good, the good before it previous, and
    prunes every build none of the three links names.
  - C(state=info) changes nothing. Every state returns the links and the builds,
    and the recipes the stored builds were made from.
  - Supports check mode.
options:
  path:
    description: The store directory.
    type: path
    required: true
  state:
    description: What to do.
    type: str
    choices: [info, present, candidate, promoted]
    default: info
  src:
    description: A finished build directory to add (C(state=present)); it is moved, not copied.
    type: path
  build_id:
    description: The build to make the candidate or to promote.
    type: str
author: vcafleet
"""
EXAMPLES = r"""
- name: Publish the new build as the candidate
  vca_image_store:
    path: /var/lib/vcafleet/images
    state: present
    src: /var/lib/vcafleet/images/.incoming
"""
RETURN = r"""
candidate:
  description: The candidate build_id afterwards (or that would be, in check mode).
  returned: always
  type: str
good:
  description: The good build_id afterwards.
  returned: always
  type: str
previous:
  description: The previous good build_id afterwards.
  returned: always
  type: str
builds:
  description: Every build_id in the store.
  returned: always
  type: list
  elements: str
images:
  description: build_id -> path of its disk image.
  returned: always
  type: dict
recipes:
  description: recipe digest -> build_id of the stored builds.
  returned: always
  type: dict
pruned:
  description: Builds removed by a promotion.
  returned: when state=promoted
  type: list
  elements: str
"""
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_node_image import ImageStore, NodeImageError


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="info", choices=["info", "present", "candidate", "promoted"]),
            src=dict(type="path"),
            build_id=dict(type="str"),
        ),
        required_if=[("state", "present", ["src"]), ("state", "candidate", ["build_id"]),
                     ("state", "promoted", ["build_id"])],
        supports_check_mode=True,
    )
    p = module.params
    store = ImageStore(p["path"])
    changed, extra = False, {}
    try:
        if p["state"] == "present":
            bid = store.add(p["src"], check=module.check_mode)
            changed = True
            extra["build_id"] = bid
        elif p["state"] == "candidate":
            changed = store.select(p["build_id"], check=module.check_mode)
        elif p["state"] == "promoted":
            changed, extra["pruned"] = store.promote(p["build_id"], check=module.check_mode)
        info = store.info()
    except (NodeImageError, OSError, ValueError) as exc:
        module.fail_json(msg="image store %s: %s" % (p["path"], exc))
    if module.check_mode and p["state"] in ("candidate", "promoted"):
        info["candidate"] = p["build_id"]
    module.exit_json(changed=changed, **info, **extra)


if __name__ == "__main__":
    main()
