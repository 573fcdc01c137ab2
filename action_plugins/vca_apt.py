# SPDX-License-Identifier: MIT
"""Controller side of vca_apt: ansible.builtin.apt, asked only when dpkg says a package is missing.

The apt module opens the package cache (and may refresh it) even when every package is there:
a second or more per machine and task on a small controller, the largest part of a no-change
run after the broker (issue 30). One dpkg-query answers "is everything installed" in
milliseconds; when it says no, or the task asks for anything but plain names present, apt runs
with the task's arguments unchanged, in check mode too."""

from __future__ import annotations

import re
import shlex

from ansible.plugins.action import ActionBase

PLAIN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")   # no version pin, arch, wildcard or .deb
PASS_THROUGH = {"deb", "upgrade", "autoremove", "autoclean", "clean", "purge", "force", "allow_downgrade",
                "only_upgrade", "default_release"}


def names_of(args):
    """The task's package names as a list, or None when it asks for more than plain names present."""
    if args.get("state", "present") != "present" or PASS_THROUGH & {k for k, v in args.items() if v}:
        return None
    names = args.get("name", args.get("pkg"))
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",")]
    if not names or not all(isinstance(n, str) and PLAIN_NAME.match(n) for n in names):
        return None
    return names


def installed(dpkg_output):
    """The packages installed for the machine's own architecture (or for all), from the output of
    `dpkg --print-architecture; dpkg-query -W -f '${Package} ${Architecture} ${db:Status-Status}\\n'`
    (a library installed only for another architecture is not the one apt would install)."""
    native, *lines = dpkg_output.splitlines() or [""]
    return {fields[0] for fields in map(str.split, lines)
            if fields[2:] == ["installed"] and fields[1] in (native.strip(), "all")}


class ActionModule(ActionBase):
    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        names = names_of(self._task.args)
        if names is not None:
            query = self._low_level_execute_command(
                "dpkg --print-architecture && dpkg-query -W -f '${Package} ${Architecture} ${db:Status-Status}\\n' -- "
                + " ".join(shlex.quote(n) for n in names))
            if query["rc"] == 0 and set(names) <= installed(query["stdout"]):
                result.update(changed=False, msg="installed already (dpkg-query): " + ", ".join(names))
                return result
        result.update(self._execute_module("ansible.builtin.apt", module_args=self._task.args, task_vars=task_vars))
        return result
