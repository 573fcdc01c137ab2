"""Access to a node built by vca-image: the profile users' keys in the image (owned by the user, as
sshd wants them), the image's SSH and sudo policy, the overlay writer run as a plain script, and
the boot test's ssh path (QEMU's forward, a known_hosts of the one expected key, the verifier's
plain TAP), with QEMU and the guest's sshd stood in for."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT
from vca_image import boottest, build, cli
from vca_image.boottest import known_hosts_line, parse_tap, tap_problems
from vca_image.build import configure, user_hooks
from vca_image.profile import load

PROFILES = ROOT / "image_builder" / "profiles"
OVERLAY = ROOT / "image_builder" / "overlays" / "node"
UID, GID = 1234, 1235          # vcaadmin in the fake tree's etc/passwd: not this machine's
FLEET_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFleetKeyOfTheTest fleet@host"


def tree_with_accounts(rootfs):
    (rootfs / "boot").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (rootfs / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n"
                                       "vcaadmin:x:%d:%d::/home/vcaadmin:/bin/bash\n" % (UID, GID))
    (rootfs / "home/vcaadmin").mkdir(parents=True)
    os.chown(rootfs / "home/vcaadmin", UID, GID)
    (rootfs / "root").mkdir(mode=0o700)
    return rootfs


def owner_mode(path):
    st = path.lstat()
    return st.st_uid, st.st_gid, "%04o" % (st.st_mode & 0o7777)


def test_profile_keys_belong_to_the_user_in_a_0700_ssh_dir_and_roots_go_to_root(tmp_path):
    profile = load("debian-12", PROFILES)
    profile["users"] = [{"name": "vcaadmin", "groups": ["sudo"], "authorized_keys": [FLEET_KEY + "  "]},
                        {"name": "root", "authorized_keys": [FLEET_KEY]}]
    rootfs = tree_with_accounts(tmp_path / "rootfs")
    configure(profile, rootfs, ROOT / "image_builder", [])
    home = rootfs / "home/vcaadmin"
    assert owner_mode(home / ".ssh") == (UID, GID, "0700")
    assert owner_mode(home / ".ssh/authorized_keys") == (UID, GID, "0600")
    assert (home / ".ssh/authorized_keys").read_text() == FLEET_KEY + "\n"
    assert owner_mode(rootfs / "root/.ssh") == (0, 0, "0700")
    assert owner_mode(rootfs / "root/.ssh/authorized_keys") == (0, 0, "0600")
    # root is in every tree: listed for its keys, never added with useradd
    assert len(user_hooks(profile)) == 1 and "vcaadmin" in user_hooks(profile)[0]


def test_a_user_with_keys_missing_from_the_images_passwd_stops_the_build(tmp_path):
    profile = load("debian-12", PROFILES)
    profile["users"] = [{"name": "fleetop", "authorized_keys": [FLEET_KEY]}]
    with pytest.raises(SystemExit, match="user fleetop has authorized_keys but is not in the image's /etc/passwd"):
        configure(profile, tree_with_accounts(tmp_path / "rootfs"), ROOT / "image_builder", [])


def test_the_image_takes_keys_only_and_one_ed25519_host_key_and_its_admins_sudo_without_a_password(tmp_path):
    rootfs = tree_with_accounts(tmp_path / "rootfs")
    configure(load("debian-12", PROFILES), rootfs, ROOT / "image_builder", [])
    policy = (rootfs / "etc/ssh/sshd_config.d/50-vca-node.conf").read_text()
    settings = [line.split(None, 1) for line in policy.splitlines() if line.strip() and not line.startswith("#")]
    assert settings == [["PasswordAuthentication", "no"], ["KbdInteractiveAuthentication", "no"],
                        ["PermitRootLogin", "prohibit-password"], ["HostKey", "/etc/ssh/ssh_host_ed25519_key"]]
    unit = (rootfs / "etc/systemd/system/vca-ssh-hostkeys.service").read_text()
    assert "ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key\n" in unit     # the overlay's key is kept
    assert re.findall(r"^ExecStart=(.*)$", unit, re.M) == [
        '/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key']
    # the verifier wants the one key the policy names
    verifier = (rootfs / "usr/local/sbin/vca-node-verify").read_text()
    assert re.findall(r"/etc/ssh/ssh_host_\w+_key", verifier) == ["/etc/ssh/ssh_host_ed25519_key"]
    sudoers = rootfs / "etc/sudoers.d/vca-node"
    assert "%sudo ALL=(ALL:ALL) NOPASSWD: ALL\n" in sudoers.read_text()
    assert owner_mode(sudoers) == (0, 0, "0440") and owner_mode(rootfs / "etc/sudoers.d")[2] == "0750"
    assert load("debian-12", PROFILES)["users"][0]["groups"] == ["sudo"]     # the admin the boot test logs in as


def test_the_overlay_script_writes_with_the_modules_writer_on_the_standard_library_alone(tmp_path):
    rootfs = tree_with_accounts(tmp_path / "rootfs")
    (rootfs / "etc/group").write_text("root:x:0:\nvcaadmin:x:%d:\n" % GID)
    profile = {"name": "tiny", "image": {"size_mib": 64, "fs_uuid": "2d1bd8b4-7c1e-4f5a-9a63-0c5f0e0a2b01",
                                         "hash_seed": "6a1f3c52-9b0e-4d27-8e44-3f1d2c7b9a10", "source_date_epoch": 0}}
    disk = build.make_disk(profile, rootfs, tmp_path)
    (tmp_path / "fleet.pub").write_text(FLEET_KEY + "\n")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "/home/vcaadmin/.ssh": {"state": "directory", "mode": "0700", "owner": "vcaadmin", "group": "vcaadmin"},
        "/home/vcaadmin/.ssh/authorized_keys": {"src": str(tmp_path / "fleet.pub"), "mode": "0600",
                                                "owner": "vcaadmin", "group": "vcaadmin"}}))
    script = ROOT / "scripts/node-disk-overlay.py"
    # -I -S: no site-packages, no PYTHONPATH: the writer must need nothing beyond the standard library
    done = subprocess.run([sys.executable, "-I", "-S", str(script), str(disk), str(spec)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "2 entries written into %s" % disk in done.stdout
    offset = "%s?offset=%d" % (disk, build.ROOT_START * build.SECTOR)
    stat = subprocess.run(["debugfs", "-R", "stat /home/vcaadmin/.ssh/authorized_keys", offset],
                          capture_output=True, text=True, check=True).stdout
    assert re.search(r"Mode:\s+0600", stat) and re.search(r"User:\s+%d\s+Group:\s+%d" % (UID, GID), stat)
    spec.write_text(json.dumps({"/home/vcaadmin/.ssh": {"state": "directory", "owner": "nobody"}}))
    done = subprocess.run([sys.executable, "-I", "-S", str(script), str(disk), str(spec)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 1
    assert "node-disk-overlay: overlay /home/vcaadmin/.ssh: owner nobody is not in /etc/passwd" in done.stderr


# The verifier's own output (plain TAP, as ssh brings it back): no VCA hardware, so its hardware check skips.
TAP = """\
TAP version 13
1..4
ok 1 - kernel version is the image's # running 6.1.0-41-amd64, image has 6.1.0-41-amd64
ok 2 - VCA modules loaded # SKIP not a VCA node: CPU 'QEMU Virtual CPU' is no Xeon E3-1585L v5
ok 3 - sshd host key present # /etc/ssh/ssh_host_ed25519_key
ok 4 - no failed systemd units # none
# summary {"total": 4, "pass": 3, "fail": 0, "skip": 1, "hardware": false}
"""


def test_plain_tap_from_ssh_parses_and_kmsg_lines_need_their_prefix():
    plan, results = parse_tap(TAP, prefix=None)
    assert plan == 4 and [r["status"] for r in results] == ["pass", "skip", "pass", "pass"]
    assert results[2] == {"n": 3, "name": "sshd host key present", "status": "pass",
                          "detail": "/etc/ssh/ssh_host_ed25519_key"}
    assert tap_problems(plan, results, "from ssh") == []
    assert parse_tap(TAP) == (None, [])          # on the console only the verifier's kmsg lines count
    assert tap_problems(*parse_tap("sudo: a password is required\n", prefix=None), "from ssh") == [
        "no TAP plan (1..N) from ssh; 0 checks came"]


def keypair(directory, name, kind="ed25519"):
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", name, "-f", str(directory / name)], check=True)
    return directory / name, directory / (name + ".pub")


def test_the_known_hosts_line_is_the_one_openssh_looks_up_for_the_forward(tmp_path):
    _, pub = keypair(tmp_path, "host")
    known = tmp_path / "known_hosts"
    known.write_text(known_hosts_line(40022, pub.read_text()))
    assert known.read_text() == "[127.0.0.1]:40022 %s\n" % " ".join(pub.read_text().split()[:2])
    found = subprocess.run(["ssh-keygen", "-F", "[127.0.0.1]:40022", "-f", str(known)], capture_output=True,
                           text=True, check=False)
    assert found.returncode == 0 and pub.read_text().split()[1] in found.stdout
    for other in ("[127.0.0.1]:40023", "127.0.0.1", "[localhost]:40022"):
        assert subprocess.run(["ssh-keygen", "-F", other, "-f", str(known)], capture_output=True,
                              check=False).returncode != 0, other
    _, ecdsa = keypair(tmp_path, "old", "ecdsa")
    with pytest.raises(SystemExit, match="no ssh-ed25519 public key"):
        known_hosts_line(40022, ecdsa.read_text())


class FakeGuest:
    """QEMU (Popen) and the guest's sshd behind its forward (ssh, through subprocess.run): the
    guest's host key is host_pub; ssh succeeds only when its known_hosts names that key for
    [127.0.0.1]:PORT, PORT being the one QEMU forwards, unless strict is False (an ssh that would
    log in whatever the key). Every other command (cp, sfdisk, mcopy, ssh-keygen) runs for real."""

    def __init__(self, host_pub, *, verifier=TAP, strict=True, powers_off=True, sudo_rc=0, sudo_err=""):
        self.host_key = host_pub.read_text().split()[1]
        self.verifier, self.strict, self.powers_off = verifier, strict, powers_off
        self.sudo_rc, self.sudo_err = sudo_rc, sudo_err
        self.ssh_calls, self.commands, self.qemu, self.off, self.env = [], [], None, False, None
        self.user, self.overlay = None, None
        self.real, self.real_popen = subprocess.run, subprocess.Popen

    def privileged(self, command):
        """root needs no sudo (and a node whose only fleet user is root may have none to use)."""
        return command if self.user == "root" else "sudo -n " + command

    def popen(self, cmd, **kw):
        if not cmd[0].endswith("qemu-system-x86_64"):      # subprocess.run's own Popen
            return self.real_popen(cmd, **kw)
        self.qemu = cmd
        disk = next(a for a in cmd if a.startswith("if=none,id=disk0,")).split("file=", 1)[1]
        self.disk = disk
        fat = "%s@@%d" % (disk, boottest.esp_offset(disk))
        mtools = dict(os.environ, MTOOLS_SKIP_CHECK="1", MTOOLSRC=os.devnull)
        self.env = self.real(["mtype", "-i", fat, "::/" + build.CMDLINE_ENV], capture_output=True, check=True,
                             env=mtools).stdout
        overlay = self.real(["mtype", "-i", fat, "::/" + build.VOLATILE_OVERLAY], capture_output=True, env=mtools,
                            check=False)
        self.overlay = overlay.stdout if overlay.returncode == 0 else None
        return self

    def poll(self):
        return 0 if self.off else None

    returncode = property(poll)

    def wait(self, timeout=None):
        if not self.off:
            raise subprocess.TimeoutExpired(self.qemu, timeout)
        return 0

    def kill(self):
        self.off = True

    def run(self, cmd, **kw):
        if cmd[0] != "ssh":
            return self.real(cmd, **kw)
        self.ssh_calls.append(cmd)
        self.user = cmd[-2].split("@")[0]
        port = int(cmd[cmd.index("-p") + 1])
        forwarded = re.search(r"hostfwd=tcp:127\.0\.0\.1:(\d+)-:22", " ".join(self.qemu)).group(1)
        known = next(o.split("=", 1)[1] for o in cmd if o.startswith("UserKnownHostsFile="))
        entries = [line.split() for line in open(known).read().splitlines()]
        trusted = ["[127.0.0.1]:%d" % port, "ssh-ed25519", self.host_key] in entries and port == int(forwarded)
        if self.strict and not trusted:
            return subprocess.CompletedProcess(cmd, 255, "", "Host key for [127.0.0.1]:%d has changed and you have "
                                                             "requested strict checking.\nHost key verification "
                                                             "failed.\n" % port)
        command = cmd[-1]
        self.commands.append(command)
        if command == self.privileged("systemctl poweroff"):
            self.off = self.powers_off
            return subprocess.CompletedProcess(cmd, 255, "", "Connection closed by remote host\n")
        if command == self.privileged(boottest.VERIFY):
            return subprocess.CompletedProcess(cmd, self.sudo_rc, self.verifier if not self.sudo_rc else "",
                                               self.sudo_err)
        if command == "systemctl is-system-running --wait":
            return subprocess.CompletedProcess(cmd, 0, "running\n", "")
        return subprocess.CompletedProcess(cmd, 0, "", "")


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A build directory with a real (tiny) disk, a node's copy of it, keys, stand-in OVMF files."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/hostname").write_text("vca-node\n")
    out = tmp_path / "out"
    out.mkdir()
    profile = {"name": "tiny", "image": {"size_mib": 64, "fs_uuid": "5b0f2a9e-3c41-4d8e-9f17-2a6c8e4d1b73",
                                         "hash_seed": "0e7d4c21-8a3b-4f56-b9d2-7c1e5a3f9b08",
                                         "source_date_epoch": 1767225600}}
    disk = build.make_disk(profile, rootfs, out)
    (out / "tiny.json").write_text(json.dumps({"build_id": "0123456789abcdef", "image": disk.name,
                                               "sha256": build.sha256(disk)}))
    copy = tmp_path / "node.img"
    shutil.copyfile(disk, copy)
    keys = tmp_path / "keys"
    keys.mkdir()
    code, nvram = tmp_path / "OVMF_CODE_4M.fd", tmp_path / "OVMF_VARS_4M.fd"
    code.write_bytes(b"code")
    nvram.write_bytes(b"vars")
    monkeypatch.setattr(boottest, "OVMF", [(str(code), str(nvram))])
    monkeypatch.setattr(boottest.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(boottest, "ssh_banner", lambda port, timeout=5.0: "SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u6")
    monkeypatch.setattr(boottest.time, "sleep", lambda s: None)
    return {"out": out, "copy": copy, "fleet": keypair(keys, "fleet")[0], "host": keypair(keys, "host")[1],
            "other": keypair(keys, "other")[1], "disk": disk}


def boot_test(node, guest, monkeypatch, host_key=None, *extra):
    monkeypatch.setattr(boottest.subprocess, "Popen", guest.popen)
    monkeypatch.setattr(boottest.subprocess, "run", guest.run)
    return cli.main(["boot-test", str(node["out"]), "--image", str(node["copy"]), "--ssh-key", str(node["fleet"]),
                     "--host-key", str(host_key or node["host"]), "--timeout", "5", *extra])


def test_the_ssh_boot_logs_in_expecting_the_nodes_host_key_and_runs_the_verifier(node, monkeypatch, capsys):
    guest = FakeGuest(node["host"])
    assert boot_test(node, guest, monkeypatch) == 0
    printed = capsys.readouterr().out
    assert "4 of 4 checks, 3 pass, 0 fail, 1 skip" in printed
    assert "a login expecting another host key: refused" in printed
    assert re.search(r"sshd answered after \d+ s, login as vcaadmin after \d+ s, boot finished \(running\) after "
                     r"\d+ s, verifier done after \d+ s, powered off after \d+ s", printed), printed
    netdev = guest.qemu[guest.qemu.index("-netdev") + 1]
    assert re.fullmatch(r"user,id=n0,hostfwd=tcp:127\.0\.0\.1:\d+-:22", netdev)
    # the node's copy is booted (copied once more for the command line), vca.boottest left out
    assert guest.disk not in (str(node["copy"]), str(node["disk"]))
    assert b"\nvca_cmdline_extra=%s\n" % boottest.SSH_BOOTTEST_ARGS.encode() in guest.env
    assert "vca.boottest" not in boottest.SSH_BOOTTEST_ARGS and "vca.host=10.0.2.2" in boottest.SSH_BOOTTEST_ARGS
    for cmd in guest.ssh_calls:
        assert {"StrictHostKeyChecking=yes", "BatchMode=yes", "IdentitiesOnly=yes",
                "GlobalKnownHostsFile=/dev/null"} <= set(cmd)
        assert cmd[cmd.index("-i") + 1] == str(node["fleet"]) and cmd[-2] == "vcaadmin@127.0.0.1"
    assert guest.commands == ["true", "systemctl is-system-running --wait", "sudo -n /usr/local/sbin/vca-node-verify",
                              "sudo -n systemctl poweroff"]
    assert build.sha256(node["disk"]) == json.loads((node["out"] / "tiny.json").read_text())["sha256"]
    assert not (node["out"] / "boot-test").exists()


def test_a_node_with_another_host_key_fails_at_once_and_is_never_logged_in_to(node, monkeypatch, capsys):
    guest = FakeGuest(node["other"])
    assert boot_test(node, guest, monkeypatch) == 1
    err = capsys.readouterr().err
    assert "boot test failed: the guest's host key is not the expected one: Host key verification failed." in err
    assert guest.commands == [] and len(guest.ssh_calls) == 1     # no retry, no verifier, no sudo


def test_an_ssh_that_logs_in_whatever_the_host_key_fails_the_test(node, monkeypatch, capsys):
    assert boot_test(node, FakeGuest(node["host"], strict=False), monkeypatch) == 1
    captured = capsys.readouterr()
    assert "a login expecting another host key: NOT refused" in captured.out
    assert "boot test failed: a login that expected another host key was not refused (exit 0)" in captured.err


@pytest.mark.parametrize("guest_args, message", [
    ({"sudo_rc": 1, "sudo_err": "sudo: a password is required\n"}, "no TAP plan (1..N) from ssh; 0 checks came"),
    ({"verifier": TAP.replace("ok 4 - no failed", "not ok 4 - no failed")}, "not ok: 4 no failed systemd units"),
    ({"verifier": TAP.replace("1..4", "1..5")}, "5 checks planned, 4 came"),
    ({"powers_off": False}, "the guest did not power off before the boot test's time ran out"),
    ({"sudo_rc": 255, "sudo_err": "Connection to 127.0.0.1 closed by remote host.\n"},
     "sudo -n /usr/local/sbin/vca-node-verify over ssh: exit 255: Connection to 127.0.0.1 closed by remote host."),
], ids=["no-passwordless-sudo", "a-check-fails", "cut-short", "no-poweroff", "ssh-dropped"])
def test_what_fails_the_ssh_boot_test(node, monkeypatch, capsys, guest_args, message):
    assert boot_test(node, FakeGuest(node["host"], **guest_args), monkeypatch) == 1
    assert "boot test failed: %s" % message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--ssh-key", "k"], "--ssh-key and --host-key go together"),
    (["--ssh-key", "k", "--host-key", "h.pub", "--volatile"],
     "--ssh-key with --volatile needs the node's overlay (its host key, the fleet's key): --overlay"),
    (["--overlay", "o.cpio"], "--overlay is for --volatile"),
    (["--volatile", "--overlay", "/nonexistent/o.cpio"], "--overlay /nonexistent/o.cpio: no such file"),
])
def test_ssh_options_that_cannot_work_are_refused(tmp_path, capsys, argv, message):
    assert cli.main(["boot-test", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def volatile_node(node, tmp_path):
    """node's build with a (tiny) volatile image beside the disk, and a root-owned overlay for it."""
    out = node["out"]
    rootfs = tmp_path / "vroot"
    (rootfs / "boot").mkdir(parents=True)
    (rootfs / "boot/vmlinuz-6.1.0-41-amd64").write_text("kernel\n")
    image, _, _ = build.make_volatile({"name": "tiny", "image": {"fs_uuid": "5b0f2a9e-3c41-4d8e-9f17-2a6c8e4d1b73",
                                                                 "source_date_epoch": 1767225600}}, rootfs, out)
    record = json.loads((out / "tiny.json").read_text())
    record.update(volatile=image.name, volatile_sha256=build.sha256(image), volatile_root_mib=1352)
    (out / "tiny.json").write_text(json.dumps(record))
    spec = tmp_path / "overlay.json"
    spec.write_text(json.dumps({"/etc/vca-node.local.conf": "FLEET_USERS=root\n",
                                "/root/.ssh": {"state": "directory", "mode": "0700"},
                                "/root/.ssh/authorized_keys": {"src": str(node["fleet"]) + ".pub", "mode": "0600"}}))
    assert cli.main(["overlay-cpio", str(spec), str(tmp_path / "overlay.cpio")]) == 0
    return dict(node, volatile=image, record=record, overlay=tmp_path / "overlay.cpio")


def test_the_volatile_ssh_boot_logs_in_as_root_with_the_overlay_and_needs_no_sudo(volatile_node, monkeypatch,
                                                                                  capsys):
    node = volatile_node
    guest = FakeGuest(node["host"])
    monkeypatch.setattr(boottest.subprocess, "Popen", guest.popen)
    monkeypatch.setattr(boottest.subprocess, "run", guest.run)
    assert cli.main(["boot-test", str(node["out"]), "--volatile", "--overlay", str(node["overlay"]), "--ssh-key",
                     str(node["fleet"]), "--host-key", str(node["host"]), "--user", "root", "--timeout", "5"]) == 0
    printed = capsys.readouterr().out
    assert "booting the volatile image under OVMF with" in printed and "login as root after" in printed
    assert "a login expecting another host key: refused" in printed
    assert not {"-kernel", "-initrd", "-append"} & set(guest.qemu)
    assert guest.disk.endswith("/boot-test/tiny.volatile.img") and guest.overlay == node["overlay"].read_bytes()
    assert guest.commands == ["true", "systemctl is-system-running --wait", boottest.VERIFY, "systemctl poweroff"]
    assert all(cmd[-2] == "root@127.0.0.1" for cmd in guest.ssh_calls)
    assert build.sha256(node["volatile"]) == node["record"]["volatile_sha256"]


def test_a_volatile_node_copy_that_carries_its_overlay_boots_without_one_given(volatile_node, monkeypatch, tmp_path,
                                                                               capsys):
    node = volatile_node
    copy = tmp_path / "node.volatile.img"
    shutil.copyfile(node["volatile"], copy)
    assert cli.main(["boot-test", str(node["out"]), "--volatile", "--image", str(copy), "--ssh-key",
                     str(node["fleet"]), "--host-key", str(node["host"]), "--user", "root", "--timeout", "5"]) == 2
    assert "needs the node's overlay" in capsys.readouterr().err
    subprocess.run(["mcopy", "-i", str(copy), str(node["overlay"]), "::/" + build.VOLATILE_OVERLAY], check=True,
                   env=dict(os.environ, MTOOLS_SKIP_CHECK="1", MTOOLSRC=os.devnull))
    guest = FakeGuest(node["host"])
    monkeypatch.setattr(boottest.subprocess, "Popen", guest.popen)
    monkeypatch.setattr(boottest.subprocess, "run", guest.run)
    assert cli.main(["boot-test", str(node["out"]), "--volatile", "--image", str(copy), "--ssh-key",
                     str(node["fleet"]), "--host-key", str(node["host"]), "--user", "root", "--timeout", "5"]) == 0
    assert guest.overlay == node["overlay"].read_bytes() and guest.disk != str(copy)
