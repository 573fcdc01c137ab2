"""The prometheus role's alerts under promtool: files/vcafleet-rules.yml and the per-job absent() rules
rendered from templates/vcafleet-targets.yml.j2 load, every alert has a unit test, the tests pass, each
alert's test fails when its rule is broken (never fires, or always), and every rule waits (`for:`).
Also: the Alertmanager's configuration the role renders passes amtool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

ROLE = Path(__file__).resolve().parent.parent / "roles" / "prometheus"
FILES = ROLE / "files"
RULES = FILES / "vcafleet-rules.yml"
TESTS = FILES / "tests" / "vcafleet-rules.test.yml"
TARGETS_TESTS = FILES / "tests" / "vcafleet-targets.test.yml"
JOBS = ["prometheus", "vcamon", "smem"]     # what vcafleet-targets.test.yml expects


def render(template: str, **variables) -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    env.filters["to_nice_yaml"] = lambda v, indent=2: yaml.safe_dump(v, indent=indent, sort_keys=False)
    return env.from_string((ROLE / "templates" / template).read_text()).render(ansible_managed="test", **variables)


def targets_rules(jobs=JOBS) -> dict:
    return yaml.safe_load(render("vcafleet-targets.yml.j2", prometheus_jobs=jobs,
                                 prometheus_config_dir="/etc/prometheus"))


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    tool = shutil.which("promtool")
    assert tool, "promtool (Debian's prometheus package, scripts/host-packages.txt) is not on PATH"
    return subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def alerts(doc: dict) -> list[dict]:
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def run_with(tmp_path: Path, rules: dict) -> subprocess.CompletedProcess:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / RULES.name).write_text(yaml.safe_dump(rules, allow_unicode=True))
    shutil.copy(TESTS, tmp_path / "tests" / TESTS.name)
    return promtool("test", "rules", TESTS.name, cwd=tmp_path / "tests")


def test_the_rules_load_and_their_tests_pass():
    r = promtool("check", "rules", RULES.name, cwd=FILES)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    r = promtool("test", "rules", TESTS.name, cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr


def run_targets_with(tmp_path: Path, rules: dict) -> subprocess.CompletedProcess:
    (tmp_path / "vcafleet-targets.yml").write_text(yaml.safe_dump(rules))
    shutil.copy(TARGETS_TESTS, tmp_path / TARGETS_TESTS.name)
    return promtool("test", "rules", TARGETS_TESTS.name, cwd=tmp_path)


def test_the_per_job_rules_load_and_their_tests_pass(tmp_path):
    (tmp_path / "r.yml").write_text(render("vcafleet-targets.yml.j2", prometheus_jobs=JOBS,
                                           prometheus_config_dir="/etc/prometheus"))
    r = promtool("check", "rules", "r.yml", cwd=tmp_path)
    assert r.returncode == 0 and "SUCCESS: 3 rules found" in r.stdout, r.stdout + r.stderr
    r = run_targets_with(tmp_path, targets_rules())
    assert r.returncode == 0, r.stdout + r.stderr


def cases(tests: Path) -> list[dict]:
    return yaml.safe_load(tests.read_text())["tests"]


def test_every_alert_has_a_test_where_it_fires_and_one_where_it_must_not():
    for rules, tests in ((yaml.safe_load(RULES.read_text()), TESTS), (targets_rules(), TARGETS_TESTS)):
        fires = {t["alertname"] for case in cases(tests) for t in case["alert_rule_test"] if t.get("exp_alerts")}
        silent = {t["alertname"] for case in cases(tests) for t in case["alert_rule_test"] if not t.get("exp_alerts")}
        names = {a["alert"] for a in alerts(rules)}
        assert names == fires == silent, (names, fires, silent)


def test_every_rule_waits_before_it_fires():
    for rules in (yaml.safe_load(RULES.read_text()), targets_rules()):
        assert [a["alert"] for a in alerts(rules) if not a.get("for")] == []


@pytest.mark.parametrize("broken", ["absent(vector(1))", "vector(1)"], ids=["never-fires", "always-fires"])
def test_a_broken_per_job_rule_fails_its_test(tmp_path, broken):
    rules = targets_rules()
    for rule in alerts(rules):
        rule["expr"] = broken
    r = run_targets_with(tmp_path, rules)
    assert r.returncode != 0 and "alertname: ScrapeJobMissing" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_alertmanager_configuration_passes_amtool(tmp_path):
    tool = shutil.which("amtool")
    assert tool, "amtool (Debian's prometheus-alertmanager, scripts/host-packages.txt) is not on PATH"
    text = render("alertmanager.yml.j2", prometheus_alertmanager_group_by=["alertname", "machine"],
                  prometheus_alertmanager_repeat_interval="4h",
                  prometheus_alertmanager_receiver={"webhook_configs": [{"url": "http://127.0.0.1:5001/"}]})
    (tmp_path / "am.yml").write_text(text)
    r = subprocess.run([tool, "check-config", "am.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0 and "1 receivers" in r.stdout, r.stdout + r.stderr
    assert yaml.safe_load(text)["receivers"] == [{"webhook_configs": [{"url": "http://127.0.0.1:5001/"}],
                                                  "name": "vcafleet"}]


@pytest.mark.parametrize("alert", [a["alert"] for a in alerts(yaml.safe_load(RULES.read_text()))])
@pytest.mark.parametrize("broken", ["absent(vector(1))", "vector(1)"], ids=["never-fires", "always-fires"])
def test_a_broken_rule_fails_its_test(tmp_path, alert, broken):
    rules = yaml.safe_load(RULES.read_text())
    [rule] = [r for r in alerts(rules) if r["alert"] == alert]
    rule["expr"] = broken
    r = run_with(tmp_path, rules)
    assert r.returncode != 0 and "alertname: %s" % alert in r.stdout + r.stderr, r.stdout + r.stderr
