"""Shared fixtures: the project's module_utils importable as ansible.module_utils.*,
library modules loadable by name, a module runner, and a simulated sysfs tree."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import ansible.module_utils
import pytest
import yaml
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lab" / "sim"))
sys.path.insert(0, str(ROOT / "image_builder" / "src"))
ansible.module_utils.__path__.append(str(ROOT / "module_utils"))

from vcasim.model import load_params  # noqa: E402  (needs the path above)
from vcasim.tree import SysfsTree  # noqa: E402


def load_library(name: str):
    spec = importlib.util.spec_from_file_location(f"vcafleet_library_{name}", ROOT / "library" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ansible_playbook(workdir: Path, inventory: dict, playbook: str) -> subprocess.CompletedProcess:
    """The real ansible-playbook (the project's ansible.cfg, linear) on playbook (YAML text) with inventory,
    both written into workdir; the run is returned, failed or not."""
    (workdir / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (workdir / "play.yml").write_text(playbook)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1", ANSIBLE_STRATEGY="linear")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(workdir / "hosts.yml"),
                           str(workdir / "play.yml")], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300, check=False)


def role_play(hosts: str, role: str, *tasks: dict) -> dict:
    """A play on hosts with role's defaults and vars loaded, as the role sees them, then tasks."""
    loads = [{"ansible.builtin.include_vars": {"file": str(ROOT / "roles" / role / part / "main.yml")}}
             for part in ("defaults", "vars")]
    return {"hosts": hosts, "gather_facts": False, "tasks": loads + list(tasks)}


def role_template(role: str, src: str, dest: str) -> dict:
    """A task rendering one of role's templates to dest (on the controller: the test's connection is local)."""
    return {"ansible.builtin.template": {"src": str(ROOT / "roles" / role / "templates" / src), "dest": dest,
                                         "mode": "0644"}}


def run_module(name: str, args: dict, capsys) -> dict:
    """Run library/<name>.py's main() with args; return its JSON result (failed or not)."""
    module = load_library(name)
    with patch_module_args(args), pytest.raises(SystemExit):
        module.main()
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def sim_params():
    return load_params()


@pytest.fixture
def sim_tree(tmp_path, sim_params):
    """A fresh simulated node tree under tmp_path/sys, as lab/sim creates it."""
    tree = SysfsTree(tmp_path / "sys", sim_params["node"])
    tree.create()
    return tree
