"""common on the molecule host (a Proxmox-like VCA host): its time daemon and its sshd are its own."""

from __future__ import annotations

testinfra_hosts = ["ansible://vca_host"]


def test_chrony_stays_and_timesyncd_is_not_installed(host):
    assert host.package("chrony").is_installed
    assert not host.package("systemd-timesyncd").is_installed
    assert not host.file("/etc/systemd/timesyncd.conf.d/vcafleet.conf").exists


def test_sshd_password_setting_untouched(host):
    assert not host.file("/etc/ssh/sshd_config.d/00-vcafleet.conf").exists
    assert host.file("/etc/ssh/sshd_config.d/10-host.conf").contains("^PasswordAuthentication yes$")
    effective = host.check_output("sshd -T")
    assert "passwordauthentication yes" in effective
    assert "permitrootlogin yes" in effective


def test_admin_user_on_the_host_too(host):
    assert host.user("vcaadmin").exists
    assert host.file("/home/vcaadmin/.ssh/authorized_keys").contains("ssh-ed25519")
    assert host.check_output("visudo -cf /etc/sudoers.d/60-vcafleet-admin").endswith("parsed OK")
