"""Settings: embedded defaults, overridden by a TOML file (`smem serve --config FILE`)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields


@dataclass
class Settings:
    max_document_bytes: int = 1_000_000   # a larger POST body is refused with 413
    chunk_tokens: int = 200               # text.estimate_tokens units
    rrf_k: int = 60                       # Reciprocal Rank Fusion: score = sum 1 / (rrf_k + rank)
    candidates: int = 50                  # per list (BM25, vectors) before fusion
    default_limit: int = 10
    max_limit: int = 100
    near_duplicate: float = 0.97          # cosine at or above which a new fact is a duplicate
    workers: int = 1
    embed_batch: int = 16
    job_max_attempts: int = 3
    retry_backoff_s: float = 2.0          # a failed stage waits retry_backoff_s * 2**attempts (at most 60 s)
    poll_interval_s: float = 0.5
    allow_public_listen: bool = False     # listening on 0.0.0.0 / :: needs this, explicitly
    embedder: dict = field(default_factory=lambda: {"kind": "local"})
    llm: dict | None = None               # not yet: extraction through llama-server's json_schema
    reranker: dict | None = None          # not yet
    test_chunk_sleep_s: float = 0.0       # tests only: each chunk's embedding waits this long


def load(path: str | None) -> Settings:
    s = Settings()
    if not path:
        return s
    with open(path, "rb") as f:
        data = tomllib.load(f)
    known = {f.name for f in fields(Settings)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError("%s: unknown settings %s" % (path, ", ".join(unknown)))
    for k, v in data.items():
        setattr(s, k, v)
    return s
