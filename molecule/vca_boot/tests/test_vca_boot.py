"""vca_boot on the molecule host with the simulated vcactl.

prepare.yml gives nodes 0, 1, 2 and 4 a disk (/var/lib/vcafleet/nodes/<node>.img) and
node 5 none; the stand-in refuses a vcablk0 boot with no disk opened, as the real one
would. Runs in file order: the last test gives node 5 its disk.
"""

from __future__ import annotations

import re

testinfra_hosts = ["ansible://vca_host"]

SCRIPT = "/usr/local/lib/vcafleet/vca2-boot.sh"
DISKS = "/var/lib/vcafleet/nodes"
LIVE = {"0 Cpu: 0", "0 Cpu: 1", "0 Cpu: 2", "1 Cpu: 1", "1 Cpu: 2"}
NODE5 = "1 Cpu: 2"                  # vca-node5: no disk until the last test
BOOTED = LIVE - {NODE5}


def states(host):
    return dict(re.findall(r"Card: (\d+ Cpu: \d+)\s+STATE: (\S+)", host.check_output("vcactl status")))


def opened(host):
    return dict(re.findall(r"Card: (\d+ Cpu: \d+)\s+vcablk0: (\S+)", host.check_output("vcactl blockio list")))


def journal(host):
    return host.check_output("journalctl -u vca2-card.service --no-pager -o cat")


def test_service_installed_enabled_and_active(host):
    unit = host.file("/etc/systemd/system/vca2-card.service")
    assert unit.contains("^Type=oneshot$") and unit.contains("^RemainAfterExit=yes$")
    assert unit.contains("^After=network-online.target$")
    svc = host.service("vca2-card.service")
    assert svc.is_enabled and svc.is_running
    # node 5 was not booted: the start exited 3 (degraded), which the unit counts as success
    assert host.check_output("systemctl show --property=ExecMainStatus --value vca2-card.service") == "3"


def test_nodes_with_a_disk_booted_from_it_node5_not_and_node3_skipped(host):
    s = states(host)
    assert {k for k, v in s.items() if v == "net_device_ready"} == BOOTED
    assert s[NODE5] == "bios_up" and s["1 Cpu: 0"] == "link_down"
    assert opened(host)["0 Cpu: 0"] == f"{DISKS}/vca-node0.img" and opened(host)[NODE5] == "closed"
    log = journal(host)
    for name, card, cpu in [("vca-node0", 0, 0), ("vca-node4", 1, 1)]:
        assert f"boot {name} (card {card} cpu {cpu}) from vcablk0" in log
        assert f"{name} (card {card} cpu {cpu}) is net_device_ready" in log
    assert f"vca-node5 (card 1 cpu 2): no disk yet: {DISKS}/vca-node5.img; playbooks/image.yml writes it" in log
    assert "boot vca-node5" not in log and "vcablk0 is not opened" not in log
    assert "skip vca-node3 (card 1 cpu 0): in the dead group" in log
    assert "boot vca-node3" not in log


def test_reboot_of_a_node_without_its_disk_fails_and_leaves_it_alone(host):
    run = host.run(f"{SCRIPT} reboot vca-node5")
    assert run.rc == 1, run.stdout + run.stderr
    assert f"no disk yet: {DISKS}/vca-node5.img" in run.stdout
    assert states(host)[NODE5] == "bios_up"


def test_nat_ruleset_loaded(host):
    table = host.check_output("nft list table ip vcafleet_nat")
    assert re.search(r'ip saddr 172\.31\.0\.0/16 oifname "eth0" masquerade', table)
    assert host.file("/etc/sysctl.d/60-vcafleet-forward.conf").contains("^net.ipv4.ip_forward *= *1$")


def test_nat_reload_does_not_pile_up(host):
    host.check_output("nft -f /etc/vcafleet/vca2-nat.nft")
    host.check_output("nft -f /etc/vcafleet/vca2-nat.nft")
    assert host.check_output("nft list table ip vcafleet_nat").count("masquerade") == 1


def test_stop_powers_live_nodes_off_and_start_brings_them_back(host):
    host.check_output("systemctl stop vca2-card.service")
    s = states(host)
    assert {k for k, v in s.items() if v == "power_off"} == BOOTED
    assert s[NODE5] == "bios_up"                                   # never booted: left at its BIOS
    assert s["1 Cpu: 0"] == "link_down"
    assert "shut down vca-node4 (card 1 cpu 1)" in journal(host)
    host.check_output("systemctl start vca2-card.service")
    assert {k for k, v in states(host).items() if v == "net_device_ready"} == BOOTED
    assert "power on vca-node1 (card 0 cpu 1)" in journal(host)


def test_node5_with_its_disk_boots_then_shuts_down_with_its_vcablk0_closed(host):
    host.check_output(f"cp {DISKS}/vca-node4.img {DISKS}/vca-node5.img")   # as node_image would write it
    run = host.run(f"{SCRIPT} boot vca-node5")
    assert run.rc == 0, run.stdout + run.stderr
    assert states(host)[NODE5] == "net_device_ready" and opened(host)[NODE5] == f"{DISKS}/vca-node5.img"
    run = host.run(f"{SCRIPT} shutdown vca-node5")
    assert run.rc == 0, run.stdout + run.stderr
    assert "vca-node5 (card 1 cpu 2) is power_off, its vcablk0 closed" in run.stdout
    assert states(host)[NODE5] == "power_off" and opened(host)[NODE5] == "closed"
    host.check_output(f"rm {DISKS}/vca-node5.img")
