"""action_plugins/vca_apt.py: when apt is skipped, and when it is not (molecule converges prove the
installs; a no-change run proves the skip)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("vca_apt", ROOT / "action_plugins/vca_apt.py")
vca_apt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vca_apt)


def test_only_plain_names_asked_present_are_checked_by_dpkg():
    assert vca_apt.names_of({"name": ["curl", "python3-venv", "g++"], "cache_valid_time": 3600}) == [
        "curl", "python3-venv", "g++"]
    assert vca_apt.names_of({"name": "curl, rsync", "state": "present"}) == ["curl", "rsync"]
    for args in ({"name": ["curl=7.88.1-10"]}, {"name": ["libc6:i386"]}, {"name": ["curl"], "state": "latest"},
                 {"name": ["curl"], "upgrade": "dist"}, {"deb": "/tmp/x.deb"}, {"name": []},
                 {"update_cache": True}, {"name": ["./x.deb"]}, {"name": ["curl"], "state": "absent"}):
        assert vca_apt.names_of(args) is None, args


def test_installed_means_dpkg_status_installed_for_this_machine():
    out = ("amd64\ncurl amd64 installed\nrsync amd64 config-files\nless amd64 not-installed\n"
           "ca-certificates all installed\nlibfoo i386 installed\n")
    assert vca_apt.installed(out) == {"curl", "ca-certificates"}   # libfoo: only another architecture's
    assert vca_apt.installed("amd64\n") == set()
    assert vca_apt.installed("") == set()
