#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_rabbitmq_users
short_description: Exactly these RabbitMQ users, each with its password and rights on one vhost
description:
  - Reads the broker once (C(rabbitmqctl export_definitions)) and checks each password against
    its stored hash, so a run with nothing to change costs one CLI start, not several per user.
  - Creates the vhost, puts each user that is missing or differs (password, tags, rights) with one
    C(import_definitions) of hashes (no password on a command line), clears a managed user's
    rights on any other vhost, and deletes users whose name starts with O(managed_prefix) but are
    not wanted, and those in O(absent).
  - Supports check mode.
options:
  node:
    description: The broker's Erlang node name.
    type: str
    default: rabbit@localhost
  vhost:
    description: The one vhost the users have rights on.
    type: str
    required: true
  users:
    description: The users; each one's password is checked against the broker's hash, never logged.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The user's name.
        type: str
        required: true
      password:
        description: Its password.
        type: str
        required: true
      configure:
        description: Its configure right on O(vhost) (a regular expression).
        type: str
        required: true
      write:
        description: Its write right on O(vhost).
        type: str
        required: true
      read:
        description: Its read right on O(vhost).
        type: str
        required: true
      tags:
        description: Its tags.
        type: list
        elements: str
        default: []
  managed_prefix:
    description: A broker user whose name starts with this and is not in O(users) or O(keep) is deleted ("" for none).
    type: str
    default: ""
  keep:
    description: Users never deleted (a live node whose rights could not be read in a check run).
    type: list
    elements: str
    default: []
  absent:
    description: Users that must not exist (C(guest)).
    type: list
    elements: str
    default: []
author: vcafleet
"""

EXAMPLES = r"""
- name: The farm's users
  vca_rabbitmq_users:
    vhost: farm
    users:
      - {name: farm, password: "{{ farm_rabbitmq_password }}", configure: ".*", write: ".*", read: ".*"}
    absent: [guest]
  no_log: true
"""

RETURN = r"""
put:
  description: The users created or brought back to their password, tags and rights.
  returned: success
  type: list
deleted:
  description: The users deleted.
  returned: success
  type: list
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_rabbitmq import import_document, plan


def main():
    module = AnsibleModule(
        argument_spec=dict(
            node=dict(type="str", default="rabbit@localhost"),
            vhost=dict(type="str", required=True),
            users=dict(type="list", elements="dict", required=True, options=dict(
                name=dict(type="str", required=True),
                password=dict(type="str", required=True, no_log=True),
                configure=dict(type="str", required=True),
                write=dict(type="str", required=True),
                read=dict(type="str", required=True),
                tags=dict(type="list", elements="str", default=[]),
            )),
            managed_prefix=dict(type="str", default=""),
            keep=dict(type="list", elements="str", default=[]),
            absent=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    p = module.params
    rabbitmqctl = module.get_bin_path("rabbitmqctl")
    if rabbitmqctl is None and module.check_mode:   # a first check run: the broker is not installed yet
        module.exit_json(changed=True, put=[u["name"] for u in p["users"]], deleted=[], cleared=[], vhost_created=True)
    if rabbitmqctl is None:
        module.fail_json(msg="vca_rabbitmq_users: no rabbitmqctl on this machine (is rabbitmq-server installed?)")
    ctl = [rabbitmqctl, "--node", p["node"]]

    rc, out, err = module.run_command([*ctl, "export_definitions", "-", "--format", "json", "--silent"])
    if rc != 0:
        module.fail_json(msg="rabbitmqctl export_definitions failed: %s" % (err or out).strip())
    todo = plan(json.loads(out), p["vhost"], p["users"], managed_prefix=p["managed_prefix"], absent=p["absent"],
                keep=p["keep"])
    changed = bool(todo["vhost"] or todo["put"] or todo["clear"] or todo["delete"])
    if changed and not module.check_mode:
        if todo["vhost"] or todo["put"]:   # on stdin: the CLI runs as the rabbitmq user, who reads no file of root's
            document = json.dumps(import_document(p["vhost"], p["users"], set(todo["put"])))
            module.run_command([*ctl, "import_definitions", "--format", "json", "--silent"], data=document,
                               check_rc=True)
        for vhost, name in todo["clear"]:
            module.run_command([*ctl, "clear_permissions", "-p", vhost, name, "--silent"], check_rc=True)
        for name in todo["delete"]:
            module.run_command([*ctl, "delete_user", name, "--silent"], check_rc=True)
    module.exit_json(changed=changed, put=todo["put"], deleted=todo["delete"], cleared=todo["clear"],
                     vhost_created=todo["vhost"])


if __name__ == "__main__":
    main()
