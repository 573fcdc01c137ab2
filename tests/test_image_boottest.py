"""vca-image boot-test: the verifier's TAP as it comes back on the serial console, judged against its plan."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from vca_image import boottest, build, cli
from vca_image.boottest import parse_tap, tap_problems

PROFILE = {"name": "lab-tiny", "image": {"size_mib": 64, "fs_uuid": "5b0f2a9e-3c41-4d8e-9f17-2a6c8e4d1b73",
                                         "hash_seed": "0e7d4c21-8a3b-4f56-b9d2-7c1e5a3f9b08",
                                         "source_date_epoch": 1767225600}}

# vca-node-verify's output on a QEMU boot of a full image (no VCA hardware: five SKIPs).
VERIFIER = """\
TAP version 13
1..27
ok 1 - kernel version is the image's # running 6.1.0-41-amd64, image has 6.1.0-41-amd64
ok 2 - VCA modules loaded # SKIP no VCA node drivers (/sys/class/vca absent): not VCA hardware
ok 3 - /sys/class/vca/vca/state is os_ready # SKIP no VCA node drivers (/sys/class/vca absent): not VCA hardware
ok 4 - net.ifnames=0 on the kernel command line # root=/dev/vda2 rw console=ttyS0 printk.devkmsg=on net.ifnames=0
ok 5 - eth0 present # eth0
ok 6 - eth0 MTU # mtu 65521, want 65521
ok 7 - eth0 has an IPv4 address # 2: eth0    inet 10.0.2.15/24 brd 10.0.2.255 scope global dynamic eth0
ok 8 - hostname set (the inventory's, where the overlay names it) # vca-node
ok 9 - route to the host via eth0 # 10.0.2.2 dev eth0 src 10.0.2.15 uid 0
ok 10 - default route through the host # default via 10.0.2.2 dev eth0
ok 11 - DNS: a nameserver is configured # 10.0.2.3
ok 12 - DNS answers through it # 10.0.2.3 answered (rcode 3)
ok 13 - time sync enabled (systemd-timesyncd) # enabled
ok 14 - sshd running # active
ok 15 - sshd host key present # /etc/ssh/ssh_host_ed25519_key
ok 16 - fleet keys authorised # 1 users
ok 17 - OpenCL ICD registered # /etc/OpenCL/vendors/pocl.icd
ok 18 - OpenCL device visible #  `-- Device #0: cpu-haswell-QEMU TCG CPU version 2.5+
ok 19 - Iris Pro P580 with 72 compute units # SKIP no GPU render node (/dev/dri): not VCA hardware
ok 20 - CPU governor is performance # SKIP no cpufreq (a virtual CPU): not VCA hardware
ok 21 - coretemp sensors visible # SKIP no coretemp hwmon (a virtual CPU): not VCA hardware
ok 22 - free memory above the floor # 1203 MiB available, floor 256
ok 23 - root file system writable, with room # 2741 MiB free
ok 24 - journal has no errors from the VCA modules # none
ok 25 - no failed systemd units # none
ok 26 - lm-sensors installed # /usr/bin/sensors
ok 27 - probe prerequisites (gcc, NumPy) # numpy 1.24.2, gcc /usr/bin/gcc
# summary {"total": 27, "pass": 22, "fail": 0, "skip": 5, "hardware": false}
""".splitlines()


def console(verifier_lines, kernel_lines=()):
    """A serial console log: boot noise, the verifier's lines as kernel messages, power-off."""
    lines = ["[    0.000000] Linux version 6.1.0-41-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC",
             "[  OK  ] Finished vca-node-verify.service - vca-node-verify: is this node fit for service.",
             "         Starting vca-boottest.service - CI boot test: run vca-node-verify to the kernel log...\r"]
    lines += ["[%12.6f] vca-node-verify: %s\r" % (9.5 + i / 1000, line) for i, line in enumerate(verifier_lines)]
    lines += [*kernel_lines, "[   10.131005] reboot: Power down"]
    return "\n".join(lines) + "\n"


def test_a_complete_run_passes_with_its_skips_counted():
    plan, results = parse_tap(console(VERIFIER))
    assert plan == 27 and [r["n"] for r in results] == list(range(1, 28))
    skips = [r for r in results if r["status"] == "skip"]
    assert [r["n"] for r in skips] == [2, 3, 19, 20, 21]
    assert skips[0]["detail"] == "no VCA node drivers (/sys/class/vca absent): not VCA hardware"
    assert results[5] == {"n": 6, "name": "eth0 MTU", "status": "pass", "detail": "mtu 65521, want 65521"}
    assert tap_problems(plan, results) == []


def test_a_run_cut_by_the_kmsg_rate_limit_fails():
    # devkmsg's default limit: a burst of 10 lines (TAP version, plan, 8 results), the rest dropped
    cut = console(VERIFIER[:10], ["[    9.512873] printk: vca-node-verify: 19 output lines suppressed due to "
                                  "ratelimiting"])
    plan, results = parse_tap(cut)
    assert (plan, len(results)) == (27, 8)
    assert tap_problems(plan, results) == ["27 checks planned, 8 came"]


def test_results_without_a_plan_fail():
    plan, results = parse_tap(console(VERIFIER[:1] + VERIFIER[2:]))
    assert plan is None and len(results) == 27
    assert tap_problems(plan, results) == ["no TAP plan (1..N) on the console; 27 checks came"]
    assert tap_problems(*parse_tap("")) == ["no TAP plan (1..N) on the console; 0 checks came"]


def test_one_not_ok_fails_and_is_named():
    lines = [line.replace("ok 22 - free memory above the floor # 1203", "not ok 22 - free memory above the floor # 180")
             for line in VERIFIER]
    plan, results = parse_tap(console(lines))
    assert results[21] == {"n": 22, "name": "free memory above the floor", "status": "fail",
                           "detail": "180 MiB available, floor 256"}
    assert tap_problems(plan, results) == ["not ok: 22 free memory above the floor"]


def fake_qemu(seen, console_text):
    """subprocess.run for boottest: QEMU writes console_text to its serial file and records what it
    was given (and the ESP's command-line block of the disk it boots, read while it runs); every
    other command (cp, sfdisk, mcopy) runs for real."""
    real = subprocess.run

    def run(cmd, **kw):
        if not cmd[0].endswith("qemu-system-x86_64"):
            return real(cmd, **kw)
        seen["cmd"] = cmd
        drive = next((a for a in cmd if a.startswith("if=none,id=disk0,")), None)
        if drive:
            disk = drive.split("file=", 1)[1]
            seen["disk"] = disk
            seen["env"] = real(["mtype", "-i", "%s@@%d" % (disk, boottest.esp_offset(disk)),
                                "::/" + build.CMDLINE_ENV], capture_output=True, check=True,
                               env=dict(os.environ, MTOOLS_SKIP_CHECK="1", MTOOLSRC=os.devnull)).stdout
        log = next(a for a in cmd if a.startswith("file:"))[len("file:"):]
        with open(log, "w") as fh:
            fh.write(console_text)
    return run


@pytest.fixture
def built(tmp_path, monkeypatch):
    """A build directory with a real (tiny) disk made by make_disk, and stand-in OVMF files."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/hostname").write_text("vca-node\n")
    out = tmp_path / "out"
    out.mkdir()
    disk = build.make_disk(PROFILE, rootfs, out)
    record = {"build_id": "0123456789abcdef", "image": disk.name, "sha256": build.sha256(disk)}
    (out / "lab-tiny.json").write_text(json.dumps(record))
    code, nvram = tmp_path / "OVMF_CODE_4M.fd", tmp_path / "OVMF_VARS_4M.fd"
    code.write_bytes(b"code")
    nvram.write_bytes(b"vars")
    monkeypatch.setattr(boottest, "OVMF", [(str(code), str(nvram))])
    monkeypatch.setattr(boottest.shutil, "which", lambda name: "/usr/bin/" + name)
    return out, record


def test_the_disk_boots_from_its_own_esp_under_ovmf_and_stays_untouched(built, monkeypatch, capsys):
    out, record = built
    seen = {}
    monkeypatch.setattr(boottest.subprocess, "run", fake_qemu(seen, console(VERIFIER)))
    assert cli.main(["boot-test", str(out)]) == 0
    cmd = seen["cmd"]
    assert not {"-kernel", "-initrd", "-append"} & set(cmd), "the disk boots from its own bootloader"
    assert "if=pflash,format=raw,unit=0,readonly=on,file=%s" % boottest.OVMF[0][0] in cmd
    assert any(a.startswith("if=pflash,format=raw,unit=1,file=") for a in cmd)
    assert "virtio-blk-pci,drive=disk0,bootindex=0" in cmd
    # the boot test's arguments reach the kernel through the ESP of a copy, never the built disk
    assert seen["disk"] != str(out / record["image"])
    assert seen["env"].startswith(b"# GRUB Environment Block\n") and len(seen["env"]) == 1024
    assert b"\nvca_cmdline_extra=%s\n" % boottest.BOOTTEST_ARGS.encode() in seen["env"]
    assert {"vca.boottest", "vca.host=10.0.2.2", "printk.devkmsg=on", "panic=-1", "console=ttyS0"} <= set(
        boottest.BOOTTEST_ARGS.split())
    assert build.sha256(out / record["image"]) == record["sha256"]
    assert not (out / "boot-test").exists(), "the copy is removed after the boot"
    assert "27 of 27 checks" in capsys.readouterr().out


def test_boot_test_fails_a_cut_run(built, monkeypatch, capsys):
    out, _ = built
    monkeypatch.setattr(boottest.subprocess, "run", fake_qemu({}, console(VERIFIER[:10])))
    assert cli.main(["boot-test", str(out)]) == 1
    captured = capsys.readouterr()
    assert "8 of 27 checks" in captured.out and "boot test failed: 27 checks planned, 8 came" in captured.err


@pytest.fixture
def volatile_build(built, tmp_path):
    """The build directory with a real (tiny) volatile image beside the disk, recorded."""
    out, record = built
    rootfs = tmp_path / "vroot"
    (rootfs / "boot").mkdir(parents=True)
    (rootfs / "boot/vmlinuz-6.1.0-41-amd64").write_text("kernel\n")
    (rootfs / "etc").mkdir()
    image, _, _ = build.make_volatile(PROFILE, rootfs, out)
    record = dict(record, volatile=image.name, volatile_sha256=build.sha256(image), volatile_root_mib=1352)
    (out / "lab-tiny.json").write_text(json.dumps(record))
    return out, record


def fat_file(image, name):
    return subprocess.run(["mtype", "-i", "%s@@%d" % (image, boottest.esp_offset(image)), "::/" + name],
                          capture_output=True, check=True, env=dict(os.environ, MTOOLS_SKIP_CHECK="1",
                                                                     MTOOLSRC=os.devnull)).stdout


def test_the_volatile_image_boots_under_ovmf_from_a_copy_with_its_overlay(volatile_build, monkeypatch, capsys,
                                                                            tmp_path):
    out, record = volatile_build
    overlay = tmp_path / "node.cpio"
    overlay.write_bytes(b"070701 stands in for the node's overlay")
    seen = {}
    real = fake_qemu(seen, console(VERIFIER))

    def run(cmd, **kw):
        done = real(cmd, **kw)
        if cmd[0].endswith("qemu-system-x86_64"):
            seen["overlay"] = fat_file(seen["disk"], build.VOLATILE_OVERLAY)
        return done
    monkeypatch.setattr(boottest.subprocess, "run", run)
    assert cli.main(["boot-test", str(out), "--volatile", "--overlay", str(overlay)]) == 0
    cmd = seen["cmd"]
    assert not {"-kernel", "-initrd", "-append"} & set(cmd), "GRUB on the volume loads the kernel, not QEMU"
    assert "if=pflash,format=raw,unit=0,readonly=on,file=%s" % boottest.OVMF[0][0] in cmd
    assert "virtio-blk-pci,drive=disk0,bootindex=0" in cmd
    assert seen["disk"].endswith("/boot-test/" + record["volatile"]), "a copy of the volatile image"
    assert b"\nvca_cmdline_extra=%s\n" % boottest.BOOTTEST_ARGS.encode() in seen["env"]
    assert seen["overlay"] == overlay.read_bytes()
    # the whole root in RAM: twice the root with room, plus the volume (33 MiB here) and the kernel's own
    memory = int(cmd[cmd.index("-m") + 1])
    assert memory == boottest.memory_for(record, True, out / record["volatile"]) == 3584
    assert "booting the volatile image under OVMF with 3584 MiB of memory" in capsys.readouterr().out
    assert build.sha256(out / record["volatile"]) == record["volatile_sha256"], "the built image is untouched"
    assert not (out / "boot-test").exists()


def test_guest_memory_follows_the_root_the_build_recorded(tmp_path):
    image = tmp_path / "v.img"
    with open(image, "wb") as fh:
        fh.truncate(458 * 2**20)
    assert boottest.memory_for({"volatile_root_mib": 1352}, True, image) == 4096     # measured: 358 MiB free on /
    assert boottest.memory_for({"volatile_root_mib": 1352}, False, image) == 1536
    assert boottest.memory_for({}, True, image) == 4096
    assert boottest.memory_for({"volatile_root_mib": 100}, True) == 1024


def test_the_boot_fat_of_a_superfloppy_is_at_byte_0_and_of_the_disk_at_partition_1(volatile_build):
    out, record = volatile_build
    assert boottest.esp_offset(out / record["volatile"]) == 0
    assert boottest.esp_offset(out / record["image"]) == build.ESP_START * build.SECTOR
    assert boottest.fat_has(out / record["volatile"], "startup.nsh")
    assert not boottest.fat_has(out / record["volatile"], build.VOLATILE_OVERLAY)


def test_a_disk_without_an_esp_is_refused(tmp_path):
    disk = tmp_path / "old.img"
    with open(disk, "wb") as fh:
        fh.truncate(8 * 2**20)
    subprocess.run(["sfdisk", "--quiet", str(disk)], input=b"label: gpt\nstart=2048, size=4096, type=L\n",
                   check=True)
    with pytest.raises(SystemExit, match="has no EFI system partition"):
        boottest.esp_offset(disk)


def test_the_environment_block_is_what_grub_editenv_writes(tmp_path):
    block = boottest.grub_env({"vca_cmdline_extra": "vca.boottest panic=-1"})
    path = tmp_path / "env"
    path.write_bytes(block)
    listed = subprocess.run(["grub-editenv", str(path), "list"], capture_output=True, text=True, check=True).stdout
    assert listed == "vca_cmdline_extra=vca.boottest panic=-1\n"
    with pytest.raises(ValueError):
        boottest.grub_env({"x": "a\nb"})
