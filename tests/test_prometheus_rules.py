"""roles/prometheus/files/vcafleet-rules.yml under promtool: the rules load, every alert has a unit
test, the tests pass, and each alert's test fails when its rule is broken (never fires, or always)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

FILES = Path(__file__).resolve().parent.parent / "roles" / "prometheus" / "files"
RULES = FILES / "vcafleet-rules.yml"
TESTS = FILES / "tests" / "vcafleet-rules.test.yml"


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


def test_every_alert_has_a_test():
    tested = {t["alertname"] for case in yaml.safe_load(TESTS.read_text())["tests"] for t in case["alert_rule_test"]}
    assert {a["alert"] for a in alerts(yaml.safe_load(RULES.read_text()))} == tested


@pytest.mark.parametrize("alert", [a["alert"] for a in alerts(yaml.safe_load(RULES.read_text()))])
@pytest.mark.parametrize("broken", ["absent(vector(1))", "vector(1)"], ids=["never-fires", "always-fires"])
def test_a_broken_rule_fails_its_test(tmp_path, alert, broken):
    rules = yaml.safe_load(RULES.read_text())
    [rule] = [r for r in alerts(rules) if r["alert"] == alert]
    rule["expr"] = broken
    r = run_with(tmp_path, rules)
    assert r.returncode != 0 and "alertname: %s" % alert in r.stdout + r.stderr, r.stdout + r.stderr
