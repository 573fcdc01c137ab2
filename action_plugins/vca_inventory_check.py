# SPDX-License-Identifier: MIT
"""Controller side of vca_inventory_check: gathers every node's topology
variables and every VCA host's node subnet from hostvars, then runs the module
(which holds the logic)."""

from ansible.plugins.action import ActionBase

NODE_VARS = ("vca_host_name", "vca_node", "vca_card", "vca_cpu", "vca_node_ip")
HOST_VARS = ("vca_node_subnet",)


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        groups = dict((k, list(v)) for k, v in task_vars["groups"].items())
        hostvars = task_vars["hostvars"]
        args = dict(self._task.args)
        args.setdefault("nodes", self._pick(hostvars, groups.get("vca_nodes", []), NODE_VARS))
        args.setdefault("vca_hosts", self._pick(hostvars, groups.get("vca_host", []), HOST_VARS))
        args.setdefault("groups", groups)
        result.update(self._execute_module(module_name="vca_inventory_check", module_args=args, task_vars=task_vars))
        return result

    @staticmethod
    def _pick(hostvars, hosts, names):
        return dict((host, dict((var, hostvars[host][var] if var in hostvars[host] else None) for var in names))
                    for host in hosts)
