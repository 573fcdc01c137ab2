"""vca_boot: the rendered boot script against a fake vcactl, the unit's timeouts, the node-name check.

The script and the unit are rendered from the role's templates with jinja2 (Ansible's
filters added, trim_blocks as the template module does) and the role's defaults; the
script then runs under bash against a small fake vcactl that answers with the real
status strings ("Card: 0 Cpu: 1  STATE: net_device_ready", as lab/sim/vcasim/vcactl.py
and module_utils/vcactl.py have them). The timing tests use a 3 s deadline and assert
only a generous upper bound (20 s): eight stuck nodes each given their own 3 s would
take 24 s and break it, one deadline for all of them does not.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import jinja2
import pytest
import yaml
from ansible.plugins.filter.core import FilterModule

from conftest import ROOT

ROLE = ROOT / "roles" / "vca_boot"
SCRIPT = ROLE / "templates" / "usr" / "local" / "lib" / "vcafleet" / "vca2-boot.sh.j2"
UNIT = ROLE / "templates" / "etc" / "systemd" / "system" / "vca2-card.service.j2"
BOUND_S = 20

FAKE_VCACTL = r"""#!/bin/bash
# fake vcactl: one file per node, $D/state/<card>-<cpu>; $D/on_boot/<card>-<cpu> is
# where a boot leads (net_device_ready, or booting for a node that hangs there),
# $D/on_shutdown/<card>-<cpu> where os-shutdown leads; $D/blockio/<card>-<cpu> holds
# the disk opened as the node's vcablk0. As the real one: vcablk0 is not closed under
# a running OS, and a vcablk0 boot needs it opened.
D=@DIR@
echo "$*" >> "$D/calls.log"
verb=${1:-}; shift
node() { [ -e "$D/state/$1-$2" ] || { echo "ERROR: Card: $1 Cpu: $2 - no such node"; exit 1; }; cat "$D/state/$1-$2"; }
set_state() { echo "$3" > "$D/state/$1-$2"; }
case $verb in
    status)
        found=0
        for f in "$D"/state/*; do
            [ -e "$f" ] || continue
            k=${f##*/}; card=${k%-*}; cpu=${k#*-}
            if [ $# -ge 2 ] && { [ "$1" != "$card" ] || [ "$2" != "$cpu" ]; }; then continue; fi
            echo "Card: $card Cpu: $cpu  STATE: $(cat "$f")"; found=1
        done
        if [ $found = 0 ] && [ $# -ge 2 ]; then echo "ERROR: Card: $1 Cpu: $2 - no such node"; exit 1; fi ;;
    boot)
        s=$(node "$1" "$2") || exit 1
        case $s in
            bios_up|bios_ready) ;;
            *) echo "ERROR: Card: $1 Cpu: $2 - Card needs to be in \"bios_up\" or \"bios_ready\" state!"; exit 1 ;;
        esac
        if [ "${3:-}" = vcablk0 ] && [ ! -s "$D/blockio/$1-$2" ]; then
            echo "ERROR: Card: $1 Cpu: $2 - vcablk0 is not opened (vcactl blockio open $1 $2 vcablk0 RW <path>)"; exit 1
        fi
        set_state "$1" "$2" "$(cat "$D/on_boot/$1-$2")" ;;
    pwrbtn-short) s=$(node "$1" "$2") || exit 1; [ "$s" = power_off ] && set_state "$1" "$2" bios_up; exit 0 ;;
    pwrbtn-long) node "$1" "$2" >/dev/null || exit 1; set_state "$1" "$2" power_off ;;
    os-shutdown)
        s=$(node "$1" "$2") || exit 1
        case $s in
            os_ready|net_device_ready) set_state "$1" "$2" "$(cat "$D/on_shutdown/$1-$2")" ;;
            *) echo "ERROR: Card: $1 Cpu: $2 - Card needs to be in \"os_ready\" or \"net_device_ready\" state!"
               exit 1 ;;
        esac ;;
    reset) node "$1" "$2" >/dev/null || exit 1; set_state "$1" "$2" bios_up ;;
    blockio)
        s=$(node "$2" "$3") || exit 1
        case $1 in
            open) [ -f "$6" ] || { echo "ERROR: $6: no such file"; exit 1; }; echo "$6" > "$D/blockio/$2-$3" ;;
            close)
                case $s in
                    booting|os_ready|net_device_ready)
                        echo "ERROR: Card: $2 Cpu: $3 - vcablk0 in use by the OS"; exit 1 ;;
                esac
                rm -f "$D/blockio/$2-$3" ;;
            *) echo "ERROR: unknown blockio command $1"; exit 2 ;;
        esac ;;
    *) echo "ERROR: unknown command $verb"; exit 2 ;;
esac
"""


def defaults():
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())


def render(template, nodes, dead=(), **overrides):
    """The template with the role's defaults, an inventory of nodes {name: (card, cpu)} and overrides."""
    env = jinja2.Environment(trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)
    env.filters.update({k: v for k, v in FilterModule().filters().items() if k not in env.filters})
    variables = defaults() | overrides | {
        "ansible_managed": "Ansible managed (test)",
        "groups": {"vca_nodes": list(nodes), "dead": list(dead)},
        "vca_boot_nodes": sorted(nodes),   # vars/main.yml: this host's nodes (lookup fleet_host)
        "hostvars": {name: {"vca_card": card, "vca_cpu": cpu} for name, (card, cpu) in nodes.items()},
    }
    return env.from_string(template.read_text()).render(variables)


class Fleet:
    """A fake vcactl in tmp_path: node states in files, every call logged."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "fake"
        for sub in ("state", "on_boot", "on_shutdown", "blockio"):
            (self.dir / sub).mkdir(parents=True)
        self.vcactl = self.dir / "vcactl"
        self.vcactl.write_text(FAKE_VCACTL.replace("@DIR@", str(self.dir)))
        self.vcactl.chmod(0o755)
        (self.dir / "calls.log").write_text("")

    def node(self, card, cpu, state, on_boot="net_device_ready", on_shutdown="power_off"):
        (self.dir / "state" / f"{card}-{cpu}").write_text(state + "\n")
        (self.dir / "on_boot" / f"{card}-{cpu}").write_text(on_boot + "\n")
        (self.dir / "on_shutdown" / f"{card}-{cpu}").write_text(on_shutdown + "\n")

    def state(self, card, cpu):
        return (self.dir / "state" / f"{card}-{cpu}").read_text().strip()

    def calls(self):
        return (self.dir / "calls.log").read_text().splitlines()

    def opened(self, card, cpu):
        """The disk open as the node's vcablk0, or None."""
        f = self.dir / "blockio" / f"{card}-{cpu}"
        return f.read_text().strip() if f.exists() else None


def disk(tmp_path, name):
    return tmp_path / "disks" / f"{name}.img"


def run_script(tmp_path, fleet, nodes, action, *args, dead=(), disks=None, **overrides):
    """Render the script for this inventory, run `vca2-boot.sh <action> [args]`; (rc, output, seconds).
    Each node of `disks` (default: every node of the inventory) has its disk file in tmp_path/disks."""
    (tmp_path / "disks").mkdir(exist_ok=True)
    for name in nodes if disks is None else disks:
        disk(tmp_path, name).write_bytes(b"a node disk")
    script = tmp_path / "vca2-boot.sh"
    script.write_text(render(SCRIPT, nodes, dead, vca_boot_vcactl=str(fleet.vcactl), vca_boot_nat_enabled=False,
                             vca_boot_disk_dir=str(tmp_path / "disks"), **overrides))
    script.chmod(0o755)
    began = time.monotonic()
    done = subprocess.run(["bash", str(script), action, *args], capture_output=True, text=True, timeout=120,
                          check=False)
    return done.returncode, done.stdout + done.stderr, time.monotonic() - began


def inventory(count):
    return {f"vca-node{n}": (n // 3, n % 3) for n in range(count)}


def test_no_node_reported_is_a_failure_with_a_message(tmp_path):
    fleet = Fleet(tmp_path)              # vcactl answers, but reports no node at all
    rc, out, _ = run_script(tmp_path, fleet, inventory(3), "start")
    assert rc == 1, out                  # not 3: the unit counts 3 as success
    assert "vcactl reports no node at all" in out
    assert "vca-node0 (card 0 cpu 0)" in out and "vca-node2 (card 0 cpu 2)" in out
    assert not [c for c in fleet.calls() if not c.startswith("status")]   # nothing was booted


def test_a_node_without_status_fails_the_start_but_the_others_boot(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "bios_up")
    fleet.node(0, 1, "bios_up")
    rc, out, _ = run_script(tmp_path, fleet, inventory(3), "start")
    assert rc == 3, out
    assert "vcactl reports no status for vca-node2 (card 0 cpu 2)" in out
    assert fleet.state(0, 0) == fleet.state(0, 1) == "net_device_ready"


def test_healthy_start_skips_the_dead_node(tmp_path):
    fleet = Fleet(tmp_path)
    nodes = inventory(6)
    for card, cpu in nodes.values():
        fleet.node(card, cpu, "link_down" if (card, cpu) == (1, 0) else "power_off")
    rc, out, _ = run_script(tmp_path, fleet, nodes, "start", dead=["vca-node3"])
    assert rc == 0, out
    assert "skip vca-node3 (card 1 cpu 0): in the dead group" in out
    assert "power on vca-node1 (card 0 cpu 1)" in out and "boot vca-node5 (card 1 cpu 2) from vcablk0" in out
    assert all(fleet.state(c, p) == "net_device_ready" for c, p in nodes.values() if (c, p) != (1, 0))
    assert not [c for c in fleet.calls() if c.startswith(("boot 1 0", "pwrbtn-short 1 0"))]


def test_a_node_without_its_disk_is_not_booted_and_is_named(tmp_path):
    fleet = Fleet(tmp_path)
    nodes = inventory(3)
    fleet.node(0, 0, "bios_up")
    fleet.node(0, 1, "power_off")        # no disk: not even powered on
    fleet.node(0, 2, "bios_up")
    rc, out, _ = run_script(tmp_path, fleet, nodes, "start", disks=["vca-node0", "vca-node2"])
    assert rc == 3, out                  # counted as a node that did not come up: the unit stays up
    assert (f"vca-node1 (card 0 cpu 1): no disk yet: {disk(tmp_path, 'vca-node1')}; "
            "playbooks/image.yml writes it") in out
    assert "not booted, no disk yet: vca-node1" in out
    assert fleet.state(0, 1) == "power_off" and fleet.opened(0, 1) is None
    assert not [c for c in fleet.calls() if c.split()[:3] in (["boot", "0", "1"], ["pwrbtn-short", "0", "1"])
                or c.startswith("blockio open 0 1")]
    assert fleet.state(0, 0) == fleet.state(0, 2) == "net_device_ready"
    assert fleet.opened(0, 0) == str(disk(tmp_path, "vca-node0"))


def test_first_start_before_any_disk_boots_nothing_and_the_unit_stays_up(tmp_path):
    """host.yml runs before image.yml has written a disk: nothing is booted, and start exits 3 (not 1),
    so the unit is active and its stop later powers off the nodes the rollout boots."""
    fleet = Fleet(tmp_path)
    nodes = inventory(3)
    for card, cpu in nodes.values():
        fleet.node(card, cpu, "bios_up")
    rc, out, _ = run_script(tmp_path, fleet, nodes, "start", disks=())
    assert rc == 3, out
    assert "not booted, no disk yet: vca-node0, vca-node1, vca-node2" in out
    assert all(fleet.state(c, p) == "bios_up" for c, p in nodes.values())
    assert not [c for c in fleet.calls() if not c.startswith("status")]


@pytest.mark.parametrize("verb", ["reboot", "boot"])
def test_reboot_or_boot_of_a_node_without_its_disk_fails_and_leaves_it_alone(tmp_path, verb):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "net_device_ready" if verb == "reboot" else "bios_up")
    before = fleet.state(0, 0)
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), verb, "vca-node0", disks=())
    assert rc == 1, out
    assert f"vca-node0 (card 0 cpu 0): no disk yet: {disk(tmp_path, 'vca-node0')}" in out
    assert fleet.state(0, 0) == before
    assert not [c for c in fleet.calls() if not c.startswith("status")]   # not shut down, not booted


def test_shutdown_powers_the_node_off_then_closes_its_vcablk0(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "net_device_ready")
    fleet.node(0, 1, "net_device_ready")
    (fleet.dir / "blockio" / "0-0").write_text(f"{disk(tmp_path, 'vca-node0')}\n")
    rc, out, _ = run_script(tmp_path, fleet, inventory(2), "shutdown", "vca-node0")
    assert rc == 0, out
    assert fleet.state(0, 0) == "power_off" and fleet.opened(0, 0) is None
    assert "vca-node0 (card 0 cpu 0) is power_off, its vcablk0 closed" in out
    acts = [c for c in fleet.calls() if not c.startswith("status")]
    assert acts == ["os-shutdown 0 0", "blockio close 0 0 vcablk0"], acts   # closed once the OS is gone
    assert fleet.state(0, 1) == "net_device_ready"                          # only that node


def test_shutdown_presses_the_power_button_at_the_stop_deadline(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "net_device_ready", on_shutdown="powering_down")
    rc, out, took = run_script(tmp_path, fleet, inventory(1), "shutdown", "vca-node0", vca_boot_stop_timeout_s=3)
    assert took < BOUND_S, out
    assert rc == 0, out
    assert "vca-node0 (card 0 cpu 0) still powering_down at the 3s deadline: power button" in out
    assert fleet.state(0, 0) == "power_off" and "pwrbtn-long 0 0" in fleet.calls()


def test_shutdown_resets_a_node_in_error_to_its_bios(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "error")
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), "shutdown", "vca-node0")
    assert rc == 0, out
    assert "reset vca-node0 (card 0 cpu 0) from error" in out and fleet.state(0, 0) == "bios_up"
    assert "os-shutdown 0 0" not in fleet.calls() and "blockio close 0 0 vcablk0" in fleet.calls()


def test_boot_powers_on_opens_the_disk_and_boots_it(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "power_off")
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), "boot", "vca-node0")
    assert rc == 0, out
    assert fleet.state(0, 0) == "net_device_ready" and fleet.opened(0, 0) == str(disk(tmp_path, "vca-node0"))
    acts = [c for c in fleet.calls() if not c.startswith(("status", "blockio close"))]
    assert acts == ["pwrbtn-short 0 0", f"blockio open 0 0 vcablk0 RW {disk(tmp_path, 'vca-node0')}",
                    "boot 0 0 vcablk0"], acts


def test_boot_file_boots_the_file_into_the_node_and_leaves_its_disk_closed(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "power_off")
    volatile = tmp_path / "node.volatile.img"
    volatile.write_bytes(b"a volatile image")
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), "boot-file", "vca-node0", str(volatile))
    assert rc == 0, out
    assert fleet.state(0, 0) == "net_device_ready" and fleet.opened(0, 0) is None
    acts = [c for c in fleet.calls() if not c.startswith(("status", "blockio close"))]
    assert acts == ["pwrbtn-short 0 0", f"boot 0 0 {volatile}"], acts
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), "boot-file", "vca-node0", str(tmp_path / "none.img"))
    assert rc == 1 and "no file" in out, out


def test_boot_refuses_a_node_that_is_up(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "net_device_ready")
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), "boot", "vca-node0")
    assert rc == 1, out
    assert "vca-node0 (card 0 cpu 0) is net_device_ready: not booting a node that is up" in out
    assert not [c for c in fleet.calls() if not c.startswith("status")]


def test_reboot_is_shutdown_close_then_open_and_boot(tmp_path):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "net_device_ready")
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), "reboot", "vca-node0")
    assert rc == 0, out
    assert fleet.state(0, 0) == "net_device_ready"
    acts = [c.split()[0] + " " + c.split()[1] if c.startswith("blockio") else c.split()[0]
            for c in fleet.calls() if not c.startswith("status")]
    # off, its vcablk0 closed, then powered on, the disk (re)opened and booted
    assert acts == ["os-shutdown", "blockio close", "pwrbtn-short", "blockio close", "blockio open", "boot"], acts


@pytest.mark.parametrize("verb", ["shutdown", "boot", "reboot"])
def test_node_verbs_need_a_live_node(tmp_path, verb):
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "net_device_ready")
    assert run_script(tmp_path, fleet, inventory(1), verb)[0] == 2            # no NODE: usage
    rc, out, _ = run_script(tmp_path, fleet, inventory(1), verb, "vca-node9")
    assert rc == 1 and "vca-node9 is not a live node" in out
    assert fleet.state(0, 0) == "net_device_ready"


@pytest.mark.parametrize("stuck", [2, 8])
def test_stuck_nodes_give_up_at_one_total_deadline(tmp_path, stuck):
    fleet = Fleet(tmp_path)
    nodes = inventory(stuck + 1)         # node 0 boots; the others hang in booting
    for n, (card, cpu) in enumerate(nodes.values()):
        fleet.node(card, cpu, "bios_up", on_boot="net_device_ready" if n == 0 else "booting")
    rc, out, took = run_script(tmp_path, fleet, nodes, "start", vca_boot_start_timeout_s=3)
    assert took < BOUND_S, f"{took:.1f} s for {stuck} stuck nodes and a 3 s deadline:\n{out}"
    assert rc == 3, out                  # booted, some not ready: the unit stays up for its ExecStop
    assert "vca-node0 (card 0 cpu 0) is net_device_ready" in out
    names = [f"vca-node{n}" for n in range(1, stuck + 1)]
    for name, (card, cpu) in list(nodes.items())[1:]:
        assert f"{name} (card {card} cpu {cpu}) not net_device_ready at the 3s deadline: booting" in out
    assert f"gave up on {', '.join(names)}: not net_device_ready within 3s" in out


@pytest.mark.parametrize("stuck", [2, 8])
def test_stop_presses_the_power_button_at_one_total_deadline(tmp_path, stuck):
    fleet = Fleet(tmp_path)
    nodes = inventory(stuck + 1)         # node 0 powers off; the others hang in powering_down
    for n, (card, cpu) in enumerate(nodes.values()):
        fleet.node(card, cpu, "net_device_ready", on_shutdown="power_off" if n == 0 else "powering_down")
    rc, out, took = run_script(tmp_path, fleet, nodes, "stop", vca_boot_stop_timeout_s=3)
    assert took < BOUND_S, f"{took:.1f} s for {stuck} stuck nodes and a 3 s deadline:\n{out}"
    assert rc == 0, out
    for name, (card, cpu) in list(nodes.items())[1:]:
        assert f"{name} (card {card} cpu {cpu}) still powering_down at the 3s deadline: power button" in out
        assert f"pwrbtn-long {card} {cpu}" in fleet.calls()
    assert "pwrbtn-long 0 0" not in fleet.calls()
    assert all(fleet.state(c, p) == "power_off" for c, p in nodes.values())


def test_node_names_are_quoted_in_the_script(tmp_path):
    """Even a name the role's check would refuse cannot run a command from the rendered script."""
    fleet = Fleet(tmp_path)
    fleet.node(0, 0, "bios_up")
    pwned = tmp_path / "pwned"
    rc, out, _ = run_script(tmp_path, fleet, {f"vca-$(touch {pwned})": (0, 0)}, "status", disks=())
    assert rc == 0, out
    assert not pwned.exists()


@pytest.mark.parametrize("overrides", [{}, {"vca_boot_start_timeout_s": 3, "vca_boot_stop_timeout_s": 3}])
def test_unit_timeouts_cover_the_deadlines(overrides):
    settings = defaults() | overrides
    unit = render(UNIT, inventory(6), **overrides)
    start = int(re.search(r"^TimeoutStartSec=(\d+)$", unit, re.M).group(1))
    stop = int(re.search(r"^TimeoutStopSec=(\d+)$", unit, re.M).group(1))
    assert start >= settings["vca_boot_start_timeout_s"] + settings["vca_boot_unit_slack_s"]
    assert stop >= settings["vca_boot_stop_timeout_s"] + settings["vca_boot_unit_slack_s"]
    # a start that booted nodes but not all of them exits DEGRADED: the unit counts it as a success
    degraded = re.search(r"^DEGRADED=(\d+)$", render(SCRIPT, inventory(6), **overrides), re.M).group(1)
    assert re.search(rf"^SuccessExitStatus={degraded}$", unit, re.M)


def playbook_check(tmp_path, names):
    """Run the role's own inventory check (tasks/validate.yml) with ansible-playbook on this inventory."""
    hosts = {name: {"vca_card": n // 3, "vca_cpu": n % 3, "ansible_connection": "local"}
             for n, name in enumerate(names)}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"vca_nodes": {"hosts": hosts}}}}))
    (tmp_path / "check.yml").write_text(yaml.safe_dump([{
        "name": "vca_boot's inventory check", "hosts": "localhost", "gather_facts": False, "connection": "local",
        "tasks": [{"name": "Check", "ansible.builtin.include_role": {"name": "vca_boot", "tasks_from": "validate"}}],
    }]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="0", ANSIBLE_INVENTORY_UNPARSED_WARNING="0")
    playbook = shutil.which("ansible-playbook", path=str(os.path.dirname(sys.executable))) or "ansible-playbook"
    done = subprocess.run([playbook, "-i", str(tmp_path / "hosts.yml"), str(tmp_path / "check.yml")], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("bad", ["vca node1", "vca-$(touch /tmp/vcafleet-pwned)", "vca-node1;reboot"])
def test_role_refuses_unsafe_node_names(tmp_path, bad):
    rc, out = playbook_check(tmp_path, ["vca-node0", bad])
    assert rc != 0, out
    assert "a node name must match" in out and bad in out


def test_role_accepts_the_inventory_names(tmp_path):
    rc, out = playbook_check(tmp_path, ["vca-node0", "vca-node1", "card1.node_4"])
    assert rc == 0, out
