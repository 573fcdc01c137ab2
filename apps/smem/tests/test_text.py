"""Chunking: paragraphs packed (chunk), transcripts one turn a chunk (units), context for the index."""

from __future__ import annotations

import pytest

from smem import text

TRANSCRIPT = "\n\n".join([
    "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.",
    "Melanie: Wow, that's cool, Caroline! What happened that was so awesome?",
    "Caroline: The transgender stories were so inspiring! [shares a photo of a mural]",
    "Melanie: That must have felt great.",
])


def test_chunk_packs_paragraphs_as_before():
    assert text.chunk("one.\n\ntwo.\n\nthree.", 200) == ["one.\n\ntwo.\n\nthree."]
    long = "\n\n".join("Paragraph %d is about the lighthouse keeper and the gulls. " % i * 6 for i in range(4))
    pieces = text.chunk(long, 100)
    assert len(pieces) > 1 and all(text.estimate_tokens(p) <= 100 for p in pieces)


def test_a_transcript_is_one_chunk_a_turn_with_blank_lines_or_single_lines():
    want = [" ".join(p.split()) for p in TRANSCRIPT.split("\n\n")]
    assert text.is_transcript(TRANSCRIPT)
    assert text.units(TRANSCRIPT) == want
    assert text.units(TRANSCRIPT.replace("\n\n", "\n")) == want


def test_prose_is_not_a_transcript_and_units_is_chunk():
    prose = "The ferry leaves at 9:40 from Strandvägen.\n\nNote: tickets are sold on board.\nBring cash."
    assert not text.is_transcript(prose)
    assert text.units(prose, 200) == text.chunk(prose, 200)
    assert not text.is_transcript("Only one line: with a colon.")
    assert not text.is_transcript("see https://example.org\nand http://example.com")


def test_a_line_without_a_speaker_continues_the_turn_and_timestamps_are_allowed():
    t = "[10:02] Ann: the build is red\nsince this morning\n[10:03] Bob: on it\n[10:04] Ann: thanks\nAnn: ok"
    assert text.is_transcript(t)
    assert text.turns(t)[0] == "[10:02] Ann: the build is red since this morning"
    assert len(text.units(t)) == 4


def test_a_turn_over_the_limit_is_split():
    long_turn = "Ann: " + "This sentence is long enough to count. " * 40
    t = long_turn + "\nBob: short"
    pieces = text.units(t, 50)
    assert pieces[-1] == "Bob: short"
    assert len(pieces) > 2 and all(text.estimate_tokens(p) <= 50 for p in pieces)


def test_context_adds_neighbours_and_date_and_keeps_the_chunk():
    pieces = text.units(TRANSCRIPT)
    out = text.index_texts(pieces, before=2, after=1, header="8 May 2023")
    assert len(out) == len(pieces)
    assert out[0] == "\n".join(["8 May 2023", pieces[0], pieces[1]])
    assert out[3] == "\n".join(["8 May 2023", pieces[1], pieces[2], pieces[3]])
    assert text.with_context(pieces, 2, before=0, after=0) == pieces[2]


def test_context_is_bounded_in_tokens_each_side():
    pieces = ["word " * 300, "the chunk itself", "after " * 300]
    t = text.with_context(pieces, 1, before=1, after=1, context_tokens=20)
    assert "the chunk itself" in t
    before, after = t.split("the chunk itself")
    assert text.estimate_tokens(before.strip()) <= 20 and text.estimate_tokens(after.strip()) <= 20


@pytest.mark.parametrize(("iso", "label"), [("2023-05-08T13:56:00.000000Z", "8 May 2023"),
                                            ("2021-12-31", "31 December 2021"), (None, None), ("not a date", None)])
def test_date_label(iso, label):
    assert text.date_label(iso) == label
