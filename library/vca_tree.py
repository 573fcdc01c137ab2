#!/usr/bin/python
# SPDX-License-Identifier: MIT
DOCUMENTATION = r"""
module: vca_tree
short_description: Put a directory of the controller on the target as one tar, only when it changed
description:
  - The action plugin packs O(src) into one reproducible tar (symbolic links followed, names sorted,
    times and owners zeroed, files 0644 or 0755 as their execute bit says) and compares its sha256
    with the one recorded in O(dest). Only when they differ does the tar travel: it is unpacked
    beside O(dest), which is then swapped for it by two renames (O(dest) is absent only between them).
  - So an unchanged tree costs one module call however many files it holds, where a copy task
    compares every file.
  - O(dest) belongs to the tree: anything else in it is removed when the tree changes.
  - Check mode reports the change and transfers nothing.
options:
  src:
    description: Directory on the controller (a role's files/ is searched for a relative path).
    type: path
    required: true
  dest:
    description: Directory on the target that holds the tree and its digest (C(.vcafleet-tree.sha256)).
    type: path
    required: true
  exclude:
    description: Regular expressions; a file or directory whose path relative to O(src) matches one is left out.
    type: list
    elements: str
    default: []
author: vcafleet
"""

EXAMPLES = r"""
- name: The vcamon package source
  vca_tree:
    src: "{{ role_path }}/../../apps/vcamon"
    dest: /opt/vcamon/src
    exclude: ['(^|/)(tests|__pycache__)(/|$)']
  register: vcamon_src
"""

RETURN = r"""
digest:
  description: sha256 of the tree's tar; C(.vcafleet-tree.sha256) in O(dest) holds it once written.
  returned: always
  type: str
previous:
  description: The digest O(dest) held before, or null.
  returned: always
  type: str
"""

import os
import shutil
import tarfile

from ansible.module_utils.basic import AnsibleModule

MARKER = ".vcafleet-tree.sha256"


def held_digest(dest):
    try:
        with open(os.path.join(dest, MARKER)) as fh:
            return fh.read().strip()
    except OSError:
        return None


def safe_members(tar, into):
    """Regular files and directories that stay inside into; anything else is refused."""
    root = os.path.realpath(into)
    for member in tar.getmembers():
        target = os.path.realpath(os.path.join(into, member.name))
        if not (member.isfile() or member.isdir()) or not (target == root or target.startswith(root + os.sep)):
            raise ValueError("refusing tar member %r" % member.name)
        yield member


def replace_tree(dest, archive, digest):
    new, old = dest + ".vcafleet-new", dest + ".vcafleet-old"
    for leftover in (new, old):
        shutil.rmtree(leftover, ignore_errors=True)
    os.makedirs(new, 0o755)
    with tarfile.open(archive) as tar:
        for member in safe_members(tar, new):
            tar.extract(member, new, set_attrs=False)
            path = os.path.join(new, member.name)
            os.chmod(path, 0o755 if member.isdir() else member.mode & 0o755)
    with open(os.path.join(new, MARKER), "w") as fh:
        fh.write(digest + "\n")
    if os.path.lexists(dest):
        os.rename(dest, old)
    os.rename(new, dest)
    shutil.rmtree(old, ignore_errors=True)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dest=dict(type="path", required=True),
            digest=dict(type="str", required=True),
            archive=dict(type="path"),   # set by the action plugin once it has sent the tar
        ),
        supports_check_mode=True,
    )
    dest, digest, archive = module.params["dest"].rstrip("/"), module.params["digest"], module.params["archive"]
    previous = held_digest(dest)
    if previous == digest:
        module.exit_json(changed=False, digest=digest, previous=previous)
    if archive is None or module.check_mode:
        module.exit_json(changed=True, digest=digest, previous=previous)
    parent = os.path.dirname(dest)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, 0o755)
    try:
        replace_tree(dest, archive, digest)
    except (OSError, ValueError, tarfile.TarError) as exc:
        module.fail_json(msg="%s: could not put the tree in place: %s" % (dest, exc), digest=digest, previous=previous)
    module.exit_json(changed=True, digest=digest, previous=previous)


if __name__ == "__main__":
    main()
