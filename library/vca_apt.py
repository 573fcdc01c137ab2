#!/usr/bin/python
# SPDX-License-Identifier: MIT
# The work is done by action_plugins/vca_apt.py; this file documents it.

DOCUMENTATION = r"""
---
module: vca_apt
short_description: ansible.builtin.apt, with one dpkg-query first when nothing may need installing
description:
  - Takes ansible.builtin.apt's arguments. When the task asks only that plain package names be
    present and C(dpkg-query) lists every one of them as installed, it returns unchanged without
    running apt (no cache opened, no cache refresh).
  - Anything else (a missing package, a version pin, an architecture, C(state) other than present,
    C(deb), C(upgrade), ...) runs ansible.builtin.apt with the arguments as given, check mode
    included.
extends_documentation_fragment: []
options:
  name:
    description: The packages, as for ansible.builtin.apt.
    type: list
    elements: str
author: vcafleet
"""

EXAMPLES = r"""
- name: Base packages
  vca_apt:
    name: [curl, rsync]
    state: present
    cache_valid_time: 3600
"""
