"""Token estimate and chunking."""

from __future__ import annotations

import math
import re
import unicodedata
from datetime import datetime


def estimate_tokens(text: str) -> int:
    """ceil(ASCII characters / 4) + one per other character.

    English under BPE and WordPiece tokenizers runs near four characters a token; CJK, kana, hangul
    and Thai are about one token a character (or more), and other scripts fewer characters a token
    than English. So a chunk bounded by this estimate stays within the embedder's tokens in any
    script. It is also what budgetTokens is measured in: no tokenizer of the model that reads the
    context is known to smem, so the estimate errs the same way for every result."""
    ascii_chars = sum(1 for ch in text if ch < "\x80")
    return max(1, math.ceil(ascii_chars / 4) + len(text) - ascii_chars)


# A sentence ends at . ! ? and a space, or at a CJK full stop, exclamation or question mark.
_SENTENCE = re.compile(r"(?<=[.!?])\s+|(?<=[\u3002\uff01\uff1f])\s*")


def _weights(ch: str) -> tuple[int, int]:
    """(quarter tokens, whole tokens) of one character in chunk_tokens."""
    if ch < "\x80":
        return (1, 0) if ch.isalpha() or ch.isspace() else (0, 1)
    return 0, len(unicodedata.normalize("NFD", ch))


def chunk_tokens(text: str) -> int:
    """What bounds a chunk: ceil(ASCII letters and spaces / 4) + one per ASCII digit or punctuation mark
    + one per code point of every other character once decomposed (NFD).

    Above estimate_tokens where embedders' tokenizers are: WordPiece and SentencePiece give digits and
    punctuation a token each, and WordPiece (all-MiniLM-L6-v2) decomposes accents, kana marks and Hangul
    syllables into pieces that cost a token each. A chunk within this stays within the model's tokens in
    any script; what still does not (random letters) the node refuses, and that is the document's error."""
    quarters = whole = 0
    for ch in text:
        q, w = _weights(ch)
        quarters += q
        whole += w
    return max(1, math.ceil(quarters / 4) + whole)


def _cut(word: str, limit: int):
    """A run with no space in it (a long URL, CJK or Thai text), in pieces of at most `limit` tokens."""
    start, quarters, whole = 0, 0, 0
    for i, ch in enumerate(word):
        q, w = _weights(ch)
        if i > start and math.ceil((quarters + q) / 4) + whole + w > limit:
            yield word[start:i]
            start, quarters, whole = i, 0, 0
        quarters, whole = quarters + q, whole + w
    if start < len(word):
        yield word[start:]


def _pieces(paragraph: str, limit: int):
    if chunk_tokens(paragraph) <= limit:
        yield paragraph
        return
    for sentence in _SENTENCE.split(paragraph):
        if not sentence:
            continue
        if chunk_tokens(sentence) <= limit:
            yield sentence
            continue
        cur: list[str] = []
        used = 0
        for w in sentence.split():
            n = chunk_tokens(w)
            if n > limit:
                if cur:
                    yield " ".join(cur)
                    cur, used = [], 0
                yield from _cut(w, limit)
                continue
            if cur and chunk_tokens(" ".join([*cur, w])) > limit:
                yield " ".join(cur)
                cur, used = [], 0
            cur.append(w)
            used += n
        if cur:
            yield " ".join(cur)


def chunk(text: str, max_tokens: int = 200) -> list[str]:
    """Paragraphs packed together up to max_tokens; a longer paragraph split at sentences, then words."""
    out: list[str] = []
    cur: list[str] = []
    for para in (p.strip() for p in re.split(r"\n\s*\n", text)):
        if not para:
            continue
        for piece in _pieces(" ".join(para.split()), max_tokens):
            if cur and chunk_tokens("\n\n".join([*cur, piece])) > max_tokens:
                out.append("\n\n".join(cur))
                cur = []
            cur.append(piece)
    if cur:
        out.append("\n\n".join(cur))
    return out


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


# -- retrieval units with context ----------------------------------------------------------------
# A dialogue turn is the unit a question's answer lives in; packed with its neighbours into one
# 200-token chunk it costs five turns of the budget. So a transcript is chunked one turn a chunk,
# and what the BM25 index reads of a chunk is the chunk with its neighbours and the document's date
# ("context"), while what search returns and counts against budgetTokens is the chunk alone.

# "Name: text", optionally after a [timestamp]: a speaker label of at most 40 characters.
_TURN = re.compile(r"^\s*(?:\[[^\]\n]{1,40}\]\s*)?[^\s:\[][^:\n]{0,39}:\s+\S")


def is_transcript(text: str) -> bool:
    """At least two lines, and at least 80% of the non-empty lines, start with a speaker label."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    turns = sum(1 for ln in lines if _TURN.match(ln))
    return turns >= 2 and turns >= 0.8 * len(lines)


def speaker(chunk: str) -> str | None:
    """The speaker label a transcript's turn starts with ("Ann" of "Ann: ..." or "[10:02] Ann: ..."), or None."""
    if not _TURN.match(chunk):
        return None
    label = chunk.split(":", 1)[0] if not chunk.lstrip().startswith("[") else chunk.split("]", 1)[1].split(":", 1)[0]
    return " ".join(label.split()) or None


def turns(text: str) -> list[str]:
    """A transcript's turns, one per speaker label; a line without a label continues the turn before it."""
    out: list[str] = []
    for raw in text.splitlines():
        line = " ".join(raw.split())
        if not line:
            continue
        if out and not _TURN.match(line):
            out[-1] += " " + line
        else:
            out.append(line)
    return out


def units(text: str, max_tokens: int = 200, turn_tokens: int | None = None) -> list[str]:
    """The chunks search should return: one per turn for a transcript (a turn over max_tokens, or over
    turn_tokens when given, split at sentences, then words), else chunk(text, max_tokens)."""
    if not is_transcript(text):
        return chunk(text, max_tokens)
    limit = min(max_tokens, turn_tokens) if turn_tokens else max_tokens
    return [piece for turn in turns(text) for piece in _pieces(turn, limit)]


def date_label(iso: str | None) -> str | None:
    """A stored time (or any ISO-8601 date) as words BM25 can match: "8 May 2023"."""
    if not iso:
        return None
    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    return "%d %s %d" % (t.day, t.strftime("%B"), t.year)


def _head(text: str, tokens: int) -> str:
    if estimate_tokens(text) <= tokens:
        return text
    return text[:4 * tokens].rsplit(" ", 1)[0]


def _tail(text: str, tokens: int) -> str:
    if estimate_tokens(text) <= tokens:
        return text
    return text[-4 * tokens:].split(" ", 1)[-1]


def with_context(pieces: list[str], i: int, *, before: int = 2, after: int = 2, header: str | None = None,
                 context_tokens: int = 100) -> str:
    """pieces[i] as the index reads it: header (the document's date), up to `before` pieces before it
    and `after` after it, each side at most context_tokens (the far end cut at a word)."""
    prev = "\n".join(pieces[max(0, i - before):i])
    nxt = "\n".join(pieces[i + 1:i + 1 + after])
    parts = [header, _tail(prev, context_tokens) if prev else None, pieces[i],
             _head(nxt, context_tokens) if nxt else None]
    return "\n".join(p for p in parts if p)


def index_texts(pieces: list[str], *, before: int = 2, after: int = 2, header: str | None = None,
                context_tokens: int = 100) -> list[str]:
    return [with_context(pieces, i, before=before, after=after, header=header, context_tokens=context_tokens)
            for i in range(len(pieces))]
