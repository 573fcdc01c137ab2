# SPDX-License-Identifier: MIT
"""Controller side of vca_exposure: every role's declared sockets (roles/<role>/meta/exposure.yml),
evaluated for each machine they live on, with that machine's variables over the role's defaults; the
inventory's own rows (vca_exposure_extra) after them. Nothing is contacted: it reads the inventory."""

from __future__ import annotations

import ipaddress
import os

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

REQUIRED = ("service", "machines", "proto", "address", "port", "clients", "auth")
OPTIONAL = ("reason", "probe", "metrics")
METRICS_KEYS = {"job", "path", "credential_file", "credential_json_key", "credential_map_key"}
WORDS = ("lan", "loopback")
PROTOS = ("tcp", "udp")


def _roles_dirs(given):
    dirs = given or C.DEFAULT_ROLES_PATH
    return [os.path.expanduser(d) for d in dirs if os.path.isdir(os.path.expanduser(d))]


class ActionModule(ActionBase):
    _supports_check_mode = True
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        unknown = sorted(set(args) - {"roles_path", "extra_var"})
        if unknown:
            raise AnsibleActionFail("vca_exposure: unknown option %s" % ", ".join(unknown))
        self._vars = task_vars
        self._hostvars = task_vars["hostvars"]
        self._groups = {k: list(v) for k, v in task_vars["groups"].items()}
        rows = []
        for roles_dir in _roles_dirs(args.get("roles_path")):
            for role in sorted(os.listdir(roles_dir)):
                path = os.path.join(roles_dir, role, "meta", "exposure.yml")
                if not os.path.isfile(path):
                    continue
                declared = self._load(path) or {}
                defaults, role_vars = (self._load_if(os.path.join(roles_dir, role, d, "main.yml"))
                                       for d in ("defaults", "vars"))
                rows += self._evaluate(role, path, declared.get("sockets") or [], defaults, role_vars)
        extra_var = args.get("extra_var", "vca_exposure_extra")
        me = task_vars.get("inventory_hostname")
        extra = self._hostvars.raw_get(me).get(extra_var, []) if me in self._hostvars else []
        rows += self._evaluate("inventory", "the inventory's %s" % extra_var, extra, {}, {})
        rows.sort(key=lambda r: (r["machine"], r["proto"], str(r["port"]).zfill(5), r["address"], r["service"]))
        result.update(changed=False, sockets=rows)
        return result

    def _load(self, path):
        return self._loader.load_from_file(path, trusted_as_template=True)

    def _load_if(self, path):
        return (self._load(path) or {}) if os.path.isfile(path) else {}

    def _template(self, value, variables, where):
        templar = self._templar.copy_with_new_env(available_variables=variables)
        try:
            return templar.template(value)
        except Exception as e:
            raise AnsibleActionFail("vca_exposure: %s: %s" % (where, e)) from e

    def _machine_vars(self, defaults, role_vars, machine):
        """As Ansible orders them for a role's task on that machine: the role's defaults, the
        inventory and play, the role's vars; then the machine's own magic variables."""
        mv = dict(defaults)
        mv.update(self._vars)
        mv.update(self._hostvars.raw_get(machine))
        mv.update(role_vars)
        mv.update(inventory_hostname=machine, inventory_hostname_short=machine.split(".")[0],
                  group_names=sorted(g for g, hosts in self._groups.items() if machine in hosts and g != "all"),
                  hostvars=self._hostvars, groups=self._groups)
        return mv

    def _evaluate(self, role, where, declared, defaults, role_vars):
        if not isinstance(declared, list):
            raise AnsibleActionFail("vca_exposure: %s: sockets must be a list" % where)
        rows = []
        base = dict(defaults)
        base.update(self._vars)
        base.update(role_vars)
        for i, decl in enumerate(declared):
            here = "%s, socket %d (%s)" % (where, i + 1, decl.get("service", "?") if isinstance(decl, dict) else "?")
            if not isinstance(decl, dict):
                raise AnsibleActionFail("vca_exposure: %s: a socket is a mapping" % here)
            missing = [k for k in REQUIRED if k not in decl]
            extra = sorted(set(decl) - set(REQUIRED) - set(OPTIONAL))
            if missing or extra:
                raise AnsibleActionFail("vca_exposure: %s: %s" % (here, "; ".join(
                    (["missing " + ", ".join(missing)] if missing else [])
                    + (["unknown " + ", ".join(extra)] if extra else []))))
            machines = self._template(decl["machines"], base, here)
            if isinstance(machines, str):
                machines = [machines]
            for machine in machines:
                if machine not in self._hostvars:
                    raise AnsibleActionFail("vca_exposure: %s: machine %r is not in the inventory" % (here, machine))
                mv = self._machine_vars(defaults, role_vars, machine)
                row = {k: self._template(decl[k], mv, "%s on %s" % (here, machine))
                       for k in REQUIRED + OPTIONAL if k in decl and k != "machines"}
                # an address or a port may be a list: one row each
                addresses = row["address"] if isinstance(row["address"], list) else [row["address"]]
                ports = row["port"] if isinstance(row["port"], list) else [row["port"]]
                for address in addresses:
                    for port in ports:
                        rows.append(self._check(dict(row, address=str(address), port=port, machine=machine,
                                                     role=role), "%s on %s" % (here, machine)))
        return rows

    def _check(self, row, here):
        problems = []
        if row["proto"] not in PROTOS:
            problems.append("proto must be tcp or udp, not %r" % row["proto"])
        port = row["port"]
        if port != "any":
            try:
                port = int(port)
            except (TypeError, ValueError):
                port = 0
            if not 0 < port < 65536:
                problems.append("port must be 1..65535 or 'any', not %r" % row["port"])
            row["port"] = port
        if row["address"] != "*":
            try:
                row["address"] = str(ipaddress.ip_address(row["address"]))
            except ValueError:
                pass    # a name: resolved where the service runs (the audit resolves it there)
        clients = row["clients"]
        if isinstance(clients, str):
            clients = [clients]
        bad = [c for c in clients if c not in WORDS and c not in self._hostvars]
        if bad:
            problems.append("clients %s are neither inventory hosts nor %s" % (bad, " / ".join(WORDS)))
        row["clients"] = sorted(set(clients))
        if problems:
            raise AnsibleActionFail("vca_exposure: %s: %s" % (here, "; ".join(problems)))
        metrics = row.setdefault("metrics", {})
        if metrics:
            if not isinstance(metrics, dict) or not metrics.get("job") or set(metrics) - METRICS_KEYS:
                raise AnsibleActionFail("vca_exposure: %s: metrics is {job, path?, credential_file?, "
                                        "credential_json_key? or credential_map_key?}, not %r" % (here, metrics))
            metrics.setdefault("path", "/metrics")
        row.setdefault("reason", "")
        row.setdefault("probe", {})
        return row
