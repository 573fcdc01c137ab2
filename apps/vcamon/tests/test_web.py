"""The web page in headless Chromium: charts drawn with data, events and caps; and its JSON API."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from PIL import Image

from vcamon.store import Scrape, Store
from vcamon.web import start_web

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
KEEP_SCREENSHOT = os.environ.get("VCAMON_KEEP_SCREENSHOT")   # a path: keep the page image to look at
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)     # package W line, PL1 line (vcamon.js)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("web") / "vcamon.db")
    store = Store(db)
    now = int(time.time())
    for i in range(120):                                   # the last hour at 30 s
        ts = now - 3600 + 30 * i
        hot = 70 + 25 * (i % 40) / 40
        store.record_round(ts, [
            Scrape(node="vca-node4", ok=True, temps={"Package id 0": hot, "Core 0": hot - 2}, power_w=25 + i % 12,
                   limits={"long_term": 35.0, "short_term": 40.0}, throttle={"core 0:0": i // 40}),
            Scrape(node="vca-node3", ok=False, error="URLError: timed out"),
        ])
    store.close()
    server = start_web("127.0.0.1:0", db)
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()


def chromium(*args):
    assert CHROMIUM, "chromium is not installed (scripts/bootstrap-host.sh installs it)"
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--window-size=1300,1200", "--virtual-time-budget=15000", *args],
                          capture_output=True, text=True, timeout=120, check=True)


def test_page_renders_charts_with_data(page, tmp_path):
    dom = chromium("--dump-dom", page + "/?range=1h").stdout
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-ready="1"' in body, body
    assert int(re.search(r'data-points="(\d+)"', body).group(1)) >= 100
    assert dom.count("<canvas") == 2                       # node 4: temperature and power; node 3 has none
    assert "no samples in this range" in dom               # node 3 was down the whole hour

    shot = tmp_path / "page.png"
    chromium("--screenshot=%s" % shot, page + "/?range=1h")
    img = Image.open(shot).convert("RGB")
    img.save(KEEP_SCREENSHOT) if KEEP_SCREENSHOT else None

    def near(color, tol=40):
        return sum(1 for p in img.get_flattened_data() if sum(abs(a - b) for a, b in zip(p, color, strict=True)) < tol)

    assert near(BLUE) > 400, "no package power line in the screenshot"
    assert near(ORANGE) > 100, "no PL1 line in the screenshot"


def test_api_chart_and_errors(page):
    with urllib.request.urlopen(page + "/api/chart?node=vca-node4&range=1h") as resp:
        chart = json.load(resp)
    assert chart["resolution"] == "raw" and len(chart["t"]) >= 119
    assert set(chart["pl1"]) == {35.0}
    assert [e["kind"] for e in chart["events"]].count("throttle") == 2
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(page + "/api/chart?node=vca-node4&range=yesterday")
    assert bad.value.code == 400 and "not a span" in json.load(bad.value)["error"]
    with pytest.raises(urllib.error.HTTPError) as escape:
        urllib.request.urlopen(page + "/static/../store.py")
    assert escape.value.code == 404
