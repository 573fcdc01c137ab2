"""Fact extraction: the interface (smem.llm.LLMExtractor is the chat model behind it).

With no LLM configured the pipeline records the extract stage as skipped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Fact:
    content: str
    valid_at: str | None = None  # the stored time form (db.parse_time); None: the document's validAt or now


class ExtractionError(RuntimeError):
    """Extraction failed after its bounded retries; the document fails with this reason, never silently."""


class Extractor(Protocol):
    model: str         # recorded on each memory it makes
    prompt_hash: str   # sha256 of the prompt and schema, recorded on each memory

    def extract(self, chunk: str, context: dict) -> list[Fact]:
        """All facts in one chunk, or ExtractionError. Never a partial list."""
        ...
