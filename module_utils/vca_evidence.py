"""The hardware evidence bundle (playbooks/verify-hardware.yml): one record per check, its raw outputs
beside it, a SUMMARY.md an owner can paste into an issue, and no secret anywhere in it.

A record: {name, tag, host, command, started, ended, result: pass|fail|skipped, reason, figures: [{what,
value, unit, platform}], platform, platform_evidence, raw: [file names]}. What the playbook hands in for each
check is the check's kind and what its task returned; the verdict is made here, by kind, so that a check that
needs a card can never pass without one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

SCHEMA_VERSION = 1
NEEDS_HARDWARE = "needs hardware"
PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)
REDACTED = "[redacted]"
MIN_SECRET = 12     # shorter pieces are not secrets: they would redact host names and ordinary words


# -- secrets ---------------------------------------------------------------------------------------

def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    elif isinstance(value, str):
        yield value


def _pieces(text):
    """A JSON file's string values (a key map's keys are host names); any other file's content, lines and words."""
    try:
        return list(_leaves(json.loads(text)))
    except ValueError:
        return [text.strip(), *text.splitlines(), *text.split()]


def secrets_from(paths):
    """Every secret held in these files or directories (the controller's credentials): each file's content,
    each line of it and each word of a line (a key file reads "key\\n"), or a JSON file's values."""
    found = set()
    for path in map(Path, paths):
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
        for f in files:
            try:
                text = f.read_text(errors="replace")
            except OSError:
                continue
            found.update(p.strip() for p in _pieces(text) if len(p.strip()) >= MIN_SECRET)
    return found


def scrub(text, secrets):
    """text with every private key block and every known secret replaced; longest first."""
    text = PRIVATE_KEY.sub(REDACTED, text)
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return text


# -- verdicts, by kind -----------------------------------------------------------------------------

def _skipped(reason):
    return {"result": "skipped", "reason": reason, "figures": []}


def _failed(reason, figures=()):
    return {"result": "fail", "reason": reason, "figures": list(figures)}


def _passed(figures=(), reason=""):
    return {"result": "pass", "reason": reason, "figures": list(figures)}


def verdict_node_command(check, platform):
    """A command on a node that only a card can answer (the image checks): pass when it exited 0 and
    every expected pattern is in its output. Off a card, a run that failed is a failure, and a pass is
    still "needs hardware": the lab cannot prove what a card's firmware does."""
    out = check.get("output") or {}
    if out.get("skipped"):
        return _skipped("%s (platform %s)" % (NEEDS_HARDWARE, platform) if platform != "hardware"
                        else out.get("skip_reason") or "not run")
    if out.get("rc") != 0:
        return _failed("exit %s on platform %s: %s" % (out.get("rc"), platform,
                                                       (out.get("stderr") or "").strip()[-300:]))
    missing = [p for p in check.get("expect", []) if not re.search(p, out.get("stdout") or "", re.M)]
    if missing:
        return _failed("not in the output (platform %s): %s" % (platform, "; ".join(missing)))
    if platform != "hardware":
        return _skipped("%s (platform %s; it passed there, which proves nothing)" % (NEEDS_HARDWARE, platform))
    return _passed()


def verdict_node_rollback(check):
    """The chosen node put back on its previous disk after a failed image check, and booted."""
    out = check.get("output") or {}
    if out.get("rolled_back") and out.get("booted"):
        return _passed(reason="back on build %s (from %s), booted" % (out.get("build_id"), out.get("from")))
    return _failed(out.get("reason") or "not rolled back")


def _gemm_figure(host, side, res):
    record = (res or {}).get("record") or {}
    results = record.get("results") or []
    if not results:
        return None
    return {"what": "%s %s SGEMM %d" % (host, side, results[-1].get("n", 0)), "value": round(results[-1]["gflops"], 1),
            "unit": "GFLOP/s", "platform": record.get("platform", "unknown"),
            "verified": all(r.get("verification", {}).get("passed") for r in results)}


def verdict_gemm(check, run_dir):
    """GEMM through playbooks/bench/gemm.yml: one figure per node and side, each verified."""
    out = check.get("output") or {}
    if out.get("rc") != 0:
        return _failed("playbooks/bench/gemm.yml exited %s" % out.get("rc"))
    figures, problems = [], []
    for f in sorted(Path(run_dir).glob("gemm-*/*.json")):
        rec = json.loads(f.read_text())
        for side, key in (("OpenCL", "opencl"), ("CPU", "cpu")):
            fig = _gemm_figure(rec.get("host", f.stem), side, rec.get(key))
            if fig is None:
                problems.append("%s %s: %s" % (f.stem, side, (rec.get(key) or {}).get("aborted") or "no result"))
            elif not fig.pop("verified"):
                problems.append("%s %s: not verified" % (f.stem, side))
            else:
                figures.append(fig)
    if problems or not figures:
        return _failed("; ".join(problems) or "no record", figures)
    return _passed(figures)


def verdict_dma(check, run_dir):
    """The DMA matrix, one machine at a time: where no engine is bound (anything but a card) it is skipped."""
    out = check.get("output") or {}
    if out.get("rc") != 0:
        return _failed("playbooks/bench/dma.yml exited %s" % out.get("rc"))
    figures, unsupported, problems = [], [], []
    for f in sorted(Path(run_dir).glob("dma-*/*.json")):
        if f.name == "ring.json":
            continue
        rec = json.loads(f.read_text())
        res = rec.get("result") or {}
        record = res.get("record")
        if not record:
            (unsupported if not res.get("failed") else problems).append(
                "%s: %s" % (rec.get("host", f.stem), res.get("msg") or res.get("aborted") or "no engine"))
            continue
        for engine in record.get("engines", []):
            for leg in engine.get("legs", []):
                if leg.get("mibps") is None:
                    problems.append("%s %s->%s: %s" % (f.stem, leg.get("from"), leg.get("to"), leg.get("reason")))
                else:
                    figures.append({"what": "%s %s->%s" % (f.stem, leg.get("from"), leg.get("to")),
                                    "value": round(leg["mibps"]), "unit": "MiB/s", "platform": record.get("platform")})
    if problems:
        return _failed("; ".join(problems), figures)
    if not figures:
        return _skipped("%s: no PLX DMA engine bound to vca_dma (%s)" % (NEEDS_HARDWARE, "; ".join(unsupported)))
    return _passed(figures)


DESC_VALID, DESC_WB_SUCCESS, DESC_SIZE_MASK = 1 << 31, 1 << 30, (1 << 27) - 1   # vca_dma_regs.h


def _attr_fields(text):
    """The key=value pairs of a vca_dma sysfs attribute ({} for "none" or nothing)."""
    return dict(kv.split("=", 1) for kv in (text or "").split() if "=" in kv)


def verdict_dma_first_copy(check, platform):
    """The driver's self-test, the first copy on the card, with the words the engine wrote back (its
    last_copy attribute): a pass needs the self-test to have compared every byte, the copy to have
    ended with status 0, and its descriptor back with VALID clear, the success bit set and the size
    field the whole copy (one descriptor: the self-test is under 2^27 bytes)."""
    out = check.get("output") or {}
    if not out.get("engines"):
        return _skipped("%s: no PLX DMA engine bound to vca_dma (platform %s)" % (NEEDS_HARDWARE, platform))
    test, last = _attr_fields(out.get("selftest")), _attr_fields(out.get("last_copy"))
    try:
        result, want = int(test["result"]), int(test["bytes"])
        status, moved, wb = int(last["status"]), int(last["bytes"]), int(last["last_wb"], 16)
    except (KeyError, ValueError):
        return _failed("no self-test result or write-back words (selftest %r, last_copy %r, exit %s)"
                       % (out.get("selftest"), out.get("last_copy"), out.get("rc")))
    words = "write-back %s, ctrl %s, intr %s" % (last["last_wb"], last.get("ctrl"), last.get("intr"))
    mibps = int(test.get("mibps", "0"))
    figures = [{"what": "%s self-test" % out["engines"][0], "value": mibps, "unit": "MiB/s",
                "platform": platform}] if result == 0 and mibps else []
    problems = ["self-test result %d" % result] if result else []
    if status:
        problems.append("copy status %d" % status)
    if wb & DESC_VALID:
        problems.append("the engine never wrote the descriptor back (VALID still set)")
    elif not wb & DESC_WB_SUCCESS:
        problems.append("no success bit in the write-back (bit 29: the read failed, bit 28: the write)")
    if (wb & DESC_SIZE_MASK) != want or moved != want:
        problems.append("%d bytes written back of %d" % (wb & DESC_SIZE_MASK, want))
    if problems:
        return _failed("%s (%s)" % ("; ".join(problems), words), figures)
    if platform != "hardware":
        return _skipped("%s (platform %s; %s)" % (NEEDS_HARDWARE, platform, words))
    return _passed(figures, reason=words)


def verdict_capacity(check, run_dir):
    out = check.get("output") or {}
    if out.get("skipped"):
        return _skipped(out.get("skip_reason") or "not run")
    if out.get("rc") != 0:
        return _failed("playbooks/bench/capacity.yml exited %s" % out.get("rc"))
    records = sorted(Path(run_dir).glob("capacity-*/record.json"))
    if not records:
        return _failed("no capacity record")
    record = json.loads(records[-1].read_text())
    figures = [{"what": leg["setup"], "value": round(leg["tok_s"], 1), "unit": "tok/s",
                "platform": leg.get("platform") or record.get("platform")}
               for leg in record.get("legs", []) if leg.get("tok_s") is not None]
    return _passed(figures) if figures else _failed("no leg gave a figure")


def verdict_rapl(check, platforms):
    """RAPL as the kernel reports it on each live node: package power and the PL1/PL2 in force, against
    the inventory's caps where it names them."""
    figures, problems = [], []
    for host, res in sorted((check.get("output") or {}).items()):
        if not res or res.get("failed"):
            problems.append("%s: %s" % (host, (res or {}).get("msg", "no reading")))
            continue
        label = res.get("platform", platforms.get(host, {}).get("platform", "unknown"))
        if res.get("package_power_w") is not None:
            figures.append({"what": host + " package power", "value": round(res["package_power_w"], 1),
                            "unit": "W", "platform": label})
        limits = {k: (v or {}).get("power_limit_w") for k, v in (res.get("limits") or {}).items()}
        for name in ("long_term", "short_term"):
            if limits.get(name) is not None:
                figures.append({"what": "%s %s" % (host, {"long_term": "PL1", "short_term": "PL2"}[name]),
                                "value": limits[name], "unit": "W", "platform": label})
        want = (check.get("expect_caps") or {}).get(host) or {}
        for name, watts in want.items():
            if watts is not None and limits.get(name) is not None and abs(limits[name] - float(watts)) > 0.01:
                problems.append("%s %s is %s W, the inventory says %s W" % (host, name, limits[name], watts))
    if problems:
        return _failed("; ".join(problems), figures)
    return _passed(figures) if figures else _failed("no RAPL reading")


def verdict_json_command(check, ok_key, figures_of):
    """A command on the host that prints one JSON object (the farm's example, smem's search)."""
    out = check.get("output") or {}
    if out.get("skipped"):
        return _skipped(out.get("skip_reason") or "not run")
    try:
        data = json.loads((out.get("stdout") or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return _failed("exit %s: %s" % (out.get("rc"), (out.get("stderr") or out.get("stdout") or "").strip()[-300:]))
    figures = figures_of(data)
    if out.get("rc") != 0 or not data.get(ok_key):
        return _failed(data.get("reason") or "exit %s" % out.get("rc"), figures)
    return _passed(figures)


def _farm_figures(check):
    return lambda d: [
        {"what": "example job frames", "value": d.get("frames"), "unit": "frames", "platform": check["label"]},
        {"what": "example job wall time", "value": d.get("seconds"), "unit": "s", "platform": check["label"]},
    ] if d.get("ok") else []


def _smem_figures(check):
    return lambda d: [{"what": "search through the lanes", "value": d.get("search_ms"), "unit": "ms",
                       "platform": check["label"]}] if d.get("found") else []


VERDICTS = {
    "node_command": lambda c, platforms, raw: verdict_node_command(
        c, platforms.get(c.get("host"), {}).get("platform", "unknown")),
    "node_rollback": lambda c, platforms, raw: verdict_node_rollback(c),
    "gemm": lambda c, platforms, raw: verdict_gemm(c, raw / c["name"]),
    "dma": lambda c, platforms, raw: verdict_dma(c, raw / c["name"]),
    "dma_first_copy": lambda c, platforms, raw: verdict_dma_first_copy(
        c, platforms.get(c.get("host"), {}).get("platform", "unknown")),
    "capacity": lambda c, platforms, raw: verdict_capacity(c, raw / c["name"]),
    "rapl": lambda c, platforms, raw: verdict_rapl(c, platforms),
    "farm_job": lambda c, platforms, raw: verdict_json_command(c, "ok", _farm_figures(c)),
    "smem_search": lambda c, platforms, raw: verdict_json_command(c, "found", _smem_figures(c)),
}


def verdict(check, platforms, raw_dir):
    if check["kind"] not in VERDICTS:
        raise ValueError("unknown check kind %r" % check["kind"])
    out = check.get("output")
    if check["kind"] not in ("node_command", "node_rollback") and isinstance(out, dict) and out.get("skipped"):
        return _skipped(out.get("skip_reason") or "not run")     # a card-only check says needs hardware first
    label = check.get("label") or "unknown"          # the platform of the machines a service check ran on
    label = "mixed: " + label if "," in label else label
    return VERDICTS[check["kind"]](dict(check, label=label), platforms, raw_dir)


# -- the bundle ------------------------------------------------------------------------------------

def _raw_files(check, raw_dir):
    """The check's raw outputs, as written beside the bundle (the nested runs wrote their own)."""
    names = []
    out = check.get("output") or {}
    for stream in ("stdout", "stderr"):
        if isinstance(out, dict) and out.get(stream):
            name = "%s.%s.txt" % (check["name"], stream)
            (raw_dir / name).write_text(out[stream])
            names.append(name)
    if check["kind"] == "rapl":
        name = check["name"] + ".json"
        (raw_dir / name).write_text(json.dumps(out, indent=1, sort_keys=True))
        names.append(name)
    sub = raw_dir / check["name"]
    if sub.is_dir():
        names += sorted(str(p.relative_to(raw_dir)) for p in sub.rglob("*") if p.is_file())
    return names


def platform_of(figures, host_platform):
    labels = sorted({f.get("platform") or "unknown" for f in figures})
    if not labels:
        return host_platform
    return labels[0] if len(labels) == 1 else "mixed: " + ", ".join(labels)


def build(checks, platforms, out_dir, meta, secrets):
    """Write bundle.json, raw/ and SUMMARY.md under out_dir (scrubbed); return the bundle."""
    out_dir = Path(out_dir)
    raw_dir = out_dir / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for check in checks:
        v = verdict(check, platforms, raw_dir)
        # a check of the whole fleet (no one host) is labelled with every live machine's platform
        fleet = platform_of([{"platform": p.get("platform")} for p in platforms.values()], "unknown")
        where = platforms.get(check["host"], {}).get("platform", "unknown") if check.get("host") else fleet
        records.append({
            "name": check["name"], "tag": check["tag"], "host": check.get("host"), "command": check["command"],
            "started": check["started"], "ended": check["ended"], "result": v["result"], "reason": v["reason"],
            "figures": v["figures"],
            "platform": platform_of(v["figures"], where),
            "platform_evidence": {h: p.get("platform_evidence") for h, p in platforms.items()
                                  if h == check.get("host") or not check.get("host")},
            "raw": ["raw/" + n for n in _raw_files(check, raw_dir)],
        })
    bundle = dict(meta, schema_version=SCHEMA_VERSION, checks=records,
                  counts={r: sum(1 for c in records if c["result"] == r) for r in ("pass", "fail", "skipped")})
    for f in raw_dir.rglob("*"):
        if f.is_file():
            f.write_text(scrub(f.read_text(errors="replace"), secrets))
    (out_dir / "bundle.json").write_text(scrub(json.dumps(bundle, indent=1, sort_keys=True), secrets) + "\n")
    (out_dir / "SUMMARY.md").write_text(scrub(summary(bundle), secrets))
    for f in [out_dir / "bundle.json", out_dir / "SUMMARY.md", *raw_dir.rglob("*")]:
        if f.is_file():
            os.chmod(f, 0o644)
    return json.loads((out_dir / "bundle.json").read_text())


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def summary(bundle):
    lines = ["# Hardware evidence: %s, %s" % (bundle["host"], bundle["generated"]), "",
             "%(pass)d passed, %(fail)d failed, %(skipped)d skipped." % bundle["counts"], "",
             "| check | tag | result | figures | platform | reason |", "|---|---|---|---|---|---|"]
    for c in bundle["checks"]:
        figures = "; ".join("%s %s %s" % (f["what"], f["value"], f["unit"]) for f in c["figures"][:6])
        if len(c["figures"]) > 6:
            figures += "; and %d more (bundle.json)" % (len(c["figures"]) - 6)
        lines.append("| %s | %s | %s | %s | %s | %s |" % tuple(_cell(x) for x in (
            c["name"], c["tag"], c["result"], figures or "-", c["platform"], c["reason"] or "")))
    lines += ["", "Figures labelled `lab` come from the lab simulator and the lab's small models: they show that the",
              "check works, never what a card does. Send this file and bundle.json; raw/ holds every output."]
    return "\n".join(lines) + "\n"
