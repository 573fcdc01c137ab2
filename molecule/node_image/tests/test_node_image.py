"""node_image on the small lab: the rollout, then a broken build rolled back.

Runs in file order: the first tests look at what converge + idempotence left;
test_broken_build_is_rolled_back then rolls out a build whose verifier fails.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import pytest
import testinfra

LAB = os.environ.get("VCA_LAB_NAME", "vcamolimg")
STORE = "/var/lib/vcafleet/images"
DISKS = "/var/lib/vcafleet/nodes"
SCENARIO = Path(__file__).resolve().parents[1]
PROJECT = SCENARIO.parents[1]


@pytest.fixture(scope="module")
def host():
    return testinfra.get_host(f"docker://{LAB}-host")


def node(name):
    return testinfra.get_host(f"docker://{LAB}-{name}")


def link(host, name):
    return host.check_output(f"readlink {STORE}/{name} || true")


def booted(name):
    """The build id the simulated boot handed the node (read inside the node's container)."""
    return json.loads(node(name).file("/var/lib/vcasim/booted/vca-image.json").content_string)["build_id"]


def sim_state(host):
    return json.loads(host.file("/var/lib/vcasim/vcactl.json").content_string)


def root_fs(host, image):
    """debugfs's name for partition 2 of a disk image, the root file system a node boots."""
    table = json.loads(host.check_output(f"sfdisk --json {image}"))["partitiontable"]
    return f"{image}?offset={table['partitions'][1]['start'] * 512}"


def disk_file(host, image, path):
    """A file inside a disk image's partition 2, as the node would boot it."""
    return host.check_output(f"debugfs -R 'cat {path}' '{root_fs(host, image)}' 2>/dev/null")


def test_candidate_passed_everywhere_and_is_good(host):
    good = link(host, "good")
    assert good and link(host, "candidate") == good
    assert host.file(f"{STORE}/{good}/lab-tiny.img").exists
    record = json.loads(host.file(f"{STORE}/{good}/lab-tiny.json").content_string)
    assert record["build_id"] == good and len(record["sha256"]) == 64


def test_each_live_node_booted_the_good_build_from_its_own_disk(host):
    good = link(host, "good")
    state = sim_state(host)
    for name, key in (("vca-node0", "0:0"), ("vca-node1", "0:1")):
        assert booted(name.replace("vca-", "")) == good
        assert state[key]["blockio"] == f"{DISKS}/{name}.img"
        assert state[key]["state"] in ("booting", "os_ready", "net_device_ready")
        assert json.loads(host.file(f"{DISKS}/{name}.json").content_string)["build_id"] == good
    assert not host.file(f"{DISKS}/vca-node3.img").exists, "the dead node got a disk"


def test_per_node_overlay_is_inside_each_disk(host):
    for name, ip in (("vca-node0", "172.31.1.1"), ("vca-node1", "172.31.2.1")):
        disk = f"{DISKS}/{name}.img"
        assert disk_file(host, disk, "/etc/hostname") == name
        local = disk_file(host, disk, "/etc/vca-node.local.conf")
        assert f"HOSTNAME={name}" in local and "HOST_ADDRESS=" + ip.rsplit(".", 1)[0] + ".254" in local
        assert f"address {ip}/24" in disk_file(host, disk, "/etc/network/interfaces.d/eth0")
    # the store's image itself stays generic: the builder's files, and no per-node overlay
    image = f"{STORE}/{link(host, 'good')}/lab-tiny.img"
    assert disk_file(host, image, "/etc/hostname") == "vca-node"
    assert "IFACE=eth0" in disk_file(host, image, "/etc/vca-node.conf")
    local = host.run(f"debugfs -R 'cat /etc/vca-node.local.conf' '{root_fs(host, image)}'")
    assert local.stdout == "" and "File not found by ext2_lookup" in local.stderr, local.stdout


# What lab-tiny does not carry, so its verifier fails these on a card for that reason alone: Intel's
# node agent (ubuntu-22.04's kernel.vca_userspace) and the OpenCL runtime clinfo reads the P580's units from.
LAB_TINY_LACKS = {
    "VCA node agent running": "no agent named",
    "Iris Pro P580 with 72 compute units": "clinfo compute units: none",
}


def card_verdict(host, image):
    """On the lab host: the disk image's own /etc and /usr/local/sbin copied out, its boot units ordered
    before its verifier run against a card-shaped tree at the kernel's defaults, then its verifier
    (lab/sim/vcasim/card.py); the verifier's summary."""
    work = host.check_output("mktemp -d /tmp/vca-card-XXXXXX")
    try:
        fs = root_fs(host, image)
        host.check_output(f"mkdir -p {work}/rootfs/usr/local && debugfs -R 'rdump /etc {work}/rootfs' '{fs}'"
                          f" && debugfs -R 'rdump /usr/local/sbin {work}/rootfs/usr/local' '{fs}'")
        return json.loads(host.check_output(f"PYTHONPATH=/opt/vcasim python3 -m vcasim.card {work}/rootfs {work}/card"))
    finally:
        host.run(f"rm -rf {work}")


def test_the_built_image_passes_its_hardware_checks_on_a_card_shaped_tree(host):
    """(issue 45) The image as built and rolled out sets, at boot, what its verifier's hardware checks
    judge (the governor: the tree boots at powersave); the rollout accepts only a pass on a card."""
    summary = card_verdict(host, f"{STORE}/{link(host, 'good')}/lab-tiny.img")
    assert summary["platform"] == "hardware", summary["platform_evidence"]
    hardware = {r["name"]: r for r in summary["results"] if r["hardware"]}
    assert len(hardware) == 6 and set(LAB_TINY_LACKS) <= set(hardware), sorted(hardware)
    for name, result in hardware.items():
        if name in LAB_TINY_LACKS:
            assert result["status"] == "fail" and LAB_TINY_LACKS[name] in result["detail"], result
        else:
            assert result["status"] == "pass", result
    assert "vca-governor.service" in summary["booted"], summary["booted"]


KEYS = "/var/lib/vcafleet/host-keys"
LAB_SSH = Path("/var/lib/vcafleet-lab") / LAB / "ssh"


def link_ip(name):
    """A node's link address, the name SSH knows it by (as on a card: node n at 172.31.(n+1).1)."""
    return "172.31.%d.1" % (int(name.removeprefix("node")) + 1)


def lab_ssh(name, command, known_hosts=None):
    """ssh to a lab node as Ansible does: the lab's -F config (strict host key checking), through the host."""
    argv = ["ssh", "-F", str(LAB_SSH / "config"), "-o", f"ProxyJump=root@{LAB}-host"]
    if known_hosts:
        argv += ["-o", f"UserKnownHostsFile={known_hosts}"]
    return subprocess.run([*argv, f"root@{link_ip(name)}", command], capture_output=True, text=True, timeout=60,
                          check=False)


def disk_stat(host, image, path):
    """(mode, uid, gid) of a file inside a disk image's partition 2."""
    out = host.check_output(f"debugfs -R 'stat {path}' '{root_fs(host, image)}' 2>/dev/null")
    mode = int(out.split("Mode:", 1)[1].split()[0], 8)
    fields = out.split("User:", 1)[1].split()
    return mode, int(fields[0]), int(fields[2])


def test_reimaged_nodes_are_reached_over_ssh_with_their_stored_host_key(host, tmp_path):
    known = (LAB_SSH / "known_hosts").read_text()
    for name in ("node0", "node1"):
        store = f"{KEYS}/vca-{name}/ssh_host_ed25519_key"
        assert oct(host.file(store).mode) == "0o600" and oct(host.file(f"{KEYS}/vca-{name}").mode) == "0o700"
        stored = host.file(store + ".pub").content_string.split()[:2]
        # the container took the disk's host key, and the controller's known_hosts has that one
        assert node(name).file("/etc/ssh/ssh_host_ed25519_key.pub").content_string.split()[:2] == stored
        assert f"{link_ip(name)} {' '.join(stored)}" in known
        done = lab_ssh(name, "cat /etc/hostname")
        assert done.returncode == 0 and done.stdout.strip() == f"vca-{name}", done.stderr
        # the disk admits the fleet as the admin user, with the modes and owner sshd's StrictModes wants
        disk = f"{DISKS}/vca-{name}.img"
        uid = int(disk_file(host, disk, "/etc/passwd").split("vcaadmin:x:", 1)[1].split(":")[0])
        assert disk_stat(host, disk, "/home/vcaadmin/.ssh") == (0o700, uid, uid)
        assert disk_stat(host, disk, "/home/vcaadmin/.ssh/authorized_keys") == (0o600, uid, uid)
        assert disk_file(host, disk, "/home/vcaadmin/.ssh/authorized_keys") == \
            (LAB_SSH / "id_ed25519.pub").read_text().strip()
    # the check is real: with node 0 listed under another key, the login is refused
    wrong = tmp_path / "known_hosts"
    other = host.file(f"{KEYS}/vca-node1/ssh_host_ed25519_key.pub").content_string.split()[:2]
    wrong.write_text("".join(line + "\n" for line in known.splitlines() if not line.startswith("172.31.1.1 "))
                     + f"172.31.1.1 {' '.join(other)}\n")
    refused = lab_ssh("node0", "true", known_hosts=wrong)
    assert refused.returncode != 0 and "host key" in refused.stderr.lower(), refused.stderr


def test_a_failed_evidence_image_check_puts_the_chosen_node_back_on_its_kept_disk(host, tmp_path):
    """(issue 29) verify-hardware's image checks, made to run on the lab (where they fail), roll the chosen
    node back to the disk it kept from before its rollout and boot it; the bundle records both, and no
    other node is touched. The kept disk is a copy of node 1's own, its record marked, to tell it apart."""
    good = link(host, "good")
    state = sim_state(host)
    host.check_output(f"cp --sparse=always {DISKS}/vca-node1.img {DISKS}/vca-node1.prev.img")
    kept = dict(json.loads(host.file(f"{DISKS}/vca-node1.json").content_string), kept_by="the evidence test")
    host.check_output(f"printf %s {shlex.quote(json.dumps(kept))} > {DISKS}/vca-node1.prev.json")
    # lab-tiny builds no volatile artefact: a small FAT volume stands in (the simulated vcactl boots any file)
    record_path = f"{STORE}/good/lab-tiny.json"
    record = host.file(record_path).content_string
    volatile = dict(json.loads(record))
    volatile.setdefault("boot", {})["volatile_cmdline"] = "console=ttyS0 vca-lab-volatile"
    host.check_output(f"mkfs.vfat -C {STORE}/good/lab-tiny.volatile.img 2048 && "
                      f"printf %s {shlex.quote(json.dumps(volatile))} > {record_path}")
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    inventory = Path(env["MOLECULE_INVENTORY_FILE"]).parent
    try:
        run = subprocess.run(
            ["ansible-playbook", "-i", str(inventory), str(PROJECT / "playbooks/verify-hardware.yml"),
             "--tags", "image", "-e", "vca_evidence_node=vca-node1", "-e", f"vca_evidence_dir={tmp_path}/bundle",
             "-e", json.dumps({"vca_evidence_image_platforms": ["hardware", "lab"]})],
            capture_output=True, text=True, env=env, timeout=900, check=False, cwd=PROJECT)
    finally:
        host.check_output(f"printf %s {shlex.quote(record)} > {record_path}"
                          f" && rm -f {STORE}/good/lab-tiny.volatile.img")
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert f"vca-node1: rolled back to build {good} and booted it" in out, out[-3000:]
    checks = {c["name"]: c for c in json.loads((tmp_path / "bundle/bundle.json").read_text())["checks"]}
    assert checks["image_root_partuuid"]["result"] == "fail", checks["image_root_partuuid"]
    # the volatile copy was booted (the lab's root is no tmpfs, so it fails), its private copy removed
    assert checks["image_volatile_boot"]["result"] == "fail", checks["image_volatile_boot"]
    assert "^tmpfs$" in checks["image_volatile_boot"]["reason"], checks["image_volatile_boot"]
    assert "vcactl boot 0 1 FILE" in checks["image_volatile_boot"]["command"]
    assert host.check_output("ls -d /tmp/vca-volatile-* 2>/dev/null || true") == ""
    assert checks["image_rollback"]["result"] == "pass", checks["image_rollback"]
    assert checks["image_rollback"]["host"] == "vca-node1"
    # node 1: on the kept disk now, booted again through the simulated vcactl; nothing kept any more
    assert json.loads(host.file(f"{DISKS}/vca-node1.json").content_string).get("kept_by") == "the evidence test"
    assert not host.file(f"{DISKS}/vca-node1.prev.img").exists
    after = sim_state(host)
    assert after["0:1"]["since"] != state["0:1"]["since"] and booted("node1") == good
    assert after["0:0"]["since"] == state["0:0"]["since"], "a node other than the chosen one was touched"


def test_broken_build_is_rolled_back(host):
    good = link(host, "good")
    node1_since = sim_state(host)["0:1"]["since"]
    env = dict(os.environ)
    inventory = Path(env["MOLECULE_INVENTORY_FILE"]).parent
    broken = SCENARIO / "profiles" / "lab-tiny-broken.yml"
    run = subprocess.run(
        ["ansible-playbook", "-i", str(inventory), str(SCENARIO / "converge.yml"),
         "-e", "node_image_profile=lab-tiny-broken",
         "-e", json.dumps({"node_image_extra_profiles": [str(broken)]})],
        capture_output=True, text=True, env=env, timeout=900, check=False)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-3000:]
    assert "vca-node0 failed build" in out and "free memory above the floor" in out, out[-3000:]
    assert f"Rolled back to build {good} and booted it" in out, out[-3000:]

    broken_id = link(host, "candidate")
    assert broken_id and broken_id != good
    assert host.file(f"{STORE}/{broken_id}/lab-tiny-broken.img").exists
    # not promoted: the good build and its image are kept for the fleet
    assert link(host, "good") == good, "a build that failed a node was promoted"
    assert host.file(f"{STORE}/{good}/lab-tiny.img").exists
    # node 0: back on the good build, booted from it, its failed disk gone
    assert json.loads(host.file(f"{DISKS}/vca-node0.json").content_string)["build_id"] == good
    assert booted("node0") == good
    assert not host.file(f"{DISKS}/vca-node0.prev.img").exists
    # node 1: never shut down, its disk untouched
    state = sim_state(host)
    assert state["0:1"]["since"] == node1_since, "the rollout went on past the failed node"
    assert json.loads(host.file(f"{DISKS}/vca-node1.json").content_string)["build_id"] == good
    assert booted("node1") == good


def rollback_playbook(nodes):
    env = dict(os.environ, ANSIBLE_NOCOLOR="1")
    inventory = Path(env["MOLECULE_INVENTORY_FILE"]).parent
    run = subprocess.run(["ansible-playbook", "-i", str(inventory), str(PROJECT / "playbooks/rollback.yml"),
                          "-e", f"nodes={nodes}"],
                         capture_output=True, text=True, env=env, timeout=900, check=False, cwd=PROJECT)
    return run.returncode, run.stdout + run.stderr


def test_rollback_playbook_puts_a_node_back_on_its_kept_disk(host):
    """(issue 45) playbooks/rollback.yml, as docs/SETUP.md's recovery runs it: the named node shut down,
    its kept disk (a copy of its own, its record marked, to tell it apart) put back and booted; a node
    with no kept disk is named and left as it is; no other node is touched."""
    good = link(host, "good")
    state = sim_state(host)
    host.check_output(f"cp --sparse=always {DISKS}/vca-node1.img {DISKS}/vca-node1.prev.img")
    kept = dict(json.loads(host.file(f"{DISKS}/vca-node1.json").content_string), kept_by="the rollback test")
    host.check_output(f"printf %s {shlex.quote(json.dumps(kept))} > {DISKS}/vca-node1.prev.json")
    rc, out = rollback_playbook("vca-node1")
    assert rc == 0, out[-3000:]
    assert f"vca-node1: rolled back to build {good} and booted it" in out, out[-3000:]
    assert json.loads(host.file(f"{DISKS}/vca-node1.json").content_string).get("kept_by") == "the rollback test"
    assert not host.file(f"{DISKS}/vca-node1.prev.img").exists
    after = sim_state(host)
    assert after["0:1"]["since"] != state["0:1"]["since"] and booted("node1") == good
    assert after["0:0"]["since"] == state["0:0"]["since"], "a node other than the named one was touched"

    rc, out = rollback_playbook("vca-node0")
    assert rc != 0 and "vca-node0: not rolled back" in out, out[-3000:]
    assert sim_state(host)["0:0"]["since"] == state["0:0"]["since"], "a node with no kept disk was shut down"
