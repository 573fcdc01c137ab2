"""node_base on a simulated node: the governor on every CPU, kept at boot; the verifier installed."""

from __future__ import annotations

testinfra_hosts = ["ansible://vca_nodes"]

CPUS = "/var/lib/vcasim/sys/devices/system/cpu"


def governors(host):
    return host.check_output(f"cat {CPUS}/cpu*/cpufreq/scaling_governor").split()


def test_every_cpu_runs_performance(host):
    found = governors(host)
    assert len(found) == 8 and set(found) == {"performance"}


def test_boot_unit_sets_it_again_after_a_reset(host):
    assert host.service("vca-governor.service").is_enabled
    # What a power-on does: the kernel's default governor is back.
    host.check_output(f"for f in {CPUS}/cpu*/cpufreq/scaling_governor; do echo powersave > $f; done")
    assert set(governors(host)) == {"powersave"}
    host.check_output("systemctl restart vca-governor.service")
    assert set(governors(host)) == {"performance"}
    assert "every CPU runs performance" in host.check_output(
        "journalctl -u vca-governor.service --no-pager -o cat")


def test_verifier_is_installed_and_runs(host):
    verifier = host.file("/usr/local/sbin/vca-node-verify")
    assert verifier.is_file and verifier.mode == 0o755
    assert "\n1.." in host.run("/usr/local/sbin/vca-node-verify").stdout      # it runs and states its plan
