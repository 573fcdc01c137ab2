"""The web console in headless Chromium against a real smem: uvicorn on 127.0.0.1, a real SQLite file, the
in-process embedder, ingest by the service's own workers. The page shows documents with status and error,
facts with what superseded what and when, a search with scores and lanes; a wrong token shows only an error."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import zlib
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import uvicorn

from conftest import Switchable
from smem import auth
from smem.config import Settings
from smem.service import build

CHROMIUM = os.environ.get("SMEM_CHROMIUM") or next(
    (p for p in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")) if p and
     os.path.exists(p)), None)
SCREENSHOT_COPY = os.environ.get("SMEM_CONSOLE_SCREENSHOT")   # a path: keep the page image to look at
FERRY = "The ferry to Vaxholm leaves at 9:40 from Strandvägen.\n\nTickets are sold on board."
OLD_FACT, NEW_FACT = "Ada's desk is on floor 2.", "Ada's desk moved to floor 5, by the window."
MARKUP_FACT = "Ada writes <b>bold</b> notes <img src=x onerror=alert(1)>"
WORLD_CHANGE = "2025-03-01T00:00:00.000000Z"     # the new fact's validAt: the old one's validTo
_profiles = itertools.count()


class Running:
    """build()'s app (it mounts the console), on a real uvicorn in a thread (its lifespan runs the workers)."""

    def __init__(self, db_path: Path, embedder):
        self.embedder = Switchable(embedder)
        settings = Settings(poll_interval_s=0.05, job_max_attempts=1)
        app, self.pipeline = build(str(db_path), settings, embedder=self.embedder)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.base = "http://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=60)
        self.sock.close()


def until_status(base: str, h: dict, doc_id: str, want: str, seconds: float = 120) -> dict:
    deadline = time.monotonic() + seconds
    while True:
        d = httpx.get(base + "/v5/ns/alice/documents/" + doc_id, headers=h, timeout=30).json()
        if d["status"] == want:
            return d
        assert d["status"] not in ("done", "failed") and time.monotonic() < deadline, d
        time.sleep(0.05)


@pytest.fixture(scope="module")
def smem(tmp_path_factory, minilm):
    srv = Running(tmp_path_factory.mktemp("console") / "smem.db", minilm)
    token = auth.create(srv.pipeline.db, ["alice"])
    h = {"Authorization": "Bearer " + token}
    api = srv.base + "/v5/ns/alice"
    ok = httpx.post(api + "/documents", json={"content": FERRY, "customId": "ferry-timetable"}, headers=h, timeout=30)
    assert ok.status_code == 202, ok.text
    until_status(srv.base, h, ok.json()["id"], "done")
    old = httpx.post(api + "/memories", json={"content": OLD_FACT, "validAt": "2024-01-15"}, headers=h, timeout=30)
    new = httpx.post(api + "/memories", json={"content": NEW_FACT, "validAt": WORLD_CHANGE,
                                              "supersedes": old.json()["id"]}, headers=h, timeout=30)
    markup = httpx.post(api + "/memories", json={"content": MARKUP_FACT}, headers=h, timeout=30)
    assert (old.status_code, new.status_code, markup.status_code) == (201, 201, 201), new.text
    # A document whose ingest fails: the page shows its status and the reason.
    srv.embedder.down = True
    bad = httpx.post(api + "/documents", json={"content": "The lighthouse keeper's log."}, headers=h, timeout=30)
    failed = until_status(srv.base, h, bad.json()["id"], "failed")
    srv.embedder.down = False
    yield {"base": srv.base, "token": token, "h": h, "ok": ok.json()["id"], "bad": bad.json()["id"],
           "bad_error": failed["error"], "old": old.json()["id"], "new": new.json()["id"],
           "markup": markup.json()["id"]}
    srv.stop()


def chromium(tmp_path: Path, *args: str) -> str:
    assert CHROMIUM, ("headless Chromium is needed for the console tests and none was found at /usr/bin/chromium "
                      "or on PATH (install the distribution's chromium package, or set SMEM_CHROMIUM)")
    cmd = [CHROMIUM, "--headless=new", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--no-default-browser-check", "--window-size=1280,1000", "--virtual-time-budget=15000",
           "--user-data-dir=%s" % (tmp_path / ("profile-%d" % next(_profiles))), *args]
    if os.geteuid() == 0:
        cmd.insert(1, "--no-sandbox")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert r.returncode == 0, "chromium exited %s: %s" % (r.returncode, r.stderr[-3000:])
    return r.stdout


def page(smem, fragment: str) -> str:
    return smem["base"] + "/console/#" + fragment


def element(dom: str, tag: str, ident: str) -> str:
    m = re.search(r'<%s id="%s"[^>]*>.*?</%s>' % (tag, ident, tag), dom, re.S)
    assert m, "no <%s id=%s> in the page" % (tag, ident)
    return m.group(0)


def rows(table: str) -> list[tuple[str, str]]:
    """(data-id, the row's HTML) for every body row of a table, in order."""
    body = re.search(r"<tbody>(.*)</tbody>", table, re.S).group(1)
    return [(m.group(1) or "", m.group(0)) for m in re.finditer(r'<tr(?: class="[^"]*")?(?: data-id="([^"]*)")?>'
                                                                  r".*?</tr>", body, re.S)]


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """(width, height, pixels) of an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes): stdlib only."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, head = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        head = struct.unpack(">IIBBBBB", chunk) if kind == b"IHDR" else head
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + n
    w, h, depth, ctype, _, _, interlace = head
    assert depth == 8 and ctype in (2, 6) and not interlace, head
    bpp = 3 if ctype == 2 else 4
    raw, stride, prev, out = zlib.decompress(idat), w * bpp, bytearray(w * bpp), []
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.extend(bytes(line[x:x + 3]) for x in range(0, stride, bpp))
        prev = line
    return w, h, out


def test_console_shows_documents_facts_and_search(smem, tmp_path):
    dom = chromium(tmp_path, "--dump-dom", page(smem, "token=%s&ns=alice&q=%s" % (
        smem["token"], quote("when does the boat to Vaxholm leave?"))))
    assert re.search(r'<body data-state="ready"', dom), re.search(r"<body[^>]*>", dom).group(0)
    assert element(dom, "p", "error").startswith('<p id="error" role="alert" hidden')

    docs = dict(rows(element(dom, "table", "documents")))
    assert set(docs) == {smem["ok"], smem["bad"]}, docs.keys()
    assert "ferry-timetable" in docs[smem["ok"]] and '<span class="status done">done</span>' in docs[smem["ok"]]
    assert '<span class="status failed">failed</span>' in docs[smem["bad"]]
    assert "switched off by the test" in smem["bad_error"] and smem["bad_error"] in docs[smem["bad"]]

    facts = rows(element(dom, "table", "facts"))
    ids = [i for i, _ in facts]
    assert ids.index(smem["old"]) == ids.index(smem["new"]) + 1, ids     # the superseded one under its successor
    new, old = dict(facts)[smem["new"]], dict(facts)[smem["old"]]
    assert NEW_FACT in new and 'class="current"' in new
    assert "supersedes " + smem["old"] in new                         # its history: created, superseding the old
    assert 'class="superseded"' in old and OLD_FACT in old
    assert '<time datetime="%s"' % WORLD_CHANGE in old                 # the old fact's validTo...
    assert re.search(r"<b>superseded</b> <time datetime=\"[^\"]+\"[^>]*>[^<]+</time><span class=\"id\">by %s"
                     % smem["new"], old)                               # ...and when smem recorded the change
    markup = dict(facts)[smem["markup"]]
    assert "Ada writes &lt;b&gt;bold&lt;/b&gt; notes &lt;img src=x onerror=alert(1)&gt;" in markup
    assert "<img" not in dom and "<b>bold" not in dom                  # data went in as text, never as HTML

    answer = httpx.post(smem["base"] + "/v5/ns/alice/search", headers=smem["h"], timeout=30,
                        json={"q": "when does the boat to Vaxholm leave?", "limit": 20}).json()
    results = rows(element(dom, "table", "results"))
    assert [i for i, _ in results] == [r["id"] for r in answer["results"]]
    top, first = answer["results"][0], results[0][1]
    assert top["kind"] == "chunk" and "Vaxholm" in first
    assert '<td class="num score">%.4f</td>' % top["score"] in first
    meta = element(dom, "p", "search-meta")
    assert "degraded: none" in meta
    assert answer["served"] == {"embed": "local", "rerank": None}    # which lane answered: the page says so
    assert "served: embed <b>local</b> · rerank <b>—</b>" in meta
    assert smem["token"] not in dom


def test_console_screenshot_is_not_blank(smem, tmp_path):
    shot = tmp_path / "console.png"
    chromium(tmp_path, "--screenshot=%s" % shot, page(smem, "token=%s&ns=alice&q=%s" % (
        smem["token"], quote("when does the boat to Vaxholm leave?"))))
    assert shot.exists(), "chromium wrote no screenshot"
    if SCREENSHOT_COPY:
        shutil.copyfile(shot, SCREENSHOT_COPY)
    w, h, pixels = png_pixels(shot)
    assert (w, h) == (1280, 1000)
    colours = Counter(pixels)
    background, n = colours.most_common(1)[0]
    assert background == b"\xff\xff\xff", "the page's background is not white: %r" % background
    assert 1 - n / len(pixels) > 0.05, "the screenshot is almost blank"
    assert len(colours) > 100, "too few colours for a page of text: %d" % len(colours)
    green = sum(v for c, v in colours.items() if c == bytes((0xE6, 0xF4, 0xE6)))   # the 'done' badge
    red = sum(v for c, v in colours.items() if c == bytes((0xFD, 0xEC, 0xEA)))     # the 'failed' badge
    assert green > 50 and red > 50, (green, red)


def test_wrong_token_shows_an_error_and_no_data(smem, tmp_path):
    dom = chromium(tmp_path, "--dump-dom", page(smem, "token=not-a-real-token&ns=alice&q=ferry"))
    assert re.search(r'<body data-state="error"', dom)
    error = element(dom, "p", "error")
    assert "token refused" in error and "401" in error and " hidden" not in error.split(">")[0]
    assert '<form id="login">' in dom                                  # asks for another
    for datum in (smem["ok"], smem["bad"], smem["old"], smem["new"], "Vaxholm", "Ada", "ferry-timetable"):
        assert datum not in dom, datum
    assert all(not r for r in (rows(element(dom, "table", t)) for t in ("documents", "facts", "results")))

    blank = chromium(tmp_path, "--dump-dom", smem["base"] + "/console/")   # no token at all: the form, no error
    assert re.search(r'<body data-state="login"', blank) and '<form id="login">' in blank
    assert element(blank, "p", "error").startswith('<p id="error" role="alert" hidden')


def test_the_page_is_static_and_needs_no_token_but_the_api_does(smem):
    base = smem["base"]
    r = httpx.get(base + "/console", timeout=30)
    assert r.status_code in (307, 308) and r.headers["location"].endswith("/console/")
    r = httpx.get(base + "/console/", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"] and r.headers["cache-control"] == "no-store"
    assert "Vaxholm" not in r.text and "Ada" not in r.text
    for name, ctype in (("console.js", "javascript"), ("console.css", "text/css")):
        f = httpx.get(base + "/console/" + name, timeout=30)
        assert f.status_code == 200 and ctype in f.headers["content-type"], name
    assert httpx.post(base + "/console/", timeout=30).status_code == 405
    assert httpx.get(base + "/console/%2e%2e/smem.db", timeout=30).status_code == 404
    assert httpx.get(base + "/v5/namespaces", timeout=30).status_code == 401
