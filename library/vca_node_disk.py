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
    description:
      - >-
        The per-node overlay: absolute path -> entry, written into the node's root
        file system, replacing what is there. An entry is either the text of a file
        (written root:root 0644), or a mapping of C(content) (text) or C(src) (an
        absolute path on the machine that runs this module, the host: its bytes are
        read there, so a private key never travels), C(mode) (an octal string,
        quoted: V("0600"); default V("0644") for a file, V("0755") for a directory),
        C(owner) and C(group) (a name, looked up in the disk's own C(/etc/passwd)
        and C(/etc/group), not the host's, or a number; default 0), and C(state)
        (V(file), the default, or V(directory), which takes no content or src).
      - >-
        Directories the writer must make on the way are root 0755; one that is
        already there keeps its owner and mode unless an entry names it. Entries
        are written parents first, and each is read back (content, mode, owner):
        a difference fails, naming the path. An unknown key, both or neither of
        content and src for a file, a bad mode or an unknown owner fails before
        anything is written.
      - >-
        The digest recorded beside the disk covers what each src holds and every
        mode and owner, so a changed key file or mode rewrites the disk.
      - >-
        Not logged (C(no_log)): entries can carry private keys. Messages still name
        the paths, modes and owners; only contents are masked.
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

- name: Node 0's disk, with its own SSH host key and the fleet's key for vcaadmin
  vca_node_disk:
    path: /var/lib/vcafleet/nodes/vca-node0.img
    image: /var/lib/vcafleet/images/3f2a9c1b7e6d5a40/ubuntu-22.04.img
    build_id: 3f2a9c1b7e6d5a40
    files:
      /etc/hostname: "vca-node0\n"
      # read on the host; the private key is not a module argument
      /etc/ssh/ssh_host_ed25519_key: {src: /var/lib/vcafleet/host-keys/vca-node0/ssh_host_ed25519_key, mode: "0600"}
      /etc/ssh/ssh_host_ed25519_key.pub:
        src: /var/lib/vcafleet/host-keys/vca-node0/ssh_host_ed25519_key.pub
      /home/vcaadmin/.ssh: {state: directory, mode: "0700", owner: vcaadmin, group: vcaadmin}
      /home/vcaadmin/.ssh/authorized_keys:
        content: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFleetKeyExampleOnly fleet@vca-host\n"
        mode: "0600"
        owner: vcaadmin
        group: vcaadmin
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
host_public_key:
  description:
    - The SSH host key (type and key) in the disk's root file system afterwards, or empty when it holds none.
    - After a rollback it is the key the node answers with once booted, which may be an older one than the store's.
  returned: always
  type: str
rolled_back_from:
  description: The build the disk held before it was rolled back.
  returned: state=rolled_back
  type: str
"""
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_node_image import NodeDisk, NodeImageError


def not_secret(files, names):
    """The values of files that output need not mask: all but the contents. no_log masks every
    value in files wherever it shows, and among them are the owner vcaadmin of /home/vcaadmin/.ssh
    and the mode 0600, which would cut the paths out of every message. A content found in a path
    or name that is printed anyway is no secret either."""
    shown = list(files) + names
    leaves, contents = set(), set()
    for entry in files.values():
        content = entry
        if isinstance(entry, dict):
            leaves |= {str(v) for v in entry.values() if v is not None and not isinstance(v, bool)}
            content = entry.get("content")
        if isinstance(content, str) and content and not any(content in s for s in shown):
            contents.add(content)
    return leaves - contents


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            state=dict(type="str", default="present", choices=["present", "rolled_back"]),
            image=dict(type="path"),
            build_id=dict(type="str"),
            files=dict(type="dict", default={}, no_log=True),
        ),
        required_if=[("state", "present", ["image", "build_id"])],
        supports_check_mode=True,
    )
    p = module.params
    files = {k: v if isinstance(v, dict) else str(v) for k, v in p["files"].items()}
    module.no_log_values -= not_secret(files, [p["path"], p["image"] or ""])
    try:
        disk = NodeDisk(p["path"])
        if p["state"] == "present":
            before = disk.record()
            changed = disk.ensure(p["image"], p["build_id"], files, check=module.check_mode)
            prev = (before if changed and before else disk.previous()) or {}
            module.exit_json(changed=changed, build_id=p["build_id"], previous_build_id=prev.get("build_id"),
                             host_public_key="" if module.check_mode else disk.host_public_key())
        current = (disk.record() or {}).get("build_id")
        restored = disk.rollback(check=module.check_mode)
        if restored is None:
            module.fail_json(msg="%s: no previous disk to roll back to (it holds %s)" % (p["path"], current))
        module.exit_json(changed=True, build_id=restored.get("build_id"), previous_build_id=None,
                         rolled_back_from=current, host_public_key="" if module.check_mode else disk.host_public_key())
    except (NodeImageError, OSError, ValueError) as exc:
        module.fail_json(msg="node disk %s: %s" % (p["path"], exc))


if __name__ == "__main__":
    main()
