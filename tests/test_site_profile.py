"""bench/site_profile.py: one row per task whatever the strategy (under Mitogen's linear, which
ansible.cfg uses, the json callback records each host's run of a task apart)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("site_profile", ROOT / "bench/site_profile.py")
site_profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(site_profile)


def entry(uuid, name, start, end, hosts):
    return {"task": {"id": uuid, "name": name, "duration": {"start": start, "end": end}},
            "hosts": {h: {"changed": h == "b"} for h in hosts}}


def test_per_host_entries_of_one_task_are_one_row():
    report = {"plays": [{"play": {"name": "P"}, "tasks": [
        entry("t1", "ping", "2026-12-06T10:00:00.000Z", "2026-12-06T10:00:01.000Z", ["a"]),
        entry("t1", "ping", "2026-12-06T10:00:00.500Z", "2026-12-06T10:00:02.500Z", ["b"]),
        entry("t2", "cmd", "2026-12-06T10:00:03.000Z", "2026-12-06T10:00:03.250Z", ["a", "b"]),
    ]}]}
    assert site_profile.slowest(report, 5) == [(2.5, "ping", "P", 2, 1), (0.25, "cmd", "P", 2, 1)]
    assert site_profile.plays(report) == [(3.25, "P", 2)]


@pytest.mark.parametrize("strategy", ["linear", "mitogen_linear"])
def test_a_real_run_under_each_strategy(tmp_path, strategy):
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    (tmp_path / "hosts.yml").write_text('{"all": {"hosts": {"a": %s, "b": %s}}}' % ((str(host).replace("'", '"'),) * 2))
    (tmp_path / "play.yml").write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                                       "    - ansible.builtin.ping:\n    - ansible.builtin.command: 'true'\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_STRATEGY=strategy)
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    done = subprocess.run([sys.executable, ROOT / "bench/site_profile.py", "--plays", "--", playbook, "-i",
                           tmp_path / "hosts.yml", tmp_path / "play.yml"], env=env, capture_output=True, text=True,
                          check=True, timeout=120)
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1 ") or line.startswith("| 2 ")]
    assert len(rows) == 2 and all(row.split("|")[5].strip() == "2" for row in rows), done.stdout
    assert "| all plays |" in done.stdout and done.stdout.split("| all plays |")[1].split("|")[1].strip() == "2"
