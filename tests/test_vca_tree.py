"""vca_tree: the controller's tree on the target as one tar, moved only when it changed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from ansible.errors import AnsibleActionFail

from conftest import ROOT

sys.path.insert(0, str(ROOT / "action_plugins"))
from vca_tree import pack


def make_tree(root):
    (root / "pkg/sub").mkdir(parents=True)
    (root / "pkg/a.py").write_text("a = 1\n")
    (root / "pkg/sub/run.sh").write_text("#!/bin/sh\n")
    (root / "pkg/sub/run.sh").chmod(0o755)
    (root / "pkg/tests").mkdir()
    (root / "pkg/tests/test_a.py").write_text("")
    (root / "shared.py").write_text("shared = True\n")
    os.symlink("../shared.py", root / "pkg/shared.py")       # a link is shipped as the file it points at
    return root / "pkg"


def playbook(tmp_path, src, dest, *extra):
    book = tmp_path / "ship.yml"
    book.write_text(yaml.safe_dump([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "Ship", "vca_tree": {"src": str(src), "dest": str(dest), "exclude": ["(^|/)tests(/|$)"]},
                   "register": "shipped"}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_STDOUT_CALLBACK="json")
    run = subprocess.run([str(ROOT / ".venv/bin/ansible-playbook"), "-i", "localhost,", "-c", "local",
                          "-e", "ansible_python_interpreter={{ ansible_playbook_python }}", str(book), *extra],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    # the report, then ansible.cfg's profile_tasks summary after it
    report, _ = json.JSONDecoder().raw_decode(run.stdout[run.stdout.index("{"):])
    tasks = report["plays"][0]["tasks"]
    return tasks[0]["hosts"]["localhost"]


def test_pack_is_reproducible_follows_links_and_excludes(tmp_path):
    src = make_tree(tmp_path)
    data, digest = pack(str(src), ["(^|/)tests(/|$)"])
    assert (data, digest) == pack(str(src), ["(^|/)tests(/|$)"])
    (src / "a.py").touch()                                    # a new mtime alone changes nothing
    assert pack(str(src), ["(^|/)tests(/|$)"])[1] == digest
    (src / "a.py").write_text("a = 2\n")
    assert pack(str(src), ["(^|/)tests(/|$)"])[1] != digest


def test_ships_once_then_changes_nothing(tmp_path):
    src, dest = make_tree(tmp_path), tmp_path / "target/pkg"
    first = playbook(tmp_path, src, dest)
    assert first["changed"] is True and first["previous"] is None
    assert (dest / "a.py").read_text() == "a = 1\n"
    assert (dest / "shared.py").read_text() == "shared = True\n" and not (dest / "shared.py").is_symlink()
    assert oct((dest / "sub/run.sh").stat().st_mode & 0o777) == "0o755"
    assert oct((dest / "a.py").stat().st_mode & 0o777) == "0o644"
    assert not (dest / "tests").exists()
    assert (dest / ".vcafleet-tree.sha256").read_text().strip() == first["digest"]
    assert playbook(tmp_path, src, dest)["changed"] is False


def test_check_mode_reports_and_moves_nothing_then_a_change_replaces_the_tree(tmp_path):
    src, dest = make_tree(tmp_path), tmp_path / "target/pkg"
    first = playbook(tmp_path, src, dest)
    (src / "a.py").write_text("a = 2\n")
    (src / "sub/run.sh").unlink()
    checked = playbook(tmp_path, src, dest, "--check")
    assert checked["changed"] is True and checked["previous"] == first["digest"]
    assert (dest / "a.py").read_text() == "a = 1\n" and (dest / "sub/run.sh").exists()
    again = playbook(tmp_path, src, dest)
    assert again["changed"] is True and (dest / "a.py").read_text() == "a = 2\n"
    assert not (dest / "sub/run.sh").exists()                 # the target holds the tree, nothing else
    assert not list(dest.parent.glob("*.vcafleet-*"))


def test_a_link_back_up_the_tree_is_refused_not_walked_for_ever(tmp_path):
    src = make_tree(tmp_path)
    os.symlink("..", src / "sub/up")
    with pytest.raises(AnsibleActionFail, match="links back into"):
        pack(str(src), [])
