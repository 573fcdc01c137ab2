#!/usr/bin/python
# SPDX-License-Identifier: MIT
DOCUMENTATION = r"""
---
module: vca_node_disk
short_description: A VCA node's own disk image (its vcablk0), written from a stored build plus a per-node overlay
description:
  - >-
    C(vcactl blockio open) opens a node's disk read-write, so every node has its
    own copy. C(state=present) makes O(path) a copy of O(image) with O(files)
    written into the root file system (partition 2) by debugfs: no loop device,
    no mount. The copy is made beside it (C(<node>.img.new)) and renamed over
    O(path); the disk it replaces is renamed to C(<node>.prev.img) (with its
    record, C(<node>.prev.json)) and kept until the next change, so a node that
    fails its verifier can be rolled back.
  - >-
    Nothing is copied when the disk already holds O(build_id) with the same files.
  - >-
    C(state=rolled_back) renames the kept disk back over O(path); it fails when there is none.
  - >-
    The module only writes files on the host. It does not talk to C(vcactl) or
    to the node, so it does not power the node off, close its vcablk0, or boot
    it, and it cannot tell whether the node is running. The caller must have the
    node off and its vcablk0 closed before a run that changes the disk (either
    state), and must boot the node afterwards through a fresh C(vcactl blockio
    open): a vcablk0 left open may go on reading the replaced file.
    C(roles/node_image/tasks/rollout.yml) does this with vca_boot's script,
    C(vca2-boot.sh shutdown <node>) before the write and C(vca2-boot.sh boot
    <node>) after it, and the same around a rollback.
  - >-
    Supports check mode, in which it writes nothing and C(changed) says whether
    the disk would change (the rollout asks it this before it shuts a node down).
options:
  path:
    description: The node's disk, C(<dir>/<node>.img).
    type: path
    required: true
  state:
    description: What to do.
    type: str
    choices: [present, rolled_back]
    default: present
  image:
    description: The stored build's disk image to copy (state=present).
    type: path
  build_id:
    description: The build_id of O(image), recorded beside the disk.
    type: str
  files:
    description: Absolute path -> text, written into the node's root file system (the per-node overlay).
    type: dict
    default: {}
author: vcafleet
"""
EXAMPLES = r"""
- name: Node 0's disk from the candidate, with its hostname
  vca_node_disk:
    path: /var/lib/vcafleet/nodes/vca-node0.img
    image: /var/lib/vcafleet/images/3f2a9c1b7e6d5a40/ubuntu-22.04.img
    build_id: 3f2a9c1b7e6d5a40
    files:
      /etc/hostname: "vca-node0\n"
"""
RETURN = r"""
build_id:
  description: The build the disk holds afterwards (or would, in check mode).
  returned: always
  type: str
previous_build_id:
  description: The build of the disk kept for rollback (or that would be kept, in check mode), if any.
  returned: always
  type: str
rolled_back_from:
  description: The build the disk held before it was rolled back.
  returned: state=rolled_back
  type: str
"""
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_node_image import NodeDisk, NodeImageError


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "rolled_back"]),
            image=dict(type="path"),
            build_id=dict(type="str"),
            files=dict(type="dict", default={}),
        ),
        required_if=[("state", "present", ["image", "build_id"])],
        supports_check_mode=True,
    )
    p = module.params
    try:
        disk = NodeDisk(p["path"])
        if p["state"] == "present":
            files = {k: str(v) for k, v in p["files"].items()}
            before = disk.record()
            changed = disk.ensure(p["image"], p["build_id"], files, check=module.check_mode)
            prev = (before if changed and before else disk.previous()) or {}
            module.exit_json(changed=changed, build_id=p["build_id"], previous_build_id=prev.get("build_id"))
        current = (disk.record() or {}).get("build_id")
        restored = disk.rollback(check=module.check_mode)
        if restored is None:
            module.fail_json(msg="%s: no previous disk to roll back to (it holds %s)" % (p["path"], current))
        module.exit_json(changed=True, build_id=restored.get("build_id"), previous_build_id=None,
                         rolled_back_from=current)
    except (NodeImageError, OSError, ValueError) as exc:
        module.fail_json(msg="node disk %s: %s" % (p["path"], exc))


if __name__ == "__main__":
    main()
