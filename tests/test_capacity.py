"""The additive-capacity benchmark's logic (module_utils/vca_capacity.py, library/vca_capacity.py,
library/vca_energy.py, the locustfile and the table template of playbooks/bench).

Locust's output is the real thing: a headless Locust run of a few seconds against a small HTTP
server on 127.0.0.1 that answers like llama-server's /v1/chat/completions."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import jinja2
import numpy as np
import pytest
import yaml
from ansible.module_utils import vca_capacity as cap
from ansible.module_utils.vca_sysfs import Sysfs

from conftest import ROOT, run_module

BENCH = ROOT / "playbooks" / "bench"
LOCUSTFILE = BENCH / "files" / "capacity_locustfile.py"
LOCUST = Path(sys.executable).with_name("locust")

MAX = 262143328850   # a RAPL package zone's max_energy_range_uj (the simulator's)


def snap(energy, t, max_range=MAX, zone="class/powercap/intel-rapl:0", label="lab"):
    return {"t": t, "platform": label, "zone": zone, "energy_uj": energy, "max_energy_range_uj": max_range,
            "reason": None}


def no_counter(t, label="unknown"):
    return {"t": t, "platform": label, "zone": None, "energy_uj": None, "max_energy_range_uj": None,
            "reason": "no RAPL package-0 zone under /x"}


# --- energy -------------------------------------------------------------------------------------

def test_machine_energy_across_a_wrap():
    # 2 J before the top of the range, 3 J after it: 5 J, not a negative spike
    e = cap.machine_energy(snap(MAX - 2_000_000, 100.0), snap(3_000_000, 110.0))
    assert e["joules"] == pytest.approx(5.0)
    assert e["watts"] == pytest.approx(0.5)
    plain = cap.machine_energy(snap(1_000_000, 100.0), snap(41_000_000, 120.0))
    assert plain["joules"] == pytest.approx(40.0) and plain["seconds"] == pytest.approx(20.0)


def test_leg_energy_sums_and_a_missing_counter_is_no_figure():
    before = {"a": snap(0, 0.0), "b": snap(MAX - 1_000_000, 0.0), "h": no_counter(0.0)}
    after = {"a": snap(10_000_000, 10.0), "b": snap(9_000_000, 10.0), "h": no_counter(10.0)}
    two = cap.leg_energy(["a", "b"], before, after)
    assert two["joules"] == pytest.approx(20.0) and two["watts"] == pytest.approx(2.0)
    assert two["missing"] == {}
    three = cap.leg_energy(["h", "a", "b"], before, after)
    assert three["joules"] is None and three["watts"] is None     # not 20 J: the host was not measured
    assert list(three["missing"]) == ["h"] and "no energy counter" in three["missing"]["h"]
    assert three["machines"]["a"]["joules"] == pytest.approx(10.0)
    # a machine with no snapshot at all (it failed) is missing too
    assert cap.leg_energy(["a", "z"], before, after)["missing"] == {"z": "no before snapshot"}


def test_a_counter_that_changed_between_readings_is_no_figure():
    e = cap.machine_energy(snap(0, 0.0), snap(10, 1.0, max_range=MAX // 2))
    assert e["joules"] is None and "changed" in e["reason"]
    assert cap.machine_energy(snap(0, 5.0), snap(10, 5.0))["joules"] is None   # time did not advance


def test_energy_snapshot_of_the_simulated_tree_and_of_a_host_without_rapl(sim_tree, tmp_path):
    (sim_tree.rapl / "energy_uj").write_text("123456789\n")
    s = cap.energy_snapshot(Sysfs(str(sim_tree.root)), clock=lambda: 42.0)
    assert s["zone"] == "class/powercap/intel-rapl:0"
    assert s["energy_uj"] == 123456789
    assert s["max_energy_range_uj"] == int((sim_tree.rapl / "max_energy_range_uj").read_text())
    assert s["platform"] == "lab" and s["t"] == 42.0 and s["reason"] is None
    bare = tmp_path / "bare"
    bare.mkdir()
    h = cap.energy_snapshot(Sysfs(str(bare)))
    assert h["energy_uj"] is None and h["zone"] is None and "no RAPL package-0 zone" in h["reason"]
    assert h["platform"] == "unknown"


def test_every_package_of_a_two_socket_machine_is_read_and_summed(sim_tree):
    """(issue 46) package-0 alone left a two-socket host's second socket out of every figure."""
    second = sim_tree.rapl.parent / "intel-rapl:1"
    second.mkdir()
    (second / "name").write_text("package-1\n")
    (second / "max_energy_range_uj").write_text("%d\n" % MAX)
    (sim_tree.rapl / "energy_uj").write_text("1000000\n")
    (second / "energy_uj").write_text("%d\n" % (MAX - 1_000_000))          # about to wrap
    sysfs = Sysfs(str(sim_tree.root))
    before = cap.energy_snapshot(sysfs, clock=lambda: 0.0)
    assert sorted(before["zones"]) == ["class/powercap/intel-rapl:0", "class/powercap/intel-rapl:1"]
    (sim_tree.rapl / "energy_uj").write_text("11000000\n")                 # +10 J
    (second / "energy_uj").write_text("4000000\n")                         # +5 J across the wrap
    e = cap.machine_energy(before, cap.energy_snapshot(sysfs, clock=lambda: 10.0))
    assert e["joules"] == pytest.approx(15.0) and e["watts"] == pytest.approx(1.5)
    (second / "energy_uj").write_text("")                                   # one package unreadable:
    assert cap.energy_snapshot(sysfs)["energy_uj"] is None                  # no figure for the machine


def test_vca_energy_module(sim_tree, capsys):
    (sim_tree.rapl / "energy_uj").write_text("777\n")
    out = run_module("vca_energy", {"sysfs_root": str(sim_tree.root)}, capsys)
    assert not out.get("failed") and out["changed"] is False
    assert out["snapshot"]["energy_uj"] == 777 and out["snapshot"]["platform"] == "lab"


# --- percentiles --------------------------------------------------------------------------------

def test_percentile_is_numpys_linear_one():
    rng = np.random.default_rng(16)
    values = [*rng.exponential(300.0, size=101), 5000.0]
    for q in (0, 50, 90, 95, 99, 100):
        assert cap.percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert cap.percentile([], 50) is None
    assert cap.percentile([10, 20], 50) == 15.0
    with pytest.raises(ValueError):
        cap.percentile([1], 101)


def test_histogram_percentile_is_locusts_rule():
    # Locust's own function, in a process of its own: importing locust monkey-patches (gevent)
    # the whole interpreter, which would then run every later test on gevent's sockets.
    hist = {"10": 50, "20": 30, "300": 15, "4000": 5}
    qs = (50, 66, 90, 95, 99)
    theirs = json.loads(subprocess.run(
        [sys.executable, "-c", "import json, sys\n"
         "from locust.stats import calculate_response_time_percentile as p\n"
         "hist, qs = json.loads(sys.argv[1]), json.loads(sys.argv[2])\n"
         "print(json.dumps([p({int(k): v for k, v in hist.items()}, 100, q / 100.0) for q in qs]))",
         json.dumps(hist), json.dumps(qs)], capture_output=True, text=True, check=True).stdout)
    assert [cap.histogram_percentile(hist, q) for q in qs] == theirs
    assert cap.histogram_percentile(hist, 90) == 300.0
    assert cap.histogram_percentile(hist, 95) == 4000.0    # Locust's rule: 95 of 100 must lie below it
    assert cap.histogram_percentile({}, 50) is None


# --- a real Locust run against a llama-server look-alike -----------------------------------------

class FakeLlama(BaseHTTPRequestHandler):
    """Answers like llama-server: usage.completion_tokens = 3 + (request number % 5); every 7th
    answer has no usage (it must count as a failure, not as zero tokens). With a token set, a
    request without the bearer gets 401, as HAProxy with llm_workers_token does."""
    protocol_version = "HTTP/1.1"
    token = ""
    lock = threading.Lock()
    served = []

    def log_message(self, *_args):
        pass

    def _send(self, code, body, worker=None):
        data = json.dumps(body).encode()
        self.send_response(code)
        if worker:
            self.send_header("X-LLM-Worker", worker)   # as HAProxy in front of the workers does
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, req):
        """As llama-server streams: a first token after FIRST_TOKEN_S, the others 10 ms apart, then a last
        event with usage (asked for with stream_options) and [DONE], chunked."""
        with self.lock:
            n = len(self.served)
            tokens = min(3 + n % 5, req["max_tokens"])
            self.served.append((tokens, False))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(obj):
            if isinstance(obj, dict):   # llama-server's fields: an event is some 200 bytes, as there
                obj = dict(obj, id="chatcmpl-%032d" % n, object="chat.completion.chunk", model="fake",
                           system_fingerprint="b0000-fake")
            data = b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        threading.Event().wait(0.05)            # the role event in a packet of its own, not with the headers
        event({"choices": [{"delta": {"role": "assistant"}}]})
        threading.Event().wait(self.FIRST_TOKEN_S)
        for _ in range(tokens):
            event({"choices": [{"delta": {"content": "x "}}]})
            threading.Event().wait(0.01)
        if (req.get("stream_options") or {}).get("include_usage"):
            event({"choices": [], "usage": {"completion_tokens": tokens, "prompt_tokens": 11}})
        event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    FIRST_TOKEN_S = 0.5

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if self.token and self.headers.get("Authorization") != "Bearer %s" % self.token:
            self._send(401, {"error": "unauthorized"})
            return
        if req.get("stream"):
            self._stream(req)
            return
        with self.lock:
            n = len(self.served)
            tokens = min(3 + n % 5, req["max_tokens"])
            self.served.append((tokens, n % 7 == 6))
        threading.Event().wait(0.01)
        if n % 7 == 6:
            self._send(200, {"choices": [{"message": {"role": "assistant", "content": "?"}}]})
            return
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": "x " * tokens}}],
                         "usage": {"completion_tokens": tokens, "prompt_tokens": 11, "total_tokens": tokens + 11},
                         "timings": {"predicted_n": tokens, "prompt_n": 11}}, worker="vca-node%d" % (n % 2))


@pytest.fixture
def fake_llama():
    FakeLlama.served = []
    FakeLlama.token = ""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeLlama)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def run_locust(url, out_dir, seconds=3, users=3, extra=()):
    argv = [str(LOCUST), "-f", str(LOCUSTFILE), "--headless", "--only-summary", "--skip-log-setup",
            "-u", str(users), "-r", str(users), "-t", "%ds" % seconds, "--stop-timeout", "10",
            "--host", url, "--json-file", str(out_dir / "locust"), "--csv", str(out_dir / "locust"),
            "--exit-code-on-error", "0", "--vca-tokens-file", str(out_dir / "tokens.json"),
            "--vca-max-tokens", "16", *extra]
    subprocess.run(argv, check=True, capture_output=True, timeout=60)
    return (out_dir / "locust.json").read_text(), (out_dir / "tokens.json").read_text()


def test_real_locust_run_counts_tokens_failures_and_latency(fake_llama, tmp_path):
    url = "http://127.0.0.1:%d" % fake_llama.server_address[1]
    stats_text, tokens_text = run_locust(url, tmp_path)
    served = list(FakeLlama.served)
    stats = cap.parse_locust_json(stats_text)
    load = cap.chat_load(stats_text, tokens_text)
    want_tokens = sum(t for t, no_usage in served if not no_usage)
    want_failures = sum(1 for _, no_usage in served if no_usage)
    assert len(served) > 20                        # it really ran for seconds
    assert stats["requests"] == len(served) == load["requests"]
    assert load["failures"] == want_failures > 0   # no usage = a failure, not zero tokens
    assert load["completion_tokens"] == want_tokens
    assert load["prompt_tokens"] == 11 * (len(served) - want_failures)
    assert load["consistent"] is True
    answered = [n for n, (_, no_usage) in enumerate(served) if not no_usage]
    assert load["workers"] == {w: sum(1 for n in answered if n % 2 == int(w[-1])) for w in ("vca-node0", "vca-node1")}
    assert 1.5 < load["seconds"] < 15             # test_start to test_stop, the users' stop included
    assert load["tok_s"] == pytest.approx(want_tokens / load["seconds"], rel=1e-3)
    assert 0 < load["p50_ms"] <= load["p95_ms"]
    # Locust's own p50 from its rounded histogram is close to the exact one
    assert load["locust"]["p50_ms"] == pytest.approx(load["p50_ms"], rel=0.5, abs=5)
    # Locust's final CSV row agrees on the count when it was written at the end
    entries = json.loads(stats_text)
    assert entries[0]["name"] == "chat" and entries[0]["method"] == "POST"


def test_a_streamed_run_times_the_first_token(fake_llama, tmp_path):
    """(issue 46) --vca-stream: every answer streamed, its time to first token (the server waits
    FIRST_TOKEN_S before it) apart from its whole time; tokens from the last event's usage."""
    url = "http://127.0.0.1:%d" % fake_llama.server_address[1]
    stats_text, tokens_text = run_locust(url, tmp_path, seconds=3, users=2, extra=("--vca-stream",))
    served = list(FakeLlama.served)
    load = cap.chat_load(stats_text, tokens_text)
    assert load["stream"] is True and load["requests"] == len(served) > 3 and load["failures"] == 0
    assert load["completion_tokens"] == sum(t for t, _ in served)
    first = FakeLlama.FIRST_TOKEN_S * 1000
    assert first <= load["ttft_p50_ms"] <= load["ttft_p95_ms"] < load["p95_ms"]
    assert load["ttft_p50_ms"] < load["p50_ms"]            # the first token comes before the last
    leg = cap.chat_leg({"name": "stream", "machines": ["vca-node0", "vca-node1"], "stream": True}, load, {}, {})
    assert leg["stream"] and leg["ttft_p50_ms"] == round(load["ttft_p50_ms"], 1)


def test_vca_capacity_chat_module_sends_the_token(fake_llama, capsys):
    FakeLlama.token = "s3cret"
    url = "http://127.0.0.1:%d" % fake_llama.server_address[1]
    args = {"action": "chat", "url": url, "locust": str(LOCUST), "locustfile": str(LOCUSTFILE), "users": 2,
            "duration_s": 2, "stop_timeout_s": 10, "max_tokens": 16}
    out = run_module("vca_capacity", dict(args, token="s3cret"), capsys)
    assert not out.get("failed"), out
    load = out["load"]
    assert load["requests"] == len(FakeLlama.served) > 5
    assert load["completion_tokens"] == sum(t for t, no in FakeLlama.served if not no) > 0
    assert "s3cret" not in json.dumps(out)
    FakeLlama.served = []
    wrong = run_module("vca_capacity", dict(args, token=""), capsys)["load"]   # 401 everywhere: no tokens
    assert wrong["completion_tokens"] == 0 and wrong["failures"] == wrong["requests"] > 0
    assert wrong["tok_s"] == 0


def test_token_file_must_be_the_locustfiles():
    with pytest.raises(ValueError):
        cap.token_summary({"format": "something else", "start": 1, "stop": 2, "samples": []})
    with pytest.raises(ValueError):
        cap.token_summary({"format": cap.TOKENS_FORMAT, "start": 2, "stop": 2, "samples": []})


# --- transcode ----------------------------------------------------------------------------------

PROGRESS = """frame=12
fps=0.00
progress=continue
frame=30
fps=29.1
out_time=00:00:01.000000
progress=end
"""


def test_ffmpeg_progress_and_fps():
    assert cap.parse_ffmpeg_progress(PROGRESS)["frame"] == 30
    ok = cap.transcode_result(PROGRESS, 2.0, 30, "libx264")
    assert ok["fps"] == 15.0 and ok["reason"] is None
    short = cap.transcode_result(PROGRESS, 2.0, 60, "libx264")
    assert short["fps"] is None and "30 of 60" in short["reason"]
    cut = cap.transcode_result(PROGRESS.replace("progress=end", "progress=continue"), 2.0, 30, "libx264")
    assert cut["fps"] is None


def test_vca_capacity_transcode_module_runs_ffmpeg(tmp_path, capsys):
    out = run_module("vca_capacity", {"action": "transcode", "frames": 24, "size": "320x240",
                                      "sysfs_root": str(tmp_path)}, capsys)
    t = out["transcode"]
    assert not out.get("failed") and t["reason"] is None, t
    assert t["encoder"] == "libx264" and t["platform"] == "unknown" and "platform is unknown" in t["fallback"]
    assert t["frames"] == 24 and t["fps"] == pytest.approx(24 / t["seconds"], rel=0.01)
    missing = run_module("vca_capacity", {"action": "transcode", "frames": 24, "ffmpeg": "/nonexistent/ffmpeg",
                                          "sysfs_root": str(tmp_path)}, capsys)["transcode"]
    assert missing["fps"] is None and "not installed" in missing["reason"]


# --- legs, record, table ------------------------------------------------------------------------

def load(tokens, *, seconds=60.0, p50=800.0, p95=1500.0, requests=100, failures=0):
    return {"requests": requests, "failures": failures, "completion_tokens": tokens, "prompt_tokens": 0,
            "seconds": seconds, "tok_s": tokens / seconds, "p50_ms": p50, "p95_ms": p95,
            "locust": {}, "consistent": True}


NODES = ["vca-node0", "vca-node1", "vca-node2"]
LEGS = [
    {"name": "host", "setup": "host alone", "kind": "chat", "group": "main", "machines": ["vca-host"]},
    {"name": "card", "setup": "card alone (3 nodes)", "kind": "chat", "group": "main", "machines": NODES},
    {"name": "both", "setup": "both", "kind": "chat", "group": "main", "machines": ["vca-host", *NODES]},
    *({"name": "scaling-%d" % n, "setup": "scaling: %d" % n, "kind": "chat", "group": "scaling",
       "machines": NODES[:n]} for n in (1, 2, 3)),
    {"name": "transcode-host", "setup": "host alone", "kind": "transcode", "group": "transcode",
     "machines": ["vca-host"]},
    {"name": "transcode-both", "setup": "both", "kind": "transcode", "group": "transcode",
     "machines": ["vca-host", *NODES]},
]


def lab_results(host_has_rapl=False):
    """What the machines registered: nodes with a counter (one wraps), the lab host without one."""
    res = {m: {} for m in ["vca-host", *NODES]}
    tokens = {"host": 3000, "card": 2400, "both": 5400, "scaling-1": 900, "scaling-2": 1710, "scaling-3": 2400}
    for leg in LEGS:
        # the host is snapshotted for every leg (it is charged with each), first when not a worker
        machines = leg["machines"] if "vca-host" in leg["machines"] else ["vca-host", *leg["machines"]]
        for i, m in enumerate(machines):
            if m == "vca-host" and not host_has_rapl:
                b, a = no_counter(0.0), no_counter(60.0)
            else:
                start = MAX - 10_000_000 if i == 0 else 0          # the first machine's counter wraps
                b, a = snap(start, 0.0), snap((start + 600_000_000) % MAX, 60.0)   # 600 J in 60 s = 10 W
            entry = {"before": b, "after": a, "load": None, "transcode": None}
            if leg["kind"] == "transcode" and m in leg["machines"]:
                entry["transcode"] = {"encoder": "libx264", "fps": 50.0, "frames": 600, "seconds": 12.0,
                                      "reason": None}
            res[m][leg["name"]] = entry
        if leg["kind"] == "chat":
            res["vca-host"].setdefault(leg["name"], {"before": None, "after": None})["load"] = load(tokens[leg["name"]])
    return res


def test_assemble_lab_record():
    rec = cap.assemble("20261202T020000Z", {"users": 8, "duration_s": 60, "max_tokens": 128,
                                            "url": "http://127.0.0.1:8090", "transcode_frames": 600},
                       LEGS, lab_results(), "vca-host")
    legs = {leg["name"]: leg for leg in rec["legs"]}
    assert rec["format"] == "vcafleet-capacity/1" and rec["platform"] == "lab"
    card = legs["card"]
    assert card["tok_s"] == pytest.approx(40.0)
    assert card["workers_energy"]["joules"] == pytest.approx(1800.0)   # 3 x 600 J, one across a wrap
    assert card["tok_j_workers"] == pytest.approx(2400 / 1800.0, abs=1e-4)
    # the card is charged the host too, which has no counter in the lab: no tok/J, and why
    assert card["energy_machines"] == [*NODES, "vca-host"]
    assert card["tok_j"] is None and "vca-host" in card["tok_j_reason"]
    assert card["platform"] == "lab" and card["p50_ms"] == 800.0 and card["p95_ms"] == 1500.0
    assert card["energy_window_s"] == 60.0
    # the lab host has no RAPL zone: no tok/J for a leg that includes it, and the record says why
    assert legs["host"]["tok_j"] is None and "vca-host" in legs["host"]["tok_j_reason"]
    assert legs["both"]["tok_j"] is None and legs["both"]["energy"]["joules"] is None
    assert legs["both"]["tok_s"] == pytest.approx(90.0)
    curve = rec["scaling"]["curve"]
    assert [p["nodes"] for p in curve] == [1, 2, 3]
    assert [p["ratio"] for p in curve] == [1.0, 1.9, pytest.approx(2.667, abs=1e-3)]
    assert rec["scaling"]["plumbing_check_only"] is True
    video = {leg["name"]: leg for leg in rec["transcode"]}
    assert video["transcode-both"]["fps"] == 200.0 and video["transcode-both"]["fps_w"] is None
    assert rec["transcode_card_adds"]["fps"] == 150.0 and rec["transcode_card_adds"]["watts"] is None
    json.dumps(rec)   # the playbook writes it as JSON


def test_assemble_with_a_host_counter_and_skipped_legs():
    rec = cap.assemble("t", {}, LEGS, lab_results(host_has_rapl=True), "vca-host")
    legs = {leg["name"]: leg for leg in rec["legs"]}
    assert legs["both"]["energy"]["joules"] == pytest.approx(2400.0)
    assert legs["both"]["tok_j"] == pytest.approx(5400 / 2400.0, abs=1e-4)
    # (issue 46) the card alone pays the host's 600 J over its run too (its idle, Locust, HAProxy)
    assert legs["card"]["energy"]["joules"] == pytest.approx(2400.0)
    assert legs["card"]["tok_j"] == pytest.approx(2400 / 2400.0, abs=1e-4)
    assert legs["card"]["tok_j_workers"] == pytest.approx(2400 / 1800.0, abs=1e-4)
    video = {leg["name"]: leg for leg in rec["transcode"]}
    assert video["transcode-both"]["fps_w"] == pytest.approx(200.0 / 40.0)
    assert rec["transcode_card_adds"]["watts"] == pytest.approx(30.0)
    skipped = [dict(LEGS[0], reason="llm_workers_on_host is false"), *LEGS[1:]]
    rec = cap.assemble("t", {}, skipped, lab_results(), "vca-host")
    host = rec["legs"][0]
    assert host["load"] is None and host["tok_s"] is None and host["reason"] == "llm_workers_on_host is false"
    # a leg that was not run carries no label and does not change the run's
    hw = lab_results(host_has_rapl=True)
    for per_leg in hw.values():
        for entry in per_leg.values():
            for key in ("before", "after"):
                if entry.get(key):
                    entry[key]["platform"] = "hardware"
    del hw["vca-host"]["host"]
    rec = cap.assemble("t", {"users": 8, "duration_s": 60, "max_tokens": 128, "url": "u", "transcode_frames": 600},
                       skipped, hw, "vca-host")
    assert rec["legs"][0]["platform"] is None and rec["platform"] == "hardware"
    assert "| host alone | - | - |" in render(rec)


def test_a_leg_answered_by_a_drained_server_has_no_figure():
    stray = dict(load(900), workers={"vca-node0": 10, "vca-node2": 1})
    leg = cap.chat_leg(LEGS[3], stray, {}, {})
    assert leg["tok_s"] is None and leg["strays"] == {"vca-node2": 1} and "outside the leg" in leg["reason"]
    fine = cap.chat_leg(LEGS[3], dict(load(900), workers={"vca-node0": 11}), {}, {})
    assert fine["tok_s"] == pytest.approx(15.0)


def test_leg_platform():
    assert cap.leg_platform(["hardware", "hardware"]) == "hardware"
    assert cap.leg_platform(["hardware", "lab"]) == "lab"
    assert cap.leg_platform(["hardware", None]) == "unknown"
    assert cap.leg_platform([]) == "unknown"


def render(record):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(BENCH / "templates")), trim_blocks=True,
                             undefined=jinja2.StrictUndefined)
    return env.get_template("capacity-table.md.j2").render(record=record)


def test_table_labels_lab_figures_and_keeps_the_seed_apart():
    rec = cap.assemble("20261202T020000Z", {"users": 8, "duration_s": 60, "max_tokens": 128,
                                            "url": "http://127.0.0.1:8090", "transcode_frames": 600},
                       LEGS, lab_results(), "vca-host")
    table = render(rec)
    ours, _, seed = table.partition("## seed (hardware, TinyLlama-1.1B Q4)")
    assert seed, table
    rows = [line for line in ours.splitlines() if line.startswith("| ")]
    card = next(r for r in rows if r.startswith("| card alone (3 nodes) |"))
    cells = [c.strip() for c in card.strip("|").split("|")]
    assert cells[:7] == ["card alone (3 nodes)", "lab", "40.0", "-", "1.333", "800", "1500"]
    assert cells[11] == "vca-node0, vca-node1, vca-node2, vca-host"     # energy of: the host too
    both = next(r for r in rows if r.startswith("| both |") and "libx264" not in r)
    assert [c.strip() for c in both.strip("|").split("|")][3] == "-"       # no tok/J without the host's counter
    assert "Capacity, 20261202T020000Z (platform: lab)" in ours
    assert "not the same kind of number" in ours
    assert "plumbing only" in ours
    assert "| 3 | lab | 40.0 | 2.67x |" in ours
    for figure in ("82.9", "88.4", "172.5", "0.53", "0.81"):    # the seed's figures only in its own block
        assert figure not in ours and figure in seed
    assert "The card adds +150.0 fps" in ours


def test_table_of_a_hardware_run_has_no_lab_warning():
    res = lab_results(host_has_rapl=True)
    for per_leg in res.values():
        for entry in per_leg.values():
            for key in ("before", "after"):
                if entry.get(key):
                    entry[key]["platform"] = "hardware"
    rec = cap.assemble("t", {"users": 8, "duration_s": 60, "max_tokens": 128, "url": "u", "transcode_frames": 1800},
                       LEGS, res, "vca-host")
    assert rec["platform"] == "hardware" and rec["scaling"]["plumbing_check_only"] is False
    table = render(rec)
    assert "not the same kind of number" not in table
    assert "plumbing only" not in table
    assert "| both | hardware | 90.0 | 2.250 |" in table
    assert "| card alone (3 nodes) | hardware | 40.0 | 1.000 | 1.333 |" in table


def test_a_streamed_leg_is_its_own_section_with_its_time_to_first_token():
    legs = [*LEGS, {"name": "stream", "setup": "both, streamed", "kind": "chat", "group": "stream", "stream": True,
                    "machines": ["vca-host", *NODES]}]
    res = lab_results(host_has_rapl=True)
    for m in ["vca-host", *NODES]:
        res[m]["stream"] = dict(res[m]["both"])
    res["vca-host"]["stream"] = dict(res["vca-host"]["both"], load=dict(load(5400), stream=True, ttft_p50_ms=120.0,
                                                                           ttft_p95_ms=480.0))
    rec = cap.assemble("t", {"users": 8, "duration_s": 60, "max_tokens": 128, "url": "u", "transcode_frames": 1800},
                       legs, res, "vca-host")
    assert [leg["name"] for leg in rec["legs"]] == ["host", "card", "both"]      # the main table is unchanged
    (streamed,) = rec["streaming"]
    assert streamed["stream"] and streamed["ttft_p50_ms"] == 120.0 and streamed["ttft_p95_ms"] == 480.0
    table = render(rec)
    assert "## Streamed" in table and "| both, streamed | lab | 90.0 | 120 | 480 | 800 | 1500 |" in table


def test_vca_capacity_report_module(capsys):
    out = run_module("vca_capacity", {"action": "report", "timestamp": "t", "legs": LEGS,
                                      "results": lab_results(), "frontend": "vca-host"}, capsys)
    assert not out.get("failed"), out
    assert out["record"]["legs"][1]["tok_s"] == pytest.approx(40.0)
    bad = run_module("vca_capacity", {"action": "report", "legs": [{"name": "x"}], "results": {}}, capsys)
    assert bad["failed"] and "has no kind" in bad["msg"]


def test_playbook_wiring():
    plays = yaml.safe_load((BENCH / "capacity.yml").read_text())
    assert [p.get("hosts") or p["ansible.builtin.import_playbook"] for p in plays] == [
        "vca_host", "vca_host:llm_workers:!dead", "vca_host:llm_workers:!dead", "localhost",
        "publish-records.yml"]                                   # the run, on the host for the fleet page
    legs_play = plays[2]
    for var in ("capacity_users", "capacity_duration_s", "capacity_max_tokens", "capacity_prompt",
                "capacity_transcode_frames"):
        assert var in legs_play["vars"]
    include = next(t for t in legs_play["tasks"] if "ansible.builtin.include_tasks" in t)
    assert (BENCH / include["ansible.builtin.include_tasks"]).exists()
    leg = yaml.safe_load((BENCH / include["ansible.builtin.include_tasks"]).read_text())[0]
    assert [t["name"].split(" (")[0] for t in leg["always"]] == [
        "The servers' states after the leg", "The servers the leg took out, back in service"]
    names = [t["name"].split(" (")[0] for t in leg["block"]]
    assert names.index("Energy counters before the load") < names.index("Chat load at the frontend") \
        < names.index("Energy counters after the load")
