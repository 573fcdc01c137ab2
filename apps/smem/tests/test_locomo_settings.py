"""The README's settings list says the defaults the code has (issue 27: it said rrf_k 60, the code had 10)."""

from __future__ import annotations

import re
from pathlib import Path

from smem.config import Settings

README = Path(__file__).resolve().parent.parent / "README.md"
KEYS = ("chunk_tokens", "turn_tokens", "rrf_k", "bm25_weight", "context_before", "context_after", "context_date",
        "speaker_boost", "candidates", "extract_window_tokens", "extract_overlap_chunks", "llm_max_tokens")


def test_readme_defaults_are_the_codes():
    text = README.read_text()
    section = text[text.index("## Settings"):text.index("## Model lanes")]
    defaults = Settings()
    for key in KEYS:
        m = re.search(r"`%s` \(([^):]+)" % key, section)
        assert m, "%s is not in the README's settings" % key
        said, has = m.group(1).strip(), getattr(defaults, key)
        value = {"true": True, "false": False}.get(said, None)
        value = float(said) if value is None else value
        assert value == has, "%s: the README says %s, the code has %r" % (key, said, has)
