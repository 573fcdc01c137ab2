# SPDX-License-Identifier: MIT
"""Controller side of vca_inventory_check: gathers every node's topology
variables from hostvars, then runs the module (which holds the logic)."""

from ansible.plugins.action import ActionBase

NODE_VARS = ("vca_node", "vca_card", "vca_cpu", "vca_node_ip")


class ActionModule(ActionBase):
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        groups = dict((k, list(v)) for k, v in task_vars["groups"].items())
        hostvars = task_vars["hostvars"]
        nodes = {}
        for host in groups.get("vca_nodes", []):
            hv = hostvars[host]
            nodes[host] = dict((var, hv[var] if var in hv else None) for var in NODE_VARS)
        args = dict(self._task.args)
        args.setdefault("nodes", nodes)
        args.setdefault("groups", groups)
        result.update(self._execute_module(module_name="vca_inventory_check", module_args=args, task_vars=task_vars))
        return result
