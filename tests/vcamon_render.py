"""roles/vcamon's and roles/prometheus' files as the real ansible-playbook renders them for an inventory,
contacting nothing: each role's own defaults, vars and templates (linked into a role of this helper's,
so the inventory's variables take precedence over the defaults as in a real run), and the exposure
table as vca_exposure evaluates it.

    python tests/vcamon_render.py ROOT INVENTORY OUT   # e.g. a copy of main's tree, to compare renders

writes OUT/<machine>/vcamon-agent.service on every machine of vca_host:vca_nodes:!dead, and on the
monitor host targets.json, fleet.json, vcamon-collector.service, agents.json (vcamon_target_agents),
exposure.json (vcamon's rows of the table) and prometheus.yml.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

VCAMON_TASKS = """
- ansible.builtin.file: {path: "%(out)s/{{ inventory_hostname }}", state: directory, mode: "0755"}
- ansible.builtin.template:
    src: etc/systemd/system/vcamon-agent.service.j2
    dest: "%(out)s/{{ inventory_hostname }}/vcamon-agent.service"
    mode: "0644"
- when: inventory_hostname == vcamon_collector_host
  block:
    - {vca_exposure: {}, register: vcamon_exposure}
    - ansible.builtin.template: {src: etc/vcamon/targets.json.j2, dest: "%(out)s/{{ inventory_hostname }}/targets.json",
                                 mode: "0644"}
    - ansible.builtin.template: {src: etc/vcamon/fleet.json.j2, dest: "%(out)s/{{ inventory_hostname }}/fleet.json",
                                 mode: "0644"}
    - ansible.builtin.template:
        src: etc/systemd/system/vcamon-collector.service.j2
        dest: "%(out)s/{{ inventory_hostname }}/vcamon-collector.service"
        mode: "0644"
    - ansible.builtin.copy:
        content: "{{ vcamon_exposure.sockets | selectattr('role', 'eq', 'vcamon') | list | to_nice_json }}"
        dest: "%(out)s/{{ inventory_hostname }}/exposure.json"
        mode: "0644"
"""
AGENTS_TASK = """
    - ansible.builtin.copy:
        content: "{{ vcamon_target_agents | to_nice_json }}"
        dest: "%(out)s/{{ inventory_hostname }}/agents.json"
        mode: "0644"
"""
PROMETHEUS_TASKS = """
- when: inventory_hostname == prometheus_host
  block:
    - {vca_exposure: {}, register: prometheus_exposure, when: vcamon_exposure is not defined}
    - {ansible.builtin.set_fact: {prometheus_exposure: "{{ vcamon_exposure }}"}, when: vcamon_exposure is defined}
    - ansible.builtin.template: {src: prometheus.yml.j2, dest: "%(out)s/{{ inventory_hostname }}/prometheus.yml",
                                 mode: "0644"}
"""
PLAY = """
- hosts: vca_host:vca_nodes:!dead
  gather_facts: false
  roles: [{role: "%(roles)s/vcamon_render"}, {role: "%(roles)s/prometheus_render"}]
"""


def _role(roles: Path, name: str, source: Path, tasks: str) -> None:
    role = roles / name
    (role / "tasks").mkdir(parents=True)
    for part in ("defaults", "vars", "templates"):
        (role / part).symlink_to(source / part)
    (role / "tasks" / "main.yml").write_text(tasks)


def render(root: Path, inventory: Path, out: Path, work: Path) -> subprocess.CompletedProcess:
    """Render into out (work: a scratch directory); the ansible-playbook run, whatever its result."""
    root, out, roles = Path(root).resolve(), Path(out).resolve(), Path(work).resolve() / "roles"
    out.mkdir(parents=True, exist_ok=True)
    vcamon_tasks = VCAMON_TASKS
    if "vcamon_target_agents" in (root / "roles/vcamon/vars/main.yml").read_text():
        vcamon_tasks += AGENTS_TASK
    _role(roles, "vcamon_render", root / "roles/vcamon", vcamon_tasks % {"out": out})
    _role(roles, "prometheus_render", root / "roles/prometheus", PROMETHEUS_TASKS % {"out": out})
    play = Path(work) / "render.yml"
    play.write_text(PLAY % {"roles": roles})
    env = dict(os.environ, ANSIBLE_CONFIG=str(root / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STRATEGY="linear")
    extra = json.dumps({"ansible_connection": "local", "ansible_python_interpreter": sys.executable})
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "-e", extra,
                           str(play)], capture_output=True, text=True, env=env, cwd=root, timeout=300, check=False)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        run = render(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(scratch))
    print(run.stdout[-3000:], run.stderr[-3000:])
    sys.exit(run.returncode)
