"""No exporter's metric carries a label the Prometheus role's scrape sets on its targets (job, instance,
and the static labels of templates/prometheus.yml.j2, vca_host among them with several VCA hosts):
Prometheus would rename the exporter's `exported_<name>`, and a query on the name would find nothing
(issue 46: `node` was both). Read from the real exposition of vcamon's agent and the farm's API; smem's
label lists from its source."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import jinja2
import yaml
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "apps" / "vcamon" / "src"), str(ROOT / "apps" / "farm" / "src")]

from farm.api import build  # noqa: E402  (the apps' sources, put on the path above)
from farm.config import load  # noqa: E402
from vcamon.agent import Sensors, exposition  # noqa: E402


def scrape_configs(hosts=("vca-host", "vcb-host"), machine="vca-node0", extra_workers=()) -> list[dict]:
    """The role's scrape configuration for one target on machine; by default for two VCA hosts."""
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters["to_json"] = json.dumps
    env.filters["bool"] = bool
    target = {"machine": machine, "address": "*", "port": 9101,
              "metrics": {"job": "vcamon", "path": "/metrics", "credential_file": "/x"}}
    text = env.from_string((ROOT / "roles/prometheus/templates/prometheus.yml.j2").read_text()).render(
        ansible_managed="", prometheus_scrape_interval="30s", prometheus_evaluation_interval="30s",
        prometheus_rules_dir="/r", prometheus_alertmanager_targets=[], prometheus_url_host="127.0.0.1",
        prometheus_port=9090, inventory_hostname="vca-host", prometheus_alertmanager_install=True,
        prometheus_alertmanager_local="127.0.0.1:9093", prometheus_targets=[target],
        prometheus_credentials_dir="/c", groups={"vca_host": list(hosts), "extra_workers": list(extra_workers)},
        hostvars={"vca-node0": {"vca_host_name": "vca-host"}, "owner-pc": {}})
    return yaml.safe_load(text)["scrape_configs"]


def target_labels(hosts=("vca-host", "vcb-host")) -> set[str]:
    """Every label the scrape sets; by default for two VCA hosts (which adds vca_host to each target)."""
    labels = {"job", "instance"}
    for job in scrape_configs(hosts):
        for static in job["static_configs"]:
            labels |= set(static.get("labels", {}))
        labels |= {r["target_label"] for r in job.get("relabel_configs", [])}
    return labels


def exposition_labels(text: str) -> set[str]:
    return {k for f in text_string_to_metric_families(text) for s in f.samples for k in s.labels}


def test_the_scrape_sets_machine_and_role_not_node():
    assert target_labels(["vca-host"]) == {"job", "instance", "machine", "role"}
    assert target_labels() == {"job", "instance", "machine", "role", "vca_host"}   # several VCA hosts


def test_an_extra_workers_target_says_what_it_is_and_names_no_vca_host():
    jobs = scrape_configs(machine="owner-pc", extra_workers=["owner-pc"])
    (job,) = [j for j in jobs if j["job_name"].endswith("9101")]
    assert job["static_configs"][0]["labels"] == {"machine": "owner-pc", "role": "extra_worker"}


def test_vcamons_agent_has_no_target_label(tmp_path, monkeypatch):
    sensors = Sensors(str(tmp_path), filesystems=(str(tmp_path),), units=("smem.service",))
    monkeypatch.setattr(sensors, "unit_states", lambda: {"smem.service": "active"})
    labels = exposition_labels(exposition(sensors, "vca-node0").decode())
    assert {"node", "unit", "state", "mountpoint"} <= labels      # it was read at all
    assert labels & target_labels() == set()


def test_the_farms_metrics_have_no_target_label(tmp_path):
    s = load(None, db_path=str(tmp_path / "farm.db"), output_dir=str(tmp_path / "out"),
             work_dir=str(tmp_path / "work"), parts_dir=str(tmp_path / "parts"))
    client = TestClient(build(s, "api", "worker", "metrics"))
    r = client.post("/v1/jobs", headers={"Authorization": "Bearer api"},
                    json={"spec": {"renderer": "testsrc", "width": 320, "height": 180, "fps": 30, "frames": 120},
                          "out": "a.mp4", "nodes": ["vca-node0"]})
    assert r.status_code == 201, r.text
    text = client.get("/metrics", headers={"Authorization": "Bearer metrics"}).text
    labels = exposition_labels(text)
    assert {"state", "cause"} <= labels
    assert labels & target_labels() == set()


def test_smems_label_lists_have_no_target_label():
    source = (ROOT / "apps/smem/src/smem/metrics.py").read_text()
    lists = re.findall(r'labels=\[([^\]]*)\]|"[^"]*", \[("[^\]]*)\]', source)
    names = {n for pair in lists for part in pair for n in re.findall(r'"([a-z_]+)"', part)}
    assert {"worker", "lane", "node", "mode"} <= names
    assert names & target_labels() == set()
