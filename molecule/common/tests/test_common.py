"""common on the molecule node: keys work, the password no longer does, base state.
The host container's checks are in test_common_host.py."""

from __future__ import annotations

import os
import subprocess

import paramiko
import pytest

testinfra_hosts = ["ansible://fresh_node"]

KEY = "/tmp/vcafleet-molecule-common/id_ed25519"
CONTAINER = f"vcamol-{os.environ.get('MOLECULE_SCENARIO_NAME', 'common')}"


@pytest.fixture(scope="module")
def address():
    out = subprocess.run(["docker", "exec", CONTAINER, "hostname", "-I"], capture_output=True, text=True,
                         check=True).stdout
    return out.split()[0]


def client():
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    return c


def test_key_login_works(address):
    c = client()
    c.connect(address, username="root", key_filename=KEY, look_for_keys=False, allow_agent=False, timeout=10)
    _, out, _ = c.exec_command("cat /root/.ssh/authorized_keys")
    assert open(KEY + ".pub").read().split()[1] in out.read().decode()
    c.close()


def test_password_login_is_refused(address):
    c = client()
    with pytest.raises(paramiko.AuthenticationException):
        c.connect(address, username="root", password="vista1", look_for_keys=False, allow_agent=False, timeout=10)


def test_admin_user_with_key_and_sudo(host):
    assert host.user("vcaadmin").exists
    assert host.file("/home/vcaadmin/.ssh/authorized_keys").contains("ssh-ed25519")
    assert host.check_output("visudo -cf /etc/sudoers.d/60-vcafleet-admin").endswith("parsed OK")


def test_time_sync_enabled_and_sshd_policy(host):
    assert host.package("systemd-timesyncd").is_installed      # no other time daemon on a fresh node
    assert host.service("systemd-timesyncd").is_enabled
    policy = host.file("/etc/ssh/sshd_config.d/00-vcafleet.conf")
    assert policy.contains("^PasswordAuthentication no$")
    assert "passwordauthentication no" in host.check_output("sshd -T")
