"""The agent's readers and exposition: wrap-around, absent sensors, duplicate labels, vcactl, platform, binding."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import AGENT_TOKEN
from vcamon import agent as agent_module
from vcamon.agent import PowerMeter, Sensors, exposition, start_agent
from vcamon.cli import main, parser
from vcamon.collector import parse
from vcamon.hw.vca_sensors import read_all
from vcamon.hw.vcactl import STATES as VCA_STATES
from vcamon.store import PLATFORMS

APP_SRC = Path(__file__).resolve().parent.parent / "src"


def metrics(tree, **kw):
    return exposition(Sensors(str(tree.root), **kw), "vca-node0").decode()


def test_power_across_a_counter_wrap_is_positive():
    meter = PowerMeter()
    top = 262143328850
    meter.update(top - 10_000_000, top, 100.0)           # 10 J before the wrap
    watts = meter.update(30_000_000, top, 101.0)         # 40 J later, counter wrapped
    assert round(watts, 6) == 40.0


def test_first_reading_gives_no_power_and_the_metric_is_absent(node_tree):
    text = metrics(node_tree)
    assert "vcamon_package_power_watts" not in text      # no delta yet: absent, not 0
    assert 'vcamon_power_limit_watts{constraint="long_term"} 45.0' in text


def test_power_from_two_readings(node_tree):
    clock = iter([10.0, 12.0])
    sensors = Sensors(str(node_tree.root), clock=lambda: next(clock, 12.0))   # then the platform cache's reads
    sensors.sample_energy()
    (node_tree.rapl / "energy_uj").write_text("50000000\n")    # 50 J in 2 s
    assert sensors.sample_energy() == 25.0
    assert "vcamon_package_power_watts 25.0" in exposition(sensors, "n").decode()


def test_missing_package_throttle_counter_is_absent(node_tree):
    for f in node_tree.root.glob("devices/system/cpu/cpu*/thermal_throttle/package_throttle_count"):
        f.unlink()
    text = metrics(node_tree)
    assert 'vcamon_sensor_present{sensor="package_throttle"} 0.0' in text
    assert 'scope="package"' not in text
    scrape = parse("vca-node0", text)
    assert scrape.throttle and all(k.startswith("core ") for k in scrape.throttle)


def test_throttle_counters_are_one_per_physical_core(node_tree):
    # Hyper-thread siblings (cpu0 and cpu4 are core 0) share one counter.
    (node_tree.root / "devices/system/cpu/cpu0/thermal_throttle/core_throttle_count").write_text("7\n")
    (node_tree.root / "devices/system/cpu/cpu4/thermal_throttle/core_throttle_count").write_text("7\n")
    scrape = parse("n", metrics(node_tree))
    assert scrape.throttle["core 0:0"] == 7
    assert len([k for k in scrape.throttle if k.startswith("core")]) == 4


def test_duplicate_hwmon_labels_are_both_kept(node_tree):
    shutil.copytree(node_tree.coretemp, node_tree.root / "class/hwmon/hwmon2")
    (node_tree.root / "class/hwmon/hwmon2/temp2_input").write_text("77000\n")
    temps = parse("n", metrics(node_tree)).temps
    assert temps["Core 0"] == 35.0 and temps["Core 0 (hwmon2)"] == 77.0


def test_no_sensors_at_all_means_absent_metrics(tmp_path):
    (tmp_path / "class/hwmon").mkdir(parents=True)
    sensors = Sensors(str(tmp_path))
    sensors.sample_energy()
    text = exposition(sensors, "n").decode()
    assert 'vcamon_sensor_present{sensor="coretemp"} 0.0' in text
    assert "vcamon_temperature_celsius" not in text and "vcamon_power_limit_watts" not in text


def test_vcactl_states_on_the_host(node_tree, tmp_path):
    fake = tmp_path / "vcactl"
    fake.write_text("#!/bin/sh\n"
                    "printf 'Card: 0 Cpu: 0  STATE: net_device_ready\\nCard: 1 Cpu: 0  STATE: link_down\\n'\n")
    fake.chmod(0o755)
    text = metrics(node_tree, vcactl=str(fake))
    scrape = parse("host", text)
    assert scrape.vca_states == {0: "net_device_ready", 3: "link_down"}
    # state is a value: every state the driver defines has a series per node, 1 only for the node's own
    lines = [ln for ln in text.splitlines() if ln.startswith("vcamon_vca_node_state{")]
    node0 = [ln for ln in lines if 'vca_node="0"' in ln]
    assert len(node0) == len(VCA_STATES) and [ln for ln in node0 if ln.endswith(" 1.0")] == [
        ln for ln in node0 if 'state="net_device_ready"' in ln]


def test_agent_serves_over_http(agent):
    with urllib.request.urlopen(agent) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    assert 'vcamon_agent_info{node="vca-node0"} 1.0' in text
    assert 'vcamon_temperature_celsius{sensor="Package id 0"}' in text


class FakeClock:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def counting_vcactl(tmp_path):
    """A vcactl that answers like the real one and leaves one line in runs.log per run."""
    runs = tmp_path / "runs.log"
    fake = tmp_path / "vcactl"
    fake.write_text("#!/bin/sh\necho run >> %s\nprintf 'Card: 0 Cpu: 0  STATE: net_device_ready\\n'\n" % runs)
    fake.chmod(0o755)
    return str(fake), lambda: len(runs.read_text().splitlines()) if runs.exists() else 0


def test_vcactl_runs_at_most_once_per_sample_interval_whatever_the_request_rate(node_tree, tmp_path):
    vcactl, runs = counting_vcactl(tmp_path)
    clock = FakeClock(100.0)
    server, stop = start_agent("127.0.0.1:0", "host", str(node_tree.root), vcactl, sample_interval=5.0, clock=clock)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d/metrics" % server.server_address[1]

    def burst(n):
        with ThreadPoolExecutor(max_workers=10) as pool:
            texts = list(pool.map(lambda _: urllib.request.urlopen(url, timeout=30).read().decode(), range(n)))
        assert all('state="net_device_ready"' in t for t in texts)   # every answer has the (cached) states

    try:
        burst(50)                       # 100 requests within one interval, 10 at a time from the start
        clock.t = 104.9
        burst(50)
        assert runs() == 1
        clock.t = 105.0                 # the next interval: read again, once
        burst(100)
        assert runs() == 2
        clock.t = 111.0
        burst(1)
        assert runs() == 3
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def test_platform_is_the_sensors_readers(node_tree):
    expected = read_all(str(node_tree.root), sample_seconds=0)["platform"]
    assert expected in PLATFORMS
    text = metrics(node_tree)
    assert 'vcamon_platform_info{platform="%s"} 1.0' % expected in text
    assert parse("vca-node0", text).platform == expected


@pytest.mark.parametrize("said, recorded", [("hardware", "hardware"), ("lab", "lab"), ("sim", "unknown"),
                                            (OSError("no sysfs"), "unknown")])
def test_platform_comes_from_read_all_and_nothing_else(node_tree, monkeypatch, said, recorded):
    def fake_read_all(root, sample_seconds=1.0):
        assert root == str(node_tree.root) and sample_seconds == 0
        if isinstance(said, Exception):
            raise said
        return {"platform": said}

    monkeypatch.setattr(agent_module, "read_all", fake_read_all)
    assert parse("n", metrics(node_tree)).platform == recorded


def test_agent_listens_on_loopback_unless_told_otherwise(node_tree):
    assert parser().parse_args(["agent", "--node", "n"]).listen == "127.0.0.1:9478"
    for listen, address in ((":0", "127.0.0.1"), ("localhost:0", "127.0.0.1"), ("127.0.0.1:0", "127.0.0.1")):
        server, stop = start_agent(listen, "n", str(node_tree.root))
        try:
            assert server.server_address[0] == address, listen
        finally:
            stop.set()
            server.server_close()


def get(url, headers=None):
    """One GET: (status, headers, body), a 4xx/5xx answer included."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as resp:
            return resp.status, resp.headers, resp.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.headers, exc.read().decode()


@pytest.mark.parametrize("headers", [
    {},                                                     # no token at all
    {"Authorization": "Bearer " + AGENT_TOKEN[:-1]},        # one character short
    {"Authorization": "Bearer " + AGENT_TOKEN + "x"},       # one too many
    {"Authorization": "Bearer " + AGENT_TOKEN.upper()},
    {"Authorization": "Bearer"},
    {"Authorization": "Basic " + AGENT_TOKEN},              # the right secret, the wrong scheme
    {"Authorization": AGENT_TOKEN},
])
def test_an_agent_with_a_token_refuses_a_request_without_it(locked_agent, headers):
    for url in (locked_agent, locked_agent.replace("/metrics", "/"), locked_agent.replace("/metrics", "/nope")):
        status, answer, body = get(url, headers)
        assert status == 401, (url, headers)
        assert answer["WWW-Authenticate"].startswith("Bearer")
        assert "token is required" in body and "vcamon_" not in body     # a short word, not a figure


def test_an_agent_with_a_token_answers_the_right_one(locked_agent):
    for scheme in ("Bearer", "bearer"):
        status, answer, body = get(locked_agent, {"Authorization": "%s %s" % (scheme, AGENT_TOKEN)})
        assert status == 200 and answer["Content-Type"].startswith("text/plain; version=0.0.4")
        assert 'vcamon_agent_info{node="vca-node0"} 1.0' in body
    assert get(locked_agent.replace("/metrics", "/nope"), {"Authorization": "Bearer " + AGENT_TOKEN})[0] == 404


def test_an_agent_without_a_token_answers_anyone(agent):
    status, _, body = get(agent)
    assert status == 200 and "vcamon_agent_info" in body


@pytest.mark.parametrize("token", ["", "short", "has space in it 0123456789"])
def test_an_agent_is_not_started_with_a_bad_token(node_tree, token):
    with pytest.raises(ValueError, match="at least 16"):
        start_agent("127.0.0.1:0", "n", str(node_tree.root), token=token)


def test_the_token_file_reaches_the_agent(node_tree, tmp_path, monkeypatch):
    (tmp_path / "token").write_text(AGENT_TOKEN + "\n")
    seen = {}
    monkeypatch.setattr(agent_module, "serve", lambda *args, token=None, filesystems=None, units=(): seen.update(
        args=args, token=token, filesystems=filesystems, units=units))
    assert main(["agent", "--node", "n", "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token")]) == 0
    assert seen["token"] == AGENT_TOKEN and seen["filesystems"] == ["/"] and seen["units"] == []
    main(["agent", "--node", "n", "--listen", "127.0.0.1:0", "--unit", "smem.service", "--unit", "farm-*.service"])
    assert seen["units"] == ["smem.service", "farm-*.service"]
    main(["agent", "--node", "n", "--listen", "127.0.0.1:0", "--filesystem", "/var", "--filesystem", "/srv"])
    assert seen["filesystems"] == ["/var", "/srv"]
    main(["agent", "--node", "n", "--listen", "127.0.0.1:0"])
    assert seen["token"] is None                          # no --token-file: as before, open


def test_a_missing_empty_or_unreadable_token_file_stops_the_agent(node_tree, tmp_path):
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "short").write_text("abc\n")
    (tmp_path / "two-lines").write_text(AGENT_TOKEN + "\n" + AGENT_TOKEN + "\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe" + AGENT_TOKEN.encode())
    (tmp_path / "a-directory").mkdir()
    env = dict(os.environ, PYTHONPATH=str(APP_SRC))
    for name, words in (("missing", "No such file"), ("empty", "is empty"), ("short", "at least 16"),
                        ("two-lines", "at least 16"), ("binary", "not a line of text"),
                        ("a-directory", "Is a directory")):
        path = tmp_path / name
        # An agent that started anyway would serve on: the timeout makes that a failure.
        proc = subprocess.run([sys.executable, "-m", "vcamon", "agent", "--node", "n", "--listen", "127.0.0.1:0",
                               "--sysfs-root", str(node_tree.root), "--token-file", str(path)],
                              check=False, env=env, capture_output=True, text=True, timeout=30)
        lines = proc.stderr.splitlines()
        assert proc.returncode != 0, name
        assert len(lines) == 1 and lines[0].startswith("vcamon agent: token file %s" % path), (name, lines)
        assert words in lines[0] and AGENT_TOKEN not in lines[0], (name, lines)


def test_free_space_of_each_filesystem_asked_for(tmp_path):
    text = exposition(Sensors(str(tmp_path), filesystems=(str(tmp_path), "/no/such/mount")), "vca-host").decode()
    st = os.statvfs(tmp_path)
    got = {(s.name, s.labels.get("mountpoint")): s.value for f in text_string_to_metric_families(text)
           for s in f.samples}
    assert got[("vcamon_filesystem_size_bytes", str(tmp_path))] == st.f_blocks * st.f_frsize
    assert 0 < got[("vcamon_filesystem_free_bytes", str(tmp_path))] <= st.f_blocks * st.f_frsize
    assert ("vcamon_filesystem_free_bytes", "/no/such/mount") not in got


def test_promtool_accepts_the_agents_text(node_tree, tmp_path, monkeypatch):
    """(issue 28) The agent's exposition, with every family it can emit (a node's sensors, free space, its
    services), passes `promtool check metrics`, lint included."""
    sensors = Sensors(str(node_tree.root), filesystems=(str(tmp_path),), units=("smem.service",))
    monkeypatch.setattr(sensors, "unit_states", lambda: {"smem.service": "active", "farm-worker.service": "failed"})
    text = exposition(sensors, "vca-node0").decode()
    assert 'vcamon_unit_active{unit="farm-worker.service"} 0.0' in text
    assert 'vcamon_unit_state{state="failed",unit="farm-worker.service"} 1.0' in text
    assert 'vcamon_unit_state{state="active",unit="farm-worker.service"} 0.0' in text
    assert parse("vca-node0", text).units == {"smem.service": "active", "farm-worker.service": "failed"}
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package, scripts/host-packages.txt) is not on PATH"
    r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60,
                       check=False)
    assert r.returncode == 0, r.stdout + r.stderr
