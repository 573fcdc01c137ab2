"""Token estimate and chunking."""

from __future__ import annotations

import math
import re


def estimate_tokens(text: str) -> int:
    """ceil(characters / 4): the usual estimate for English under BPE tokenizers.

    It is what budgetTokens is measured in; no tokenizer of the model that reads the
    context is known to smem, so the estimate errs the same way for every result."""
    return max(1, math.ceil(len(text) / 4))


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _pieces(paragraph: str, limit: int):
    if estimate_tokens(paragraph) <= limit:
        yield paragraph
        return
    for sentence in _SENTENCE.split(paragraph):
        if estimate_tokens(sentence) <= limit:
            yield sentence
            continue
        words, cur = sentence.split(), []
        for w in words:
            if cur and estimate_tokens(" ".join([*cur, w])) > limit:
                yield " ".join(cur)
                cur = []
            cur.append(w)
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
            if cur and estimate_tokens("\n\n".join([*cur, piece])) > max_tokens:
                out.append("\n\n".join(cur))
                cur = []
            cur.append(piece)
    if cur:
        out.append("\n\n".join(cur))
    return out


def normalise(text: str) -> str:
    return " ".join(text.lower().split())
