"""The web page in headless Chromium: charts drawn with data, events, caps and platform badges; its JSON API;
the token; the static route's confinement."""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from PIL import Image

from vcamon.auth import read_token_file
from vcamon.store import Scrape, Store
from vcamon.web import start_web

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEEP_SCREENSHOT = os.environ.get("VCAMON_KEEP_SCREENSHOT")   # a path: keep the page image to look at
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)     # package W line, PL1 line (vcamon.js)
APP_SRC = Path(__file__).resolve().parent.parent / "src"
TOKEN = "test-token-0123456789abcdef"              # made up for the test; no deployment uses it


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("web") / "vcamon.db")
    store = Store(path)
    now = int(time.time())
    for i in range(120):                                   # the last hour at 30 s
        ts = now - 3600 + 30 * i
        hot = 70 + 25 * (i % 40) / 40
        store.record_round(ts, [
            Scrape(node="vca-node4", ok=True, temps={"Package id 0": hot, "Core 0": hot - 2}, power_w=25 + i % 12,
                   limits={"long_term": 35.0, "short_term": 40.0}, throttle={"core 0:0": i // 40}, platform="lab"),
            Scrape(node="vca-node3", ok=False, error="URLError: timed out"),
            Scrape(node="vca-node5", ok=True, temps={"Package id 0": 40.0}, power_w=12.0, platform="hardware"),
        ])
    store.close()
    return path


@pytest.fixture(scope="module")
def page(db):
    server = start_web("127.0.0.1:0", db)
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def locked(db):
    """The same page with a token."""
    server = start_web("127.0.0.1:0", db, token=TOKEN)
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def request(base, path, method="GET", headers=None):
    """One request, redirects not followed: (status, headers, body)."""
    url = urlparse(base)
    con = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    try:
        con.request(method, path, headers=headers or {})
        resp = con.getresponse()
        return resp.status, resp.headers, resp.read()
    finally:
        con.close()


def chromium(*args):
    assert CHROMIUM, "chromium is not installed (scripts/bootstrap-host.sh installs it)"
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1300,1200", "--virtual-time-budget=15000", *args],
                          capture_output=True, text=True, timeout=120, check=True)


def sections(dom):
    """{node: its charts' section} and {node: its status table row}, from the rendered page."""
    charts = {m.group(1): m.group(0) for m in re.finditer(r'<section class="node"><h2>([^<\s]+).*?</section>', dom,
                                                           re.S)}
    rows = {m.group(1): m.group(0) for m in re.finditer(r"<tr><td>([^<]+)</td>.*?</tr>", dom, re.S)}
    return charts, rows


def test_page_renders_charts_with_data(page, tmp_path):
    dom = chromium("--dump-dom", page + "/?range=1h").stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-ready="1"' in body, body
    assert int(re.search(r'data-points="(\d+)"', body).group(1)) >= 200
    assert dom.count("<canvas") == 4                       # nodes 4 and 5: temperature and power; node 3 has none
    assert "no samples in this range" in dom               # node 3 was down the whole hour

    shot = tmp_path / "page.png"
    chromium("--screenshot=%s" % shot, page + "/?range=1h")
    img = Image.open(shot).convert("RGB")
    img.save(KEEP_SCREENSHOT) if KEEP_SCREENSHOT else None

    def near(color, tol=40):
        return sum(1 for p in img.get_flattened_data() if sum(abs(a - b) for a, b in zip(p, color, strict=True)) < tol)

    assert near(BLUE) > 400, "no package power line in the screenshot"
    assert near(ORANGE) > 100, "no PL1 line in the screenshot"


def test_lab_figures_are_labelled_on_the_page(page):
    charts, rows = sections(chromium("--dump-dom", page + "/?range=1h").stdout)
    assert set(charts) == {"vca-node5", "vca-node3", "vca-node4"}, charts.keys()
    lab = 'data-platform="lab"'
    assert lab in charts["vca-node4"] and "lab (simulated)" in charts["vca-node4"]
    assert "lab (simulated)" in rows["vca-node4"]
    assert "temperature (raw) · lab (simulated)" in charts["vca-node4"]   # in the chart's own title too
    assert lab not in charts["vca-node5"] and 'data-platform="hardware"' in charts["vca-node5"]
    assert lab not in rows["vca-node5"] and "hardware" in rows["vca-node5"]
    assert "data-platform" not in charts["vca-node3"] and "data-platform" not in rows["vca-node3"]   # never seen


def test_api_chart_nodes_and_errors(page):
    # 2h: the fixture's hour, however long the tests before this one took
    status, _, body = request(page, "/api/chart?node=vca-node4&range=2h")
    chart = json.loads(body)
    assert status == 200 and chart["resolution"] == "raw" and len(chart["t"]) >= 119
    assert set(chart["pl1"]) == {35.0} and chart["platforms"] == ["lab"]
    assert [e["kind"] for e in chart["events"]].count("throttle") == 2
    nodes = {n["node"]: n["platform"] for n in json.loads(request(page, "/api/nodes")[2])["nodes"]}
    assert nodes == {"vca-node5": "hardware", "vca-node3": None, "vca-node4": "lab"}
    status, _, body = request(page, "/api/chart?node=vca-node4&range=yesterday")
    assert status == 400 and "not a span" in json.loads(body)["error"]


def test_nothing_changes_data_and_other_methods_are_refused(page, locked, db):
    before = Store(db).status(0)
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert request(page, "/api/nodes", method)[0] == 405, method
        assert request(locked, "/api/nodes", method)[0] == 401, method             # no token: not even 405
        assert request(locked, "/api/nodes", method, {"Authorization": "Bearer " + TOKEN})[0] == 405, method
    assert Store(db).status(0) == before


@pytest.mark.parametrize("path", ["/", "/index.html", "/static/vcamon.js", "/api/nodes",
                                  "/api/chart?node=vca-node4&range=1h", "/nope"])
def test_with_a_token_every_request_needs_it(locked, path):
    status, headers, _ = request(locked, path)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    for wrong in ({"Authorization": "Bearer " + TOKEN[:-1]}, {"Authorization": "Basic " + TOKEN},
                  {"Cookie": "vcamon_token=" + TOKEN + "x"}, {"Cookie": "other=" + TOKEN}):
        assert request(locked, path, headers=wrong)[0] == 401, wrong
    sep = "&" if "?" in path else "?"
    assert request(locked, path + sep + "token=nope-nope-nope-nope")[0] == 401
    expected = 404 if path == "/nope" else 200
    assert request(locked, path, headers={"Authorization": "Bearer " + TOKEN})[0] == expected
    assert request(locked, path, headers={"Cookie": "vcamon_token=" + TOKEN})[0] == expected
    # (issue 46) a token in the address, on any path: a cookie, and the same address without it
    status, headers, _ = request(locked, path + sep + "token=" + TOKEN)
    assert status == 303 and TOKEN not in headers["Location"] and headers["Location"] == path
    assert headers["Set-Cookie"].startswith("vcamon_token=%s;" % TOKEN)


def test_a_browser_link_with_the_token_sets_a_cookie_and_drops_it_from_the_address(locked):
    status, headers, _ = request(locked, "/?range=6h&token=" + TOKEN)
    assert status == 303 and headers["Location"] == "/?range=6h"
    cookie = headers["Set-Cookie"]
    assert cookie.startswith("vcamon_token=%s;" % TOKEN) and "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_the_locked_page_in_a_browser(locked):
    refused = chromium("--dump-dom", locked + "/?range=1h").stdout
    assert "a token is required" in refused and "<canvas" not in refused
    dom = chromium("--dump-dom", locked + "/?range=1h&token=" + TOKEN).stdout
    assert 'data-ready="1"' in re.search(r"<body[^>]*>", dom).group(0)
    assert dom.count("<canvas") == 4


def test_a_bad_or_missing_token_file_stops_the_collector(tmp_path):
    (tmp_path / "short").write_text("abc\n")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "good").write_text(TOKEN + "\n")
    assert read_token_file(str(tmp_path / "good")) == TOKEN
    targets = tmp_path / "targets.json"
    targets.write_text("[]")
    env = dict(os.environ, PYTHONPATH=str(APP_SRC))
    for name in ("short", "empty", "missing"):
        # A collector that started anyway (an open page) would run on: the timeout makes that a failure.
        proc = subprocess.run([sys.executable, "-m", "vcamon", "collector", "--db", str(tmp_path / "db"),
                               "--targets", str(targets), "--listen", "127.0.0.1:0",
                               "--web-token-file", str(tmp_path / name)],
                              check=False, env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0 and "vcamon collector: " in proc.stderr, (name, proc.stderr)
    for bad in ("short", ""):
        with pytest.raises(ValueError, match="at least 16"):
            start_web("127.0.0.1:0", str(tmp_path / "db"), token=bad)


@pytest.fixture
def site(tmp_path, db):
    """A static root with a file beside it (outside static/, of a suffix the route serves) and a link out."""
    static = tmp_path / "site" / "static"
    (static / "sub").mkdir(parents=True)
    (static / "index.html").write_text("<p>index</p>")
    (static / "ok.css").write_text("ok {}")
    (tmp_path / "site" / "secret.css").write_text("secret {}")
    (static / "out").symlink_to(tmp_path / "site")
    server = start_web("127.0.0.1:0", db, static_root=static)
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_static_route_serves_its_own_files(site):
    assert request(site, "/static/ok.css")[::2] == (200, b"ok {}")                  # .css is served
    assert request(site, "/static/sub/../ok.css")[::2] == (200, b"ok {}")           # '..' that stays inside


@pytest.mark.parametrize("path", ["/static/../secret.css", "/static/sub/../../secret.css", "/static//../secret.css"])
def test_dot_dot_does_not_leave_static(site, path):
    status, _, body = request(site, path)
    assert status == 404 and b"secret" not in body


@pytest.mark.parametrize("path", ["/static/out/secret.css", "/static/out/static/../secret.css"])
def test_a_link_does_not_leave_static(site, path):
    status, _, body = request(site, path)
    assert status == 404 and b"secret" not in body


def test_an_agent_that_refused_the_collector_shows_as_an_authentication_failure(tmp_path):
    path = str(tmp_path / "vcamon.db")
    store = Store(path)
    refused = "authentication failed: the agent refused the token in /etc/vcamon/agent-tokens/vca-node4 (HTTP 401)"
    store.record_round(int(time.time()) - 30, [Scrape(node="vca-node4", ok=False, error=refused),
                                               Scrape(node="vca-node3", ok=False, error="URLError: timed out")])
    store.close()
    server = start_web("127.0.0.1:0", path)
    try:
        base = "http://127.0.0.1:%d" % server.server_address[1]
        nodes = {n["node"]: n for n in json.loads(request(base, "/api/nodes")[2])["nodes"]}
        assert nodes["vca-node4"]["auth_failed"] is True and nodes["vca-node3"]["auth_failed"] is False
        _, rows = sections(chromium("--dump-dom", base + "/?range=1h").stdout)
    finally:
        server.shutdown()
        server.server_close()
    assert ">auth failed</td>" in rows["vca-node4"] and 'title="%s"' % refused in rows["vca-node4"]
    assert ">down</td>" in rows["vca-node3"] and "auth failed" not in rows["vca-node3"]


def test_the_page_refreshes_itself_says_how_old_each_section_is_and_shows_dead_nodes_dead(tmp_path):
    """(issue 46) The page reloads its figures every 30 s (here in Chromium's virtual time, 70 s of it),
    each section says how old its figures are, and a node the inventory calls dead is shown dead, not as
    an open problem."""
    path = str(tmp_path / "vcamon.db")
    store = Store(path)
    now = int(time.time())
    store.record_round(now - 20, [Scrape(node="vca-node0", ok=True, temps={"Package id 0": 50.0}, power_w=20.0),
                                  Scrape(node="vca-node3", ok=False, error="URLError: timed out")])
    store.set_meta("dead", json.dumps(["vca-node3"]))
    store.set_meta("fleet", json.dumps({"at": now - 10, "services": []}))
    store.close()
    server = start_web("127.0.0.1:0", path)
    try:
        base = "http://127.0.0.1:%d" % server.server_address[1]
        nodes = {n["node"]: n for n in json.loads(request(base, "/api/nodes")[2])["nodes"]}
        assert nodes["vca-node3"]["dead"] and not nodes["vca-node0"]["dead"]
        dom = chromium("--virtual-time-budget=70000", "--dump-dom", base + "/?range=1h").stdout
    finally:
        server.shutdown()
        server.server_close()
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-ready="1"' in body and int(re.search(r'data-refreshes="(\d+)"', body).group(1)) >= 1, body
    ages = dict(re.findall(r'<span class="age[^"]*" data-section="(\w+)" data-seconds="(\d*)">', dom))
    assert set(ages) == {"runs", "numbers", "open", "status"}, ages
    assert ages["numbers"] == ""                                   # no bench record: never, and said so
    assert all(ages[s] != "" and int(ages[s]) >= 10 for s in ("runs", "open", "status")), ages
    _, rows = sections(dom)
    assert '<td class="dead"' in rows["vca-node3"] and '<td class="dead"' not in rows["vca-node0"]
    assert 'data-what="node down"' not in dom
