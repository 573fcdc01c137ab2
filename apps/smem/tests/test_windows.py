"""Extraction over windows of a document's chunks (issue 27, point 8): the windows, one LLM call a window,
each fact's source chunk, no fact twice from an overlap, and a job that resumes from the next window."""

from __future__ import annotations

import json

import pytest

from smem.extract import Fact, window_text, windows
from smem.ingest import Pipeline

# A transcript: text.units makes one chunk a turn.
TURNS = ["Ann: I moved to Oslo last spring.", "Bo: How is the weather there?",
         "Ann: Cold, but I took up the cello.", "Bo: My sister plays the violin in Bergen.",
         "Ann: We should play together some day.", "Bo: She teaches at the conservatory."]
TRANSCRIPT = "\n".join(TURNS)


def test_windows_cover_every_chunk_in_order_with_the_overlap():
    assert windows([10] * 6, 1000, 1) == [(0, 6)]                      # fits: one window, the whole document
    assert windows([10] * 6, 30, 1) == [(0, 3), (2, 5), (4, 6)]         # three a window, one chunk shared
    assert windows([10] * 6, 30, 0) == [(0, 3), (3, 6)]
    assert windows([10] * 4, 0, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]  # 0: one window a chunk, as before
    assert windows([50, 10, 10], 20, 1) == [(0, 1), (1, 3)]             # a chunk over the size is a window alone
    assert windows([10] * 5, 20, 5) == [(0, 2), (1, 3), (2, 4), (3, 5)]  # an overlap never stalls
    assert windows([], 100, 1) == []


class CountingExtractor:
    """One fact a turn (its text after the speaker); `fail_on`: the call numbers that raise."""

    model = "counting"
    prompt_hash = "sha256:test"

    def __init__(self, fail_on=()):
        self.texts, self.fail_on = [], set(fail_on)

    def extract(self, text, context):
        self.texts.append(text)
        if len(self.texts) in self.fail_on:
            raise RuntimeError("the chat node went away")
        return [Fact(line.split(": ", 1)[1]) for line in text.splitlines()]


def run(svc, extractor, **settings):
    p = Pipeline(svc.db, svc.embedder, svc.pipeline.settings.__class__(**{"retry_backoff_s": 0, **settings}),
                 extractor=extractor)
    doc, _ = p.enqueue("alice", TRANSCRIPT, {}, None, None)
    p.run_until_idle()
    return p, doc


def extract_stage(svc, doc):
    return json.loads(svc.db.scalar("SELECT stages FROM jobs WHERE document_id=?", (doc,)))["extract"]


def test_a_document_that_fits_is_one_call_and_each_fact_names_its_chunk(svc):
    ex = CountingExtractor()
    _, doc = run(svc, ex, extract_window_tokens=1000)
    assert ex.texts == [TRANSCRIPT]                       # one call for six turns
    assert extract_stage(svc, doc) == {"state": "done", "facts": 6, "windows": 1, "model": "counting"}
    chunks = {r["id"]: r["content"] for r in svc.db.rows("SELECT id, content FROM chunks WHERE document_id=?",
                                                         (doc,))}
    mems = svc.db.rows("SELECT content, source_chunk_id FROM memories WHERE document_id=?", (doc,))
    assert len(mems) == 6
    for m in mems:   # the nearest chunk of the window: the turn the fact was taken from
        assert chunks[m["source_chunk_id"]].endswith(m["content"]), m


def test_once_a_chunk_when_the_window_is_zero(svc):
    ex = CountingExtractor()
    _, doc = run(svc, ex, extract_window_tokens=0)
    assert ex.texts == TURNS
    assert extract_stage(svc, doc)["windows"] == 6


def test_overlapping_windows_give_each_fact_once(svc):
    ex = CountingExtractor()
    _, doc = run(svc, ex, extract_window_tokens=30, extract_overlap_chunks=1)
    assert len(ex.texts) == 3 and ex.texts[1].startswith(TURNS[2])     # the windows share their edge turn
    contents = [m["content"] for m in svc.db.rows("SELECT content FROM memories WHERE document_id=?", (doc,))]
    assert sorted(contents) == sorted(t.split(": ", 1)[1] for t in TURNS)
    assert extract_stage(svc, doc)["facts"] == 6


def test_a_failed_attempt_resumes_from_the_next_window(svc):
    ex = CountingExtractor(fail_on={2})
    _, doc = run(svc, ex, extract_window_tokens=20, extract_overlap_chunks=0, job_max_attempts=3)
    # Attempt 1: window 1 done and committed, window 2 failed; attempt 2 asked window 2 again, then window 3.
    assert ex.texts == ["\n".join(TURNS[0:2]), "\n".join(TURNS[2:4]), "\n".join(TURNS[2:4]), "\n".join(TURNS[4:6])]
    d = svc.call("GET", "/v5/ns/alice/documents/" + doc).json()
    assert d["status"] == "done" and d["job"]["attempts"] == 1
    assert svc.db.scalar("SELECT count(*) FROM memories WHERE document_id=?", (doc,)) == 6


@pytest.mark.parametrize("key", ["extract_window_tokens", "extract_overlap_chunks"])
def test_window_settings_are_checked(svc, key):
    with pytest.raises(ValueError, match=key):
        svc.pipeline.settings.__class__(**{key: -1})


def test_window_text_puts_a_turns_pieces_back_on_its_line():
    text, owner = window_text(["Ann: We went to the lake.", "The weather was lovely.", "Bo: Nice!"])
    assert text == "Ann: We went to the lake. The weather was lovely.\nBo: Nice!" and owner == [0, 2]
    text, owner = window_text(["First paragraph.\n\nSecond one.", "Third."])   # no transcript: paragraphs
    assert text == "First paragraph.\n\nSecond one.\n\nThird." and owner == [0, 0, 1]


class LineExtractor(CountingExtractor):
    """Says which line each fact is from, with words the line does not have (so nearness cannot tell)."""

    def extract(self, text, context):
        self.texts.append(text)
        return [Fact("fact number %d" % i, line=i) for i, _ in enumerate(text.splitlines())]


def test_a_fact_s_source_is_the_line_the_extractor_names(svc):
    _, doc = run(svc, LineExtractor(), extract_window_tokens=1000)
    rows = svc.db.rows("SELECT m.content, c.seq FROM memories m JOIN chunks c ON c.id = m.source_chunk_id"
                       " WHERE m.document_id=?", (doc,))
    assert sorted((r["content"], r["seq"]) for r in rows) == [("fact number %d" % i, i) for i in range(6)]
