"""vca_host on the molecule container: DKMS state, modinfo per kernel, modprobe config."""

from __future__ import annotations

import re

import pytest


def kernels(host):
    out = host.check_output("ls -1 /lib/modules")
    found = sorted(k for k in out.split() if host.file(f"/lib/modules/{k}/build/Makefile").exists)
    assert len(found) == 2, found              # 6.1 and the backports kernel
    return found


@pytest.mark.parametrize("package, module", [("vca2-vcass", "plx87xx"), ("vca_mbox", "vca_mbox"),
                                             ("vca_dma", "vca_dma")])
def test_installed_for_every_kernel(host, package, module):
    status = host.check_output(f"dkms status -m {package}")
    for kernel in kernels(host):
        assert re.search(rf"^{package}/[^,]+, {re.escape(kernel)}, x86_64: installed", status, re.M), status
        path = host.check_output(f"modinfo -k {kernel} -F filename {module}")
        assert "/updates/dkms/" in path
        assert host.file(path).exists


def test_our_patch_is_in_the_built_source(host):
    src = host.check_output("ls -d /usr/src/vca2-vcass-0.0.1-vcafleet.*")
    assert len(src.split()) == 1                      # one version, old ones removed
    assert host.file(f"{src}/vca/plx87xx/plx_mbox.c").contains("EXPORT_SYMBOL_GPL(plx_mbox_get)")
    conf = host.file(f"{src}/dkms.conf")
    assert conf.contains('BUILD_EXCLUSIVE_KERNEL=".*"')
    assert conf.contains("0001-plx_mbox.patch")


def test_patched_module_exports_the_mailbox(host):
    kernel = kernels(host)[0]
    path = host.check_output(f"modinfo -k {kernel} -F filename plx87xx")
    assert "plx_mbox_spad_write" in host.check_output(f"strings {path}")


def test_modprobe_config(host):
    conf = host.file("/etc/modprobe.d/vca2-host.conf")
    assert conf.contains("^blacklist vca_csa$")
    assert conf.contains("^softdep plx87xx pre: .*vca_virtio .*plx87xx_dma$")


def test_no_staging_left(host):
    assert host.check_output("ls -a /usr/src | grep -c staging || true") == "0"


def our_source(host, package):
    src = host.check_output(f"ls -d /usr/src/{package}-*")
    assert len(src.split()) == 1, src
    return src


@pytest.mark.parametrize("package", ["vca_dma", "vca_mbox"])
def test_sparse_clean(host, package):
    """sparse over the sources as the role installed them, for both kernels' headers."""
    src = our_source(host, package)
    for kernel in kernels(host):
        build = f"/tmp/sparse-{package}-{kernel}"
        out = host.run(f"rm -rf {build} && cp -r {src} {build} && "
                       f"make -C /lib/modules/{kernel}/build M={build} modules C=2 CHECK=sparse 2>&1")
        assert out.rc == 0, out.stdout
        assert "CHECK" in out.stdout, out.stdout          # sparse did run
        assert not re.search(r"(warning|error):", out.stdout), out.stdout


# checkpatch --strict CHECKs left in the fixed uapi header, explained in modules_c/README.md.
UAPI_CHECKS = {"Please use a blank line after function/struct/union/enum declarations",
               "Prefer using the BIT macro", "line length of"}


@pytest.mark.parametrize("package", ["vca_dma", "vca_mbox"])
def test_checkpatch_clean(host, package):
    src = our_source(host, package)
    files = host.check_output(f"find {src} -name '*.[ch]' ! -name '*.mod.c' | sort").split()
    assert files
    for f in files:
        out = host.run(f"perl /opt/checkpatch/checkpatch.pl --strict --no-tree --file {f}")
        assert "total: 0 errors, 0 warnings," in out.stdout, out.stdout
        checks = [line for line in out.stdout.splitlines() if line.startswith("CHECK:")]
        if f.endswith("/include/uapi/vca_dma_ioctl.h"):
            assert all(any(c in line for c in UAPI_CHECKS) for line in checks), out.stdout
        else:
            assert not checks, out.stdout


# The host's tools, built from the fixture tree's apps/ through the role's CMake path.
def test_vcactl_is_installed_from_the_tree(host):
    vcactl = host.file("/usr/sbin/vcactl")
    assert vcactl.exists and vcactl.user == "root" and vcactl.mode == 0o755
    assert host.check_output("sh -c 'command -v vcactl'") == "/usr/sbin/vcactl"
    assert host.check_output("vcactl --version") == "vcactl 0.0.1 (vcafleet fixture)"   # PKG_VER from the role
    assert "Card: 0 Cpu: 0  STATE: bios_up" in host.check_output("vcactl status")


def test_daemon_runs_from_its_unit(host):
    assert host.file("/usr/sbin/vcactld").mode == 0o755
    service = host.service("vcactld")
    assert service.is_enabled and service.is_running
    assert "vcactld (fixture) started" in host.file("/var/log/vca/vcactld.log").content_string


def test_daemon_config_leaves_booting_to_vca_boot(host):
    config = host.file("/etc/vca_config.d/vca_config.xml")
    assert config.group == "vcausers"
    assert config.contains("<auto-boot>0</auto-boot>") and not config.contains("<auto-boot>1</auto-boot>")


@pytest.mark.parametrize("rule", ["95-vca", "96-vop", "97-host_eth_up", "98-vca_mgr", "99-vca_blk_bcknd",
                                  "99-vca_mgr_extd"])
def test_udev_rules(host, rule):
    assert host.file(f"/etc/udev/rules.d/{rule}.rules").contains('GROUP="vcausers"')


def test_daemon_user_and_lock_directory(host):
    assert host.user("vcausers_default").group == "vcausers"
    assert host.file("/run/lock/vca").is_directory
    assert host.file("/usr/sbin/vca_eth_ifup.sh").mode == 0o755


def test_no_tools_build_left(host):
    assert host.check_output("ls /var/cache/vcafleet/vca_host | grep -c tools-build || true") == "0"
