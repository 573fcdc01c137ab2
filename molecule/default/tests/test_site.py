"""Verify the whole-site converge on the molecule lab (testinfra).

The lab's machines are addressed directly as docker://<lab>-<name>; the lab
name comes from the scenario's VCA_LAB_NAME.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest
import testinfra

LAB = os.environ.get("VCA_LAB_NAME", "vcamol")
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
LIVE = [0, 4]
# The scenario's own small-lab inventory (molecule links its group_vars to inventory/lab's).
INVENTORY = Path(os.environ["MOLECULE_INVENTORY_FILE"]).parent
SYSFS = "/var/lib/vcasim/sys"
LOCAL = testinfra.get_host("local://")


def machine(name: str):
    return testinfra.get_host(f"docker://{LAB}-{name}")


def test_dead_node_container_exists_but_is_stopped():
    state = LOCAL.check_output(f"docker inspect -f '{{{{.State.Status}}}}' {LAB}-node3")
    assert state in ("created", "exited")          # created stopped, or stopped later: never running


def test_vcactl_reports_live_nodes_ready_and_node3_link_down():
    out = machine("host").check_output("vcactl status")
    states = dict(re.findall(r"Card: (\d+ Cpu: \d+)\s+STATE: (\S+)", out))
    assert states == {"0 Cpu: 0": "net_device_ready", "1 Cpu: 0": "link_down", "1 Cpu: 1": "net_device_ready"}


@pytest.mark.parametrize("node", LIVE)
def test_live_node_simulator_runs_and_its_counters_move(node):
    host = machine(f"node{node}")
    svc = host.service("vcasim-node")
    assert svc.is_running and svc.is_enabled
    assert host.file(f"{SYSFS}/class/hwmon/hwmon1/name").content_string.strip() == "coretemp"
    # One command on the node reads the counter twice, each reading timed by the file's own
    # mtime (the simulator's write, from the same open file): the window is the simulator's,
    # not docker exec's latency on a busy machine.
    energy = f"{SYSFS}/class/powercap/intel-rapl:0/energy_uj"
    script = ("import os, time\n"
              "def reading():\n"
              f"    with open('{energy}') as fh:\n"
              "        return int(fh.read()), os.fstat(fh.fileno()).st_mtime\n"
              "e0, t0 = reading(); time.sleep(2.5); e1, t1 = reading(); print(e0, t0, e1, t1)")
    e0, t0, e1, t1 = map(float, host.check_output(f"python3 -c {shlex.quote(script)}").split())
    watts = (e1 - e0) / (t1 - t0) / 1e6
    assert 5.0 < watts < 60.0, watts                          # idle ~12 W, never above stock PL2
    temp = int(host.file(f"{SYSFS}/class/hwmon/hwmon1/temp1_input").content_string) / 1000
    assert 30.0 < temp < 96.0


LAB_SSH = Path("/var/lib/vcafleet-lab") / LAB / "ssh"


def adhoc(pattern: str, module: str, args: dict) -> dict:
    """An ad-hoc ansible run on the scenario's inventory: {host: result}, from the JSON callback."""
    env = (f"VCA_LAB_NAME={LAB} ANSIBLE_CONFIG={PROJECT}/ansible.cfg ANSIBLE_LOAD_CALLBACK_PLUGINS=1 "
           "ANSIBLE_STDOUT_CALLBACK=ansible.posix.json ANSIBLE_DEPRECATION_WARNINGS=0")
    out = LOCAL.run(f"cd {PROJECT} && {env} ansible -i {INVENTORY} {shlex.quote(pattern)} -m {module} "
                    f"-a {shlex.quote(json.dumps(args))}").stdout
    return json.loads(out)["plays"][0]["tasks"][0]["hosts"]


def test_ansible_reaches_every_live_machine_over_ssh_with_host_key_checking():
    config = (LAB_SSH / "config").read_text()
    assert "StrictHostKeyChecking yes" in config and f"UserKnownHostsFile {LAB_SSH}/known_hosts" in config
    answers = {name: r.get("stdout") for name, r in adhoc("lab:!dead", "command", {"cmd": "hostname"}).items()}
    assert answers == {"vca-host": "vca-host", "vca-node0": "vca-node0", "vca-node4": "vca-node4"}, answers
    # ... over SSH: the nodes through the lab host, each login checked against the lab's known_hosts
    how = adhoc("vca-node0", "debug", {"msg": "{{ ansible_connection }} {{ ansible_ssh_common_args }}"})
    assert how["vca-node0"]["msg"].startswith("ssh -F ") and f"ProxyJump=root@{LAB}-host" in how["vca-node0"]["msg"]
    known = (LAB_SSH / "known_hosts").read_text()
    for name, ssh_name in (("host", f"{LAB}-host"), ("node0", "172.31.1.1"), ("node4", "172.31.5.1")):
        key = machine(name).file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()[:2]
        assert f"{ssh_name} {' '.join(key)}" in known        # a node by its link address, as on a card


def test_second_check_run_reports_no_changes():
    env = f"VCA_LAB_NAME={LAB} ANSIBLE_CONFIG={PROJECT}/ansible.cfg ANSIBLE_NOCOLOR=1 ANSIBLE_FORCE_COLOR=0"
    site = f"ansible-playbook -i {INVENTORY} site.yml --check --skip-tags image"   # the image has its own scenario
    out = LOCAL.check_output(f"cd {PROJECT} && {env} {site}")
    recap = re.findall(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", out, re.M)
    assert recap, out
    assert all(changed == "0" and unreachable == "0" and failed == "0" for _, changed, unreachable, failed in recap)


def test_gemm_bench_runs_on_every_live_node_and_verifies(tmp_path):
    results = tmp_path / "bench"
    env = f"VCA_LAB_NAME={LAB} ANSIBLE_CONFIG={PROJECT}/ansible.cfg ANSIBLE_NOCOLOR=1"
    extra = ('{"vca_bench_sizes": [96], "vca_bench_both_seconds": 2, "vca_bench_tune_budget": 4, '
             f'"vca_bench_results_dir": "{results}"}}')
    LOCAL.check_output(f"cd {PROJECT} && {env} ansible-playbook -i {INVENTORY} playbooks/bench/gemm.yml -e '{extra}'")
    (run,) = list(results.glob("gemm-*"))
    records = {p.stem: json.loads(p.read_text()) for p in run.glob("vca-node*.json")}
    assert sorted(records) == [f"vca-node{n}" for n in LIVE]
    for host, rec in records.items():
        for part in (rec["opencl"], rec["cpu"], rec["both"]["opencl"], rec["both"]["cpu"]):
            assert part.get("failed") is not True, (host, part.get("msg"))
            record = part["record"]
            assert record["platform"] == "lab"                     # simulated sysfs: never a hardware figure
            assert all(r["verification"]["passed"] and r["gflops"] > 0 for r in record["results"])
        assert "Portable Computing Language" in rec["opencl"]["record"]["device"]["platform"]
    table = (run / "table.md").read_text()
    assert "| **combined** |" in table and table.count("| vca-node") == len(LIVE)


def test_dma_bench_says_no_engine_and_gives_no_figure(tmp_path):
    results = tmp_path / "bench"
    env = f"VCA_LAB_NAME={LAB} ANSIBLE_CONFIG={PROJECT}/ansible.cfg ANSIBLE_NOCOLOR=1"
    LOCAL.check_output(f"cd {PROJECT} && {env} ansible-playbook -i {INVENTORY} playbooks/bench/dma.yml"
                       f" -e vca_bench_results_dir={results}")
    (run,) = list(results.glob("dma-*"))
    records = {p.stem: json.loads(p.read_text()) for p in run.glob("*.json")}
    assert sorted(records) == sorted(["vca-host"] + [f"vca-node{n}" for n in LIVE])
    for host, rec in records.items():
        result = rec["result"]
        assert result.get("failed") is not True, (host, result.get("msg"))
        assert result["unsupported"] is True and result["msg"].startswith("unsupported: no PLX DMA engine found")
        assert result["looked_for"] and "record" not in result, (host, result)
    table = (run / "table.md").read_text()
    assert "no figure was measured" in table and "| from | to |" not in table   # no leg, no figure
