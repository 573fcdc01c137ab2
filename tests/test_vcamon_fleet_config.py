"""roles/vcamon's fleet.json as Ansible renders it from the exposure table, read by vcamon's own loader
and credential reader: each metrics socket keeps the way its token is found (a file, a JSON key, a line
of HAProxy's map)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "apps" / "vcamon" / "src"))

from vcamon import fleet  # noqa: E402


def fleet_json(sockets) -> str:
    variables = {"vcamon_exposure": {"sockets": sockets}, "vcamon_records_dir": "/var/lib/vcamon/records"}
    template = ROOT / "roles" / "vcamon" / "templates" / "etc" / "vcamon" / "fleet.json.j2"
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(template.read_text()))


def test_each_service_keeps_the_way_its_token_is_found(tmp_path):
    keys = tmp_path / "llm-worker-keys.map"
    keys.write_text("vca-host key-of-the-host\nvca-node0 key-of-node0\n")
    lanes = tmp_path / "lane-keys.json"
    lanes.write_text(json.dumps({"vca-node0": "lane-key-of-node0"}))
    sockets = [
        {"machine": "vca-node0", "address": "172.31.1.1", "port": 8420,
         "metrics": {"job": "llm-worker", "path": "/metrics", "credential_file": str(keys),
                     "credential_map_key": "vca-node0"}},
        {"machine": "vca-node0", "address": "172.31.1.1", "port": 8410,
         "metrics": {"job": "llama-server", "path": "/metrics", "credential_file": str(lanes),
                     "credential_json_key": "vca-node0"}},
        {"machine": "vca-node0", "address": "*", "port": 9100, "metrics": {"job": "vcamon", "path": "/metrics"}},
        {"machine": "vca-host", "address": "127.0.0.1", "port": 22, "metrics": None},
    ]
    path = tmp_path / "fleet.json"
    path.write_text(fleet_json(sockets))
    services = fleet.load_config(path)["services"]
    assert [(s["job"], s["url"]) for s in services] == [
        ("llm-worker", "http://172.31.1.1:8420/metrics"), ("llama-server", "http://172.31.1.1:8410/metrics")]
    assert [fleet.credential(s) for s in services] == ["key-of-node0", "lane-key-of-node0"]
