"""Boot a built image under QEMU (software emulation is enough) and read the verifier's TAP.

Both artefacts boot as a card boots them: UEFI firmware (OVMF) loads GRUB from the
removable-media path, and GRUB the kernel and initramfs its grub.cfg names. No
-kernel/-initrd. The blockio disk: GRUB from its EFI system partition, the root on
partition 2. The volatile image: the bare FAT32 volume `vcactl boot` loads, given to
OVMF as a disk (on a card the BIOS boots it from RAM), GRUB from the whole volume, the
root unpacked into tmpfs from the initramfs on it. The boot test's own kernel arguments
(BOOTTEST_ARGS) reach the kernel through a GRUB environment block (build.CMDLINE_ENV)
written with mtools into a throwaway copy, and so does a volatile boot's per-node overlay
(build.VOLATILE_OVERLAY, a newc cpio), so the built image is never changed.

Two ways to read the verifier:
- kmsg (no ssh key given): the image's vca-boottest.service runs vca-node-verify
  --kmsg when the kernel command line says vca.boottest, then powers off; QEMU
  runs with -no-reboot. The TAP lines come back on the serial console as kernel
  messages.
- ssh (boot_ssh()): QEMU forwards a free loopback port to the guest's port 22;
  the test logs in with the fleet's key (as the admin user, or root on a volatile
  node whose overlay authorizes root), accepting only the host key it was given
  (StrictHostKeyChecking, a known_hosts of that one key), runs vca-node-verify
  (with sudo, unless it is root) and reads its TAP from ssh's stdout, then powers
  the node off. Its command line has no vca.boottest (SSH_BOOTTEST_ARGS), so
  vca-boottest.service stays off. In the same boot it tries one login that expects
  another host key, which must fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from . import build

KMSG_PREFIX = "vca-node-verify: "     # what vca-node-verify --kmsg puts before each line in the kernel log
PLAN = re.compile(r"^1\.\.(\d+)$")
RESULT = re.compile(r"^(ok|not ok) (\d+) - (.*?)(?: # (SKIP)? ?(.*))?$")
# What the boot test adds to the image's own command line (grub.cfg has root=, net.ifnames=0).
# printk.devkmsg=on: devkmsg's default rate limit (10 lines per 5 s) drops most of the verifier's lines.
BOOTTEST_ARGS = "vca.boottest vca.host=10.0.2.2 printk.devkmsg=on panic=-1 console=ttyS0"
# The same over ssh, without vca.boottest (its service would power the node off before the login).
# vca.host names QEMU's gateway, the host, to the verifier's route checks.
SSH_BOOTTEST_ARGS = "vca.host=10.0.2.2 panic=-1 console=ttyS0"
VERIFY = "/usr/local/sbin/vca-node-verify"
# Debian's ovmf: UEFI for x86_64 without Secure Boot or SMM (its QEMU descriptor
# 60-edk2-x86_64.json names the 4M pair); the code read-only, a copy of the variable store writable.
OVMF = [("/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"),
        ("/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd")]


def parse_tap(text, prefix=KMSG_PREFIX):
    """The verifier's plan (None when no 1..N came) and its results: from the console text, where
    each line of the verifier's carries prefix after the kernel's time stamp, or (prefix None) from
    the verifier's own output, plain TAP, as ssh brings it back."""
    plan, results = None, []
    for line in text.splitlines():
        if prefix is None:
            tap = line.strip()
        else:
            at = line.find(prefix)
            if at < 0:
                continue
            tap = line[at + len(prefix):].strip()
        if p := PLAN.match(tap):
            plan = int(p.group(1))
        elif r := RESULT.match(tap):
            results.append({"n": int(r.group(2)), "name": r.group(3), "status":
                            "fail" if r.group(1) == "not ok" else ("skip" if r.group(4) else "pass"),
                            "detail": r.group(5) or ""})
    return plan, results


def tap_problems(plan, results, where="on the console"):
    """Why the verifier's output fails the boot test, one line each; [] when it passes."""
    problems = []
    if plan is None:
        problems.append("no TAP plan (1..N) %s; %d checks came" % (where, len(results)))
    elif len(results) != plan:
        problems.append("%d checks planned, %d came" % (plan, len(results)))
    failed = [r for r in results if r["status"] == "fail"]
    if failed:
        problems.append("not ok: %s" % ", ".join("%d %s" % (r["n"], r["name"]) for r in failed))
    return problems


def ovmf():
    """(code, vars template) of the first OVMF pair installed; SystemExit naming the package when none is."""
    for code, nvram in OVMF:
        if os.path.isfile(code) and os.path.isfile(nvram):
            return code, nvram
    raise SystemExit("vca-image: no OVMF firmware (%s): apt-get install ovmf" % ", ".join(c for c, _ in OVMF))


def grub_env(values):
    """A GRUB environment block (what grub-editenv writes): its signature, NAME=VALUE lines,
    '#' up to 1024 bytes. Values with a newline or backslash are refused (they would need escapes)."""
    body = "# GRUB Environment Block\n"
    for name, value in values.items():
        if "\n" in value or "\\" in value:
            raise ValueError("GRUB environment value %r: no newline or backslash" % value)
        body += "%s=%s\n" % (name, value)
    if len(body) > 1024:
        raise ValueError("GRUB environment block over 1024 bytes")
    return (body + "#" * (1024 - len(body))).encode()


def esp_offset(disk):
    """Byte offset of the FAT file system GRUB boots from: 0 for a superfloppy (a FAT32 boot sector
    at byte 0, no partition table: the volatile image), else partition 1, the disk's EFI system
    partition; SystemExit when it has none."""
    with open(disk, "rb") as fh:
        if build.fat32_clusters(fh.read(512)) is not None:
            return 0
    table = json.loads(subprocess.run(["sfdisk", "--json", str(disk)], check=True, capture_output=True,
                                      text=True).stdout)["partitiontable"]
    parts = table.get("partitions", [])
    if not parts or parts[0]["type"].upper() != build.ESP_TYPE:
        raise SystemExit("vca-image: %s has no EFI system partition (partition 1): it cannot boot from its "
                         "own bootloader; rebuild it" % disk)
    return parts[0]["start"] * build.SECTOR


def fat_has(image, name):
    """True when the FAT GRUB boots from (esp_offset()) holds /name."""
    return subprocess.run(["mdir", "-b", "-i", "%s@@%d" % (image, esp_offset(image)), "::/" + name],
                          capture_output=True, check=False, env=build.mtools_env()).returncode == 0


def boot_copy(image, work, extra_args, overlay=None):
    """A copy of the image (sparse) whose boot FAT carries build.CMDLINE_ENV with vca_cmdline_extra
    = extra_args, and (overlay, a volatile boot) the node's newc overlay as build.VOLATILE_OVERLAY,
    both written by mcopy: the image the boot test boots. The built image stays untouched."""
    work.mkdir(parents=True, exist_ok=True)
    copy = work / Path(image).name
    copy.unlink(missing_ok=True)
    subprocess.run(["cp", "--sparse=always", "--reflink=auto", str(image), str(copy)], check=True)
    env_file = work / "vca-cmdline.env"
    env_file.write_bytes(grub_env({"vca_cmdline_extra": extra_args}))
    fat = "%s@@%d" % (copy, esp_offset(copy))
    files = [(env_file, build.CMDLINE_ENV)] + ([(Path(overlay), build.VOLATILE_OVERLAY)] if overlay else [])
    for local, name in files:
        subprocess.run(["mcopy", "-o", "-i", fat, str(local), "::/" + name], check=True, env=build.mtools_env(),
                       stdout=subprocess.DEVNULL)
    return copy


def build_record(out, volatile=False):
    """The build's record in out (<profile>.json); SystemExit when there is none."""
    records = [json.loads(p.read_text()) for p in sorted(Path(out).glob("*.json"))]
    records = [r for r in records if isinstance(r, dict) and "image" in r]
    if not records:
        raise SystemExit("vca-image: no build record (<profile>.json) in %s" % out)
    if volatile and "volatile" not in records[0]:
        raise SystemExit("vca-image: %s has no volatile image (its profile's formats do not ask for one)" % out)
    return records[0]


def image_of(out, record, image=None, volatile=False):
    """What a boot test boots: image, or the build's disk or (volatile) volatile volume."""
    return Path(image) if image else Path(out) / record["volatile" if volatile else "image"]


def memory_for(record, volatile, image=None):
    """MiB of guest memory: 1536 for the disk. A volatile node holds its whole root in the rootfs
    tmpfs, which the kernel sizes at half the memory it has when it mounts it, the initramfs
    (about the volatile image's size) and the kernel's own (256 MiB) already taken: twice the root
    (the build's volatile_root_mib) with 256 MiB of room (the verifier wants 100 free), plus the
    image and 256, in steps of 256 MiB. 4096 for a build that did not record its root's size."""
    if not volatile:
        return 1536
    root = record.get("volatile_root_mib")
    if not root:
        return 4096
    image_mib = -(-Path(image).stat().st_size // 2**20) if image and Path(image).is_file() else 0
    return -(-(2 * (root + 256) + image_mib + 256) // 256) * 256


def qemu_argv(out, record, image, work, memory_mib, *, args, volatile=False, overlay=None, netdev="user,id=n0"):
    """QEMU's command line: OVMF and a copy of the image (the disk, or the volatile volume) with args
    (and a volatile boot's overlay) on the FAT GRUB boots from, as the one disk."""
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise SystemExit("vca-image: qemu-system-x86_64 is not installed (apt-get install qemu-system-x86)")
    console = out / "boot-console.log"
    console.unlink(missing_ok=True)
    cmd = [qemu, "-machine", "q35", "-m", str(memory_mib), "-smp", "2", "-display", "none", "-no-reboot",
           "-serial", "file:%s" % console]
    # romfile=: no iPXE option ROM, so the firmware does not try a network boot
    net = ["-netdev", netdev, "-device", "virtio-net-pci,netdev=n0,romfile="]
    code, nvram = ovmf()
    disk = boot_copy(image_of(out, record, image, volatile), work, args, overlay)
    variables = work / "OVMF_VARS.fd"
    shutil.copyfile(nvram, variables)
    return [*cmd, "-drive", "if=pflash,format=raw,unit=0,readonly=on,file=%s" % code,
            "-drive", "if=pflash,format=raw,unit=1,file=%s" % variables,
            "-drive", "if=none,id=disk0,format=raw,file=%s" % disk,
            "-device", "virtio-blk-pci,drive=disk0,bootindex=0", *net]


def boot(out, image=None, timeout=600, memory_mib=None, *, volatile=False, overlay=None):
    """Boot out/<image> (or image), or (volatile) the build's volatile volume, from its own GRUB under
    OVMF (a copy of it, with BOOTTEST_ARGS and overlay), and read the verifier's TAP from the
    console; returns (plan, results, seconds, console text)."""
    out = Path(out)
    record = build_record(out, volatile)
    work = out / "boot-test"
    memory_mib = memory_mib or memory_for(record, volatile, image_of(out, record, image, volatile))
    try:
        cmd = qemu_argv(out, record, image, work, memory_mib, args=BOOTTEST_ARGS, volatile=volatile, overlay=overlay)
        start = time.monotonic()
        try:
            subprocess.run(cmd, timeout=timeout, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        except subprocess.TimeoutExpired:
            pass
        seconds = time.monotonic() - start
    finally:
        if work.exists():
            shutil.rmtree(work)
    console = out / "boot-console.log"
    text = console.read_text(errors="replace") if console.exists() else ""
    return (*parse_tap(text), seconds, text)


def free_port():
    """A TCP port on the loopback free now, for QEMU's forward to the guest's sshd."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def known_hosts_line(port, public_key):
    """The one line a known_hosts needs for the guest's sshd behind QEMU's forward: [127.0.0.1]:PORT
    and the expected ed25519 key (public_key: the text of an ssh_host_ed25519_key.pub)."""
    fields = public_key.split()
    if len(fields) < 2 or fields[0] != "ssh-ed25519":
        raise SystemExit("vca-image: the expected host key is no ssh-ed25519 public key: %r"
                         % public_key.strip()[:60])
    return "[127.0.0.1]:%d %s %s\n" % (port, fields[0], fields[1])


def ssh_argv(port, key, known_hosts, user, command):
    """ssh to the guest as user with key, accepting only the host key in known_hosts: no config of
    this machine's (-F /dev/null, no global known_hosts), no agent, no password or prompt."""
    return ["ssh", "-F", "/dev/null", "-p", str(port), "-i", str(key),
            "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=%s" % known_hosts,
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HostKeyAlgorithms=ssh-ed25519",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
            "-o", "ConnectTimeout=20", "%s@127.0.0.1" % user, command]


def ssh_banner(port, timeout=5.0):
    """The guest sshd's banner (SSH-2.0-...) through the forward, or None: QEMU takes the connection
    whether or not the guest listens, so only the banner says that sshd answers."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            data = s.recv(256)
    except OSError:
        return None
    return data.decode(errors="replace").strip() if data.startswith(b"SSH-") else None


HOST_KEY_REFUSED = "Host key verification failed"


def privileged(user, command):
    """command as the guest's root: with sudo -n (no password: the image's sudoers) unless user is root."""
    return command if user == "root" else "sudo -n " + command


class Guest:
    """The booted guest through QEMU's forward: ssh as user with key, accepting only the host key
    in known_hosts, within the boot's deadline."""

    def __init__(self, qemu, port, key, user, deadline):
        self.qemu, self.port, self.key, self.user, self.deadline = qemu, port, key, user, deadline

    def left(self):
        return max(1.0, self.deadline - time.monotonic())

    def over(self):
        return time.monotonic() >= self.deadline or self.qemu.poll() is not None

    def ssh(self, known_hosts, command, limit=None):
        try:
            return subprocess.run(ssh_argv(self.port, self.key, known_hosts, self.user, command), capture_output=True,
                                  text=True, check=False, timeout=min(limit or self.left(), self.left()))
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([], 124, "", "ssh timed out")

    def wait_for_sshd(self):
        while not self.over():
            if ssh_banner(self.port):
                return True
            time.sleep(2)
        return False

    def login(self, known_hosts):
        """None once a login ran `true`, else why not. sshd answers before logins are let in
        (pam_nologin until systemd-user-sessions), so a refusal is tried again; a host key that
        is not the expected one is not."""
        while True:
            done = self.ssh(known_hosts, "true", limit=60)
            if done.returncode == 0:
                return None
            if HOST_KEY_REFUSED in done.stderr:
                return "the guest's host key is not the expected one: %s" % done.stderr.strip().splitlines()[-1]
            if self.over():
                return "no login as %s: %s" % (self.user, done.stderr.strip()[-300:])
            time.sleep(2)


def logged_in(guest, known, other, result, start):
    """What the boot test does once logged in: a login expecting another host key (it must be
    refused), the verifier after the boot finished, the power-off."""
    problems, timings = result["problems"], result["timings"]
    wrong = guest.ssh(other, "true", limit=60)
    result["wrong_host_key_refused"] = wrong.returncode != 0 and HOST_KEY_REFUSED in wrong.stderr
    if not result["wrong_host_key_refused"]:
        problems.append("a login that expected another host key was not refused (exit %d): %s"
                        % (wrong.returncode, wrong.stderr.strip()[-200:]))
    state = guest.ssh(known, "systemctl is-system-running --wait")
    result["system_state"] = state.stdout.strip() or state.stderr.strip()[-100:]
    timings["system"] = time.monotonic() - start
    verify = guest.ssh(known, privileged(guest.user, VERIFY))
    timings["verifier"] = time.monotonic() - start
    result["text"] = verify.stdout
    result["plan"], result["results"] = parse_tap(verify.stdout, prefix=None)
    if verify.returncode not in (0, 1):      # 1: a check failed, which the TAP says
        problems.append("%s over ssh: exit %d: %s" % (privileged(guest.user, VERIFY), verify.returncode,
                                                      verify.stderr.strip()[-300:]))
    guest.ssh(known, privileged(guest.user, "systemctl poweroff"), limit=30)
    try:
        guest.qemu.wait(timeout=guest.left())
        timings["poweroff"] = time.monotonic() - start
    except subprocess.TimeoutExpired:
        problems.append("the guest did not power off before the boot test's time ran out")


def boot_ssh(out, key, host_key, *, user="vcaadmin", image=None, timeout=600, memory_mib=None, volatile=False,
             overlay=None):
    """Boot the disk (image, or the build's) or (volatile) the volatile volume with overlay as boot()
    does but with SSH_BOOTTEST_ARGS and port 22 forwarded from a free loopback port; log in as user
    with key, expecting the host key whose .pub is host_key; try one login that expects another host
    key (it must be refused); run the verifier (sudo unless user is root) and read its TAP from ssh;
    power off and wait for QEMU. Returns a dict: plan, results, text (the verifier's output),
    problems (beyond the TAP's), timings (s from QEMU's start), seconds, memory_mib."""
    out = Path(out)
    record = build_record(out, volatile)
    memory_mib = memory_mib or memory_for(record, volatile, image_of(out, record, image, volatile))
    work = out / "boot-test"
    port = free_port()
    result = {"plan": None, "results": [], "text": "", "problems": [], "timings": {}, "port": port,
              "memory_mib": memory_mib}
    problems, timings = result["problems"], result["timings"]
    qemu = None
    start = time.monotonic()
    try:
        cmd = qemu_argv(out, record, image, work, memory_mib, args=SSH_BOOTTEST_ARGS, volatile=volatile,
                        overlay=overlay, netdev="user,id=n0,hostfwd=tcp:127.0.0.1:%d-:22" % port)
        known = work / "known_hosts"
        known.write_text(known_hosts_line(port, Path(host_key).read_text()))
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "other")], check=True,
                       stdout=subprocess.DEVNULL)
        other = work / "known_hosts.other"
        other.write_text(known_hosts_line(port, (work / "other.pub").read_text()))
        start = time.monotonic()
        with open(work / "qemu.log", "w") as log:
            qemu = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        guest = Guest(qemu, port, key, user, start + timeout)
        if not guest.wait_for_sshd():
            problems.append("sshd did not answer on 127.0.0.1:%d within %d s" % (port, timeout) if qemu.poll() is None
                            else "QEMU exited (%s) before sshd answered: %s" % (
                                qemu.returncode, (work / "qemu.log").read_text(errors="replace").strip()[-300:]))
            return result
        timings["ssh"] = time.monotonic() - start
        refused = guest.login(known)
        if refused:
            problems.append(refused)
            return result
        timings["login"] = time.monotonic() - start
        logged_in(guest, known, other, result, start)
        return result
    finally:
        result["seconds"] = time.monotonic() - start
        if qemu is not None and qemu.poll() is None:
            qemu.kill()
            qemu.wait()
        if work.exists():
            shutil.rmtree(work)
