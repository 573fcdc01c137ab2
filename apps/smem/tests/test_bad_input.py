"""Bad input: a 4xx with a message, and nothing in the database changed."""

from __future__ import annotations

import pytest

TABLES = ("documents", "chunks", "memories", "history", "jobs", "chunks_fts", "memories_fts")


def state(svc):
    return {t: svc.db.scalar("SELECT count(*) FROM %s" % t) for t in TABLES}


CASES = [
    ("POST", "documents", b'{"content": "unterminated', 400, "malformed JSON"),
    ("POST", "documents", b"[1, 2]", 400, "is not of type 'object'"),
    ("POST", "documents", b'{"content": "x", "colour": "red"}', 400, "'colour' was unexpected"),
    ("POST", "documents", b'{"content": "   \\n  "}', 400, "content is empty"),
    ("POST", "documents", b'{"content": 5}', 400, "is not of type 'string'"),
    ("POST", "documents", b'{"content": "' + b"x" * 2001 + b'"}', 413, "max_document_bytes"),
    ("POST", "documents", b'{"content": "x", "validAt": "yesterday"}', 400, "validAt"),
    ("POST", "search", b'{"q": "x", "asOf": "2024-13-45"}', 400, "asOf"),
    ("POST", "search", b'{"q": "x", "mode": "everything"}', 400, "is not one of"),
    ("POST", "search", b'{"q": "x", "rerank": "deep"}', 400, "is not one of"),
    ("POST", "search", b'{"q": ""}', 400, "q"),
    ("POST", "search", b'{"q": "x", "limit": 100000}', 400, "limit"),
    ("POST", "memories", b'{"content": "x", "supersedes": 3}', 400, "is not of type 'string'"),
    ("POST", "memories", b'{"content": "x", "validAt": "soon"}', 400, "validAt"),
    ("POST", "forget", b'{"dryRun": true}', 400, "exactly one"),
    ("POST", "forget", b'{"id": "a", "content": "b"}', 400, "exactly one"),
    ("GET", "memories?asOf=not-a-time", None, 400, "asOf"),
]


@pytest.mark.parametrize("case", CASES, ids=["%s-%d" % (c[1], i) for i, c in enumerate(CASES)])
def test_bad_input_is_refused_and_changes_nothing(make_service, case):
    method, route, body, status, message = case
    svc = make_service(max_document_bytes=2000)
    svc.ingest("alice", "An existing document.")
    svc.remember("alice", "An existing fact.")
    before = state(svc)
    r = svc.call(method, "/v5/ns/alice/" + route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    svc.pipeline.run_until_idle()
    assert state(svc) == before


def test_oversized_body_is_413_before_it_is_read_whole(make_service):
    svc = make_service(max_document_bytes=100)
    r = svc.call("POST", "/v5/ns/alice/documents", content=b'{"content": "' + b"y" * 70000 + b'"}',
                 headers={"content-type": "application/json"})
    assert r.status_code == 413
    assert svc.db.scalar("SELECT count(*) FROM documents") == 0
