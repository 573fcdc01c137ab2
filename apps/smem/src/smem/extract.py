"""Fact extraction: the interface (smem.llm.LLMExtractor is the chat model behind it), and the windows of a
document's chunks that it is asked about.

With no LLM configured the pipeline records the extract stage as skipped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from smem.text import speaker


@dataclass(frozen=True)
class Fact:
    content: str
    valid_at: str | None = None  # the stored time form (db.parse_time); None: the document's validAt or now
    line: int | None = None      # the non-empty line of the window's text it came from (0-based), if known


class ExtractionError(RuntimeError):
    """Extraction failed after its bounded retries; the document fails with this reason, never silently."""


class Extractor(Protocol):
    model: str         # recorded on each memory it makes
    prompt_hash: str   # sha256 of the prompt and schema, recorded on each memory

    def extract(self, text: str, context: dict) -> list[Fact]:
        """All facts in one window of a document (one or more of its chunks in order, as window_text() joins
        them; see windows()), or ExtractionError. Never a partial list. context: ns, documentId, and window:
        the chunks' [first, last) positions in the document."""
        ...


def windows(tokens: list[int], max_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """The windows extraction asks about: [start, end) ranges over a document's chunks (tokens: each chunk's
    text.estimate_tokens), in order, covering every chunk.

    A window holds as many consecutive chunks as fit in max_tokens (always at least one), so a document that
    fits is one window; the next window starts `overlap` chunks before the end of the one before (a fact
    told over a window's edge is seen whole once), but always after that window's start. max_tokens <= 0:
    one window a chunk (extraction per chunk)."""
    n, out, start = len(tokens), [], 0
    while start < n:
        end, used = start + 1, tokens[start]
        while max_tokens > 0 and end < n and used + tokens[end] <= max_tokens:
            used += tokens[end]
            end += 1
        out.append((start, end))
        if end >= n:
            break
        start = max(start + 1, end - max(overlap, 0))
    return out


def nearest(embeddings: list[bytes | None], vector: np.ndarray) -> int:
    """Which of a window's chunks a fact came from: the one whose embedding is nearest to the fact's (cosine,
    both L2-normalised); 0 when none is embedded."""
    best, score = 0, -2.0
    for i, blob in enumerate(embeddings):
        if blob is not None:
            s = float(np.frombuffer(blob, np.float32) @ vector)
            if s > score:
                best, score = i, s
    return best


def window_text(chunks: list[str]) -> tuple[str, list[int]]:
    """A window's chunks as the model reads them, and for each non-empty line of that text the chunk (its
    position in the window) it came from. One line a chunk, except that in a transcript a piece of a turn (a
    chunk with no speaker label after one that has one) goes on its turn's line, so each line is a whole
    turn again (its first piece's chunk); other documents' chunks are paragraphs, a blank line apart."""
    if not any(speaker(c) for c in chunks):
        text = "\n\n".join(chunks)
        owner = [i for i, c in enumerate(chunks) for ln in c.splitlines() if ln.strip()]
        return text, owner
    lines: list[str] = []
    owner: list[int] = []
    for i, c in enumerate(chunks):
        flat = " ".join(c.split())
        if lines and speaker(c) is None:
            lines[-1] += " " + flat
        elif flat:
            lines.append(flat)
            owner.append(i)
    return "\n".join(lines), owner
