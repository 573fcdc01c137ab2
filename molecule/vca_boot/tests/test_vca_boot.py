"""vca_boot on the molecule host with the simulated vcactl."""

from __future__ import annotations

import re

testinfra_hosts = ["ansible://vca_host"]

LIVE = {"0 Cpu: 0", "0 Cpu: 1", "0 Cpu: 2", "1 Cpu: 1", "1 Cpu: 2"}


def states(host):
    return dict(re.findall(r"Card: (\d+ Cpu: \d+)\s+STATE: (\S+)", host.check_output("vcactl status")))


def journal(host):
    return host.check_output("journalctl -u vca2-card.service --no-pager -o cat")


def test_service_installed_enabled_and_active(host):
    unit = host.file("/etc/systemd/system/vca2-card.service")
    assert unit.contains("^Type=oneshot$") and unit.contains("^RemainAfterExit=yes$")
    assert unit.contains("^After=network-online.target$")
    svc = host.service("vca2-card.service")
    assert svc.is_enabled and svc.is_running


def test_live_nodes_booted_and_node3_skipped_with_a_log_line(host):
    s = states(host)
    assert {k for k, v in s.items() if v == "net_device_ready"} == LIVE
    assert s["1 Cpu: 0"] == "link_down"
    log = journal(host)
    for name, card, cpu in [("vca-node0", 0, 0), ("vca-node5", 1, 2)]:
        assert f"boot {name} (card {card} cpu {cpu}) from vcablk0" in log
        assert f"{name} (card {card} cpu {cpu}) is net_device_ready" in log
    assert "skip vca-node3 (card 1 cpu 0): in the dead group" in log
    assert "boot vca-node3" not in log


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
    assert {k for k, v in s.items() if v == "power_off"} == LIVE
    assert s["1 Cpu: 0"] == "link_down"
    assert "shut down vca-node4 (card 1 cpu 1)" in journal(host)
    host.check_output("systemctl start vca2-card.service")
    assert {k for k, v in states(host).items() if v == "net_device_ready"} == LIVE
    assert "power on vca-node1 (card 0 cpu 1)" in journal(host)
