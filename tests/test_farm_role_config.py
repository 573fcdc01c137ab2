"""roles/farm's farm.toml as Ansible renders it, read by a TOML parser and by the farm's own loader:
every setting an inventory can give (tables included) comes out as the farm reads it (issue 39)."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles" / "farm"
sys.path.insert(0, str(ROOT / "apps" / "farm" / "src"))

from farm.config import load  # noqa: E402


def trusted(value):
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


def farm_toml(is_host: bool, **overrides) -> str:
    variables = {**trusted(yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())),
                 "farm_is_host": is_host, "farm_broker_url": "amqp://farm-vca-node0:pw@172.31.1.254:5672/farm",
                 "farm_state_dir": "/var/lib/farm", "farm_workers": ["vca-node0", "vca-node1"],
                 "farm_listen_ip": "172.31.1.254", "farm_config_dir": "/etc/farm", "farm_api_url": "http://h:8790",
                 "farm_cache_dir": "/var/cache/farm", "farm_browser_executable": "/usr/bin/chromium",
                 "farm_node_bin": "/usr/bin/node", "farm_remotion_modules": "/opt/farm/remotion/node_modules",
                 "farm_node_user_prefix": "farm-", "ansible_managed": "Ansible managed", **overrides}
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template((ROLE / "templates" / "farm.toml.j2").read_text()))


@pytest.mark.parametrize("is_host", [True, False])
def test_every_kind_of_setting_is_written_as_toml_the_farm_loads(tmp_path, is_host):
    settings = {"render_s_per_frame": {"remotion": 0.3, "testsrc": 0.005}, "attempts": 4,
                "stall_after_s": 60.5, "farm_nodes": ["vca-node0", "vca-node1"], "allow_public_listen": False,
                "output_dir": 'out "quoted"'}
    text = farm_toml(is_host, farm_settings=settings, farm_render_settings={"sample_rate": 44100},
                     farm_never_lend=["vca-node2"])
    data = tomllib.loads(text)
    for key, value in settings.items():
        assert data[key] == value, (key, text)
    assert data["render"]["sample_rate"] == 44100 and data["render"]["browser"] == "/usr/bin/chromium"
    assert data["chunk_limit_cap_s"] == 3600 and data["broker_consumer_timeout_s"] == 3600 + 30 + 300
    (tmp_path / "farm.toml").write_text(text)
    s = load(tmp_path / "farm.toml")            # the farm's own checks pass on what the role writes
    assert s.s_per_frame({"renderer": "remotion"}) == 0.3
    if is_host:
        assert s.never_lend == ["vca-node2"]
