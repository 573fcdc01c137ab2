"""The hardware evidence bundle (module_utils/vca_evidence.py): verdicts by kind, a card-only check never
passing off a card, every figure with its platform, no secret in any file, and the schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from ansible.module_utils.vca_evidence import build, scrub, secrets_from

REPO = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((REPO / "playbooks/files/evidence-bundle.schema.json").read_text())
LAB = {"platform": "lab", "platform_evidence": {"lab_marker": "vcasim"}}
CARD = {"platform": "hardware", "platform_evidence": {"vca_pci": ["0000:03:00.0 8086:2954"]}}
TOKEN = "Zq8sV0t9Lrp2Wm4xYb6n"            # made up for the test: the "credential" that must never show
KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"


def check(name, kind, host=None, **kw):
    return dict({"name": name, "tag": name, "kind": kind, "host": host, "command": "cmd " + name,
                 "started": "2026-12-06T00:00:00", "ended": "2026-12-06T00:00:01"}, **kw)


def command_output(stdout, rc=0):
    return {"rc": rc, "stdout": stdout, "stderr": "", "start": "s", "end": "e"}


def gemm_run(raw, platform):
    run = raw / "gemm" / "gemm-20261206T000000Z"
    run.mkdir(parents=True)
    result = {"record": {"platform": platform, "results": [
        {"n": 96, "gflops": 1.234, "verification": {"passed": True}}]}}
    (run / "vca-node0.json").write_text(json.dumps({"host": "vca-node0", "opencl": result, "cpu": result}))


def make(tmp_path, checks, platforms, secrets=()):
    raw = tmp_path / "bundle" / "raw"
    raw.mkdir(parents=True)
    return raw, lambda: build(checks, platforms, tmp_path / "bundle", {
        "host": "vca-host", "inventory": "inventory/lab", "generated": "2026-12-06T00:00:00Z",
        "generated_by": "playbooks/verify-hardware.yml"}, set(secrets))


def test_a_card_only_check_is_skipped_off_a_card_even_when_its_command_would_pass(tmp_path):
    out = command_output("BOOT_IMAGE=/vmlinuz root=PARTUUID=abc console=ttyS0")
    _, run = make(tmp_path, [check("image_esp_boot", "node_command", "vca-node0", output=out,
                                   expect=["root=PARTUUID="])], {"vca-node0": LAB})
    [c] = run()["checks"]
    assert c["result"] == "skipped" and c["reason"].startswith("needs hardware"), c


def test_on_a_card_the_image_checks_pass_or_fail_by_their_output(tmp_path):
    checks = [check("image_esp_boot", "node_command", "vca-node0",
                    output=command_output("root=PARTUUID=abc console=ttyS0"), expect=["root=PARTUUID="]),
              check("image_root_partuuid", "node_command", "vca-node0",
                    output=command_output("/dev/vda2"), expect=["^/dev/vcablk0p2$"]),
              check("image_volatile_boot", "node_command", "vca-node0",
                    output={"skipped": True, "skip_reason": "by hand: docs/SETUP.md"})]
    _, run = make(tmp_path, checks, {"vca-node0": CARD})
    results = {c["name"]: (c["result"], c["reason"]) for c in run()["checks"]}
    assert results == {"image_esp_boot": ("pass", ""),
                       "image_root_partuuid": ("fail", "not in the output (platform hardware): ^/dev/vcablk0p2$"),
                       "image_volatile_boot": ("skipped", "by hand: docs/SETUP.md")}


def test_off_a_card_an_image_check_that_ran_and_failed_is_a_failure_and_the_rollback_is_judged(tmp_path):
    checks = [check("image_root_partuuid", "node_command", "vca-node0",
                    output=command_output("overlay"), expect=["^/dev/vcablk0p2$"]),
              check("image_esp_boot", "node_command", "vca-node0",
                    output={"skipped": True, "skip_reason": "Conditional result was False"}),
              check("image_rollback", "node_rollback", "vca-node0",
                    output={"rolled_back": True, "booted": True, "build_id": "b1", "from": "b2"}),
              check("image_rollback_none", "node_rollback", "vca-node1",
                    output={"rolled_back": False, "booted": False, "reason": "no previous disk"}),
              check("image_rollback_off", "node_rollback", "vca-node1",
                    output={"rolled_back": True, "booted": False, "reason": "booting it failed: x"})]
    _, run = make(tmp_path, checks, {"vca-node0": LAB, "vca-node1": LAB})
    results = {c["name"]: (c["result"], c["reason"]) for c in run()["checks"]}
    assert results["image_root_partuuid"] == ("fail", "not in the output (platform lab): ^/dev/vcablk0p2$")
    assert results["image_esp_boot"][0] == "skipped" and results["image_esp_boot"][1].startswith("needs hardware")
    assert results["image_rollback"] == ("pass", "back on build b1 (from b2), booted")
    assert results["image_rollback_none"] == ("fail", "no previous disk")
    assert results["image_rollback_off"] == ("fail", "booting it failed: x")


def test_figures_carry_their_platform_and_the_dma_without_an_engine_is_skipped(tmp_path):
    raw, run = make(tmp_path, [check("gemm", "gemm", output={"rc": 0}), check("dma", "dma", output={"rc": 0})],
                    {"vca-node0": LAB})
    gemm_run(raw, "lab")
    (raw / "dma" / "dma-20261206T000000Z").mkdir(parents=True)
    (raw / "dma" / "dma-20261206T000000Z" / "vca-node0.json").write_text(json.dumps(
        {"host": "vca-node0", "result": {"msg": "no PLX DMA engine bound to vca_dma"}}))
    bundle = run()
    gemm, dma = bundle["checks"]
    assert gemm["result"] == "pass" and gemm["platform"] == "lab"
    assert [(f["what"], f["value"], f["platform"]) for f in gemm["figures"]] == [
        ("vca-node0 OpenCL SGEMM 96", 1.2, "lab"), ("vca-node0 CPU SGEMM 96", 1.2, "lab")]
    assert gemm["raw"] == ["raw/gemm/gemm-20261206T000000Z/vca-node0.json"]
    assert dma["result"] == "skipped" and dma["reason"].startswith("needs hardware"), dma
    assert dma["platform"] == "lab" and set(dma["platform_evidence"]) == {"vca-node0"}    # the fleet's label
    assert bundle["counts"] == {"pass": 1, "fail": 0, "skipped": 1}
    jsonschema.validate(bundle, SCHEMA)


def test_rapl_is_checked_against_the_inventorys_caps(tmp_path):
    reading = {"platform": "lab", "package_power_w": 21.04,
               "limits": {"long_term": {"power_limit_w": 45.0}, "short_term": {"power_limit_w": 56.25}}}
    capped = dict(reading, limits={"long_term": {"power_limit_w": 35.0}, "short_term": {"power_limit_w": 40.0}})
    rapl = check("rapl", "rapl", output={"vca-node0": reading, "vca-node4": capped},
                 expect_caps={"vca-node0": {"long_term": None, "short_term": None},
                              "vca-node4": {"long_term": 35, "short_term": 45}})
    _, run = make(tmp_path, [rapl], {"vca-node0": LAB, "vca-node4": LAB})
    [c] = run()["checks"]
    assert c["result"] == "fail" and c["reason"] == "vca-node4 short_term is 40.0 W, the inventory says 45 W"
    assert ("vca-node4 PL1", 35.0, "lab") in [(f["what"], f["value"], f["platform"]) for f in c["figures"]]


def test_the_services_pass_only_on_what_their_scripts_saw(tmp_path):
    farm = check("farm_example", "farm_job", "vca-host", label="lab", output=command_output(
        '{"ok": true, "job": "j1", "frames": 90, "seconds": 41.5, "reason": ""}'))
    smem = check("smem_search", "smem_search", "vca-host", label="lab", output=command_output(
        '{"found": false, "reason": "the sentence was not found (HTTP 200)"}', rc=1))
    _, run = make(tmp_path, [farm, smem], {"vca-host": LAB})
    f, s = run()["checks"]
    assert f["result"] == "pass" and ("example job frames", 90, "lab") == tuple(
        f["figures"][0][k] for k in ("what", "value", "platform"))
    assert s["result"] == "fail" and s["reason"] == "the sentence was not found (HTTP 200)"


def test_no_secret_in_any_file_of_the_bundle(tmp_path):
    creds = tmp_path / "credentials"
    creds.mkdir()
    (creds / "vcamon-agent-vca-node0").write_text(TOKEN + "\n")
    (creds / "lane-keys.json").write_text(json.dumps({"vca-node0": "k3yK3yK3yK3yK3y"}))   # a key map: host -> key
    leaky = command_output("token=%s\n%s\nkey k3yK3yK3yK3yK3y\n" % (TOKEN, KEY))
    _, run = make(tmp_path, [check("image_esp_boot", "node_command", "vca-node0", output=leaky,
                                   expect=["nothing"])], {"vca-node0": CARD}, secrets_from([creds]))
    bundle = run()
    files = [p for p in (tmp_path / "bundle").rglob("*") if p.is_file()]
    assert len(files) >= 3
    for f in files:
        text = f.read_text()
        assert TOKEN not in text and "k3yK3yK3yK3yK3y" not in text and "PRIVATE KEY" not in text, f
    assert "[redacted]" in (tmp_path / "bundle/raw/image_esp_boot.stdout.txt").read_text()
    assert bundle["checks"][0]["result"] == "fail"
    assert bundle["checks"][0]["host"] == "vca-node0"          # a key map's host names are not secrets


def test_scrub_replaces_the_longest_secret_first():
    assert scrub("abcdefgh12345678", {"abcdefgh", "abcdefgh12345678"}) == "[redacted]"


def test_the_schema_refuses_a_skip_without_its_reason(tmp_path):
    _, run = make(tmp_path, [check("dma", "dma", output={"rc": 0})], {})
    bundle = run()
    bundle["checks"][0]["reason"] = ""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bundle, SCHEMA)


def test_a_check_the_run_did_not_reach_is_skipped_with_why(tmp_path):
    stop = {"skipped": True, "skip_reason": "an image check failed on vca-node0 (image_esp_boot)"}
    _, run = make(tmp_path, [check("gemm", "gemm", output=stop), check("capacity", "capacity", output=stop)],
                  {"vca-node0": CARD})
    assert [(c["result"], c["reason"]) for c in run()["checks"]] == [("skipped", stop["skip_reason"])] * 2


SELFTEST = "result=0 mibps=3900 bytes=1048576\n"
WRITTEN_BACK = ("cookie=1 status=0 bytes=1048576 descriptors=1 first_wb=0x40100000 last_wb=0x40100000 "
                "ctrl=0x0c0a6044 intr=0x00000000\n")


def first_copy(last_copy=WRITTEN_BACK, selftest=SELFTEST, engines=("0000:03:00.1",)):
    return check("dma_first_copy", "dma_first_copy", "vca-host",
                 output={"rc": 0, "engines": list(engines), "selftest": selftest, "last_copy": last_copy})


def test_the_first_copy_passes_on_a_card_with_the_engines_write_back_words_in_the_bundle(tmp_path):
    _, run = make(tmp_path, [first_copy()], {"vca-host": CARD})
    bundle = run()
    [c] = bundle["checks"]
    assert c["result"] == "pass" and "write-back 0x40100000" in c["reason"], c
    assert c["figures"] == [{"what": "0000:03:00.1 self-test", "value": 3900, "unit": "MiB/s",
                             "platform": "hardware"}]
    jsonschema.validate(bundle, SCHEMA)


@pytest.mark.parametrize("last_copy,why", [
    (WRITTEN_BACK.replace("last_wb=0x40100000", "last_wb=0x80100000"), "VALID still set"),
    (WRITTEN_BACK.replace("last_wb=0x40100000", "last_wb=0x10000000"), "no success bit"),
    (WRITTEN_BACK.replace("last_wb=0x40100000", "last_wb=0x400ffff0"), "1048560 bytes written back"),
    (WRITTEN_BACK.replace("status=0", "status=-5"), "copy status -5"),
    ("none\n", "no self-test result"),
])
def test_the_first_copy_fails_on_what_the_engine_wrote_back(tmp_path, last_copy, why):
    _, run = make(tmp_path, [first_copy(last_copy)], {"vca-host": CARD})
    [c] = run()["checks"]
    assert c["result"] == "fail" and why in c["reason"], c


def test_the_first_copy_without_an_engine_or_off_a_card_is_skipped(tmp_path):
    _, run = make(tmp_path, [first_copy(engines=())], {"vca-host": LAB})
    assert run()["checks"][0]["result"] == "skipped"
    _, run = make(tmp_path / "lab", [first_copy()], {"vca-host": LAB})
    [c] = run()["checks"]
    assert c["result"] == "skipped" and c["reason"].startswith("needs hardware"), c
