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
    assert unit.contains("^After=network-online.target vcafleet-firewall.service$")
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


RULESET = "/etc/vcafleet/firewall.nft"
LIVE_IPS = ["172.31.1.1", "172.31.2.1", "172.31.3.1", "172.31.5.1", "172.31.6.1"]


def table(host, name="inet vcafleet"):
    return host.check_output(f"nft list table {name}")


def elements(ruleset: str, name: str) -> set[str]:
    body = re.search(r"set %s \{(.*?)\n\t\}" % name, ruleset, re.S).group(1)
    found = re.search(r"elements = \{(.*?)\}", body, re.S)
    return {e.strip() for e in found.group(1).split(",")} if found else set()


def test_nat_and_forwarding(host):
    assert re.search(r'ip saddr 172\.31\.0\.0/16 oifname "eth0" masquerade', table(host))
    assert host.file("/etc/sysctl.d/60-vcafleet-forward.conf").contains("^net.ipv4.ip_forward *= *1$")
    assert host.service("vcafleet-firewall.service").is_enabled
    assert not host.file("/etc/vcafleet/vca2-nat.nft").exists                    # the NAT-only ruleset is gone
    assert host.run("nft list table ip vcafleet_nat").rc != 0


def test_firewall_opens_only_what_the_exposure_table_declares(host):
    rules = table(host)
    # host -> node: each live node's sshd and vcamon agent, nothing on dead node 3 (172.31.4.1)
    to_nodes = elements(rules, "host_to_node")
    assert {f"{ip} . tcp . 22" for ip in LIVE_IPS} | {f"{ip} . tcp . 9478" for ip in LIVE_IPS} <= to_nodes
    assert not any(e.startswith("172.31.4.1 ") for e in to_nodes)
    # node -> host: DNS from every live node, nothing else from a node outside the farm group (none here)
    from_nodes = elements(rules, "node_to_host")
    assert {f"{ip} . udp . 53" for ip in LIVE_IPS} <= from_nodes
    assert not any(e.endswith(" . 22") for e in from_nodes)                      # no node logs in to the host
    assert elements(rules, "node_to_node") == set() and elements(rules, "lan_to_node") == set()
    # whatever is not declared is dropped: each fleet chain ends in a drop
    for chain in ("from_nodes", "fleet_forward", "node_to_node_forward"):
        body = host.check_output(f"nft list chain inet vcafleet {chain}").strip().splitlines()
        assert re.search(r"counter packets \d+ bytes \d+ drop$", body[-3].strip()), (chain, body)
    assert "policy accept" in host.check_output("nft list chain inet vcafleet forward")  # other traffic: others decide
    # a node whose link is down: its address never follows the default route out of the uplink
    to = host.check_output("nft list chain inet vcafleet to_nodes")
    assert re.search(r'oifname "eth0" counter packets \d+ bytes \d+ reject with icmpx host-unreachable', to), to


def test_a_foreign_table_survives_the_converge(host):
    # prepare.yml made it before the first converge, and the idempotence run converged again since
    foreign = table(host, "inet molecule_foreign")
    assert 'comment "not vcafleet\'s"' in foreign and "policy drop" not in foreign
    assert "molecule_foreign" in host.check_output("nft list tables")


def test_reloading_the_ruleset_never_piles_up(host):
    host.check_output(f"nft -f {RULESET}")
    host.check_output(f"nft -f {RULESET}")
    assert table(host).count("masquerade") == 1 and host.check_output("nft list tables").count("inet vcafleet") == 1
    assert "molecule_foreign" in host.check_output("nft list tables")


def test_the_nodes_resolver_answers_on_the_links_only(host):
    assert host.service("vcafleet-dns.service").is_running
    # no link address here yet (no node container): nothing listens on port 53, on no address at all
    listening = host.check_output("ss -H -ltnup")
    assert not re.search(r":53\s", listening), listening
    # a link comes up (the host's end of node 0's): dnsmasq binds it, and only it
    host.check_output("ip addr add 172.31.1.254/32 dev lo")
    try:
        for _ in range(50):
            listening = host.check_output("ss -H -ltnup")
            if "172.31.1.254:53 " in listening:
                break
            host.run("sleep 0.2")
        bound = re.findall(r"(\S+):53\s", listening)
        assert sorted(set(bound)) == ["172.31.1.254"], listening
        query = "12340100000100000000000007766361686f73740000010001"   # id 0x1234: A? vcahost
        probe = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5); "
                 f"s.sendto(bytes.fromhex('{query}'), ('172.31.1.254', 53)); print(s.recv(512)[:2].hex())")
        assert host.run(f'python3 -c "{probe}"').stdout.strip() == "1234"      # an answer, whatever it says
    finally:
        host.run("ip addr del 172.31.1.254/32 dev lo")


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
