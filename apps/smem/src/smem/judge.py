"""The judge: how a new fact relates to the namespace's current facts (new, duplicate, supersedes,
extends). The duplicate check always; the LLM (smem.llm.LLMJudge) only where current facts are close."""

from __future__ import annotations

import numpy as np

from smem.config import Settings
from smem.db import DB
from smem.extract import ExtractionError
from smem.facts import find_duplicate, nearest_current, newer_duplicate


class JudgeFailed(Exception):
    """The LLM's answers failed validation: the document fails, with `result` as the stage's record."""

    def __init__(self, reason: str, result: dict):
        super().__init__(reason)
        self.result = result


class Judge:
    def __init__(self, db: DB, settings: Settings, llm=None):
        self.db, self.settings, self.llm = db, settings, llm

    @property
    def decisions(self) -> tuple[str, ...]:
        return ("new", "duplicate", *(("supersedes", "extends") if self.llm else ()))

    def decide(self, ns: str, m: dict) -> dict:
        """{"decision", "target"} for a pending fact m (id, content, embedding)."""
        vector = np.frombuffer(m["embedding"], np.float32)
        same = find_duplicate(self.db, ns, m["content"], vector, self.settings.near_duplicate)
        if same:
            return {"decision": "duplicate", "target": same}
        if self.llm is None:
            return {"decision": "new", "target": None}
        close = nearest_current(self.db, ns, vector, self.settings.judge_candidates, self.settings.judge_close)
        if not close:
            return {"decision": "new", "target": None}
        try:
            return self.llm.decide(m["content"], close)
        except ExtractionError as e:
            raise JudgeFailed(str(e), {"state": "failed", "memory": m["id"], "reason": str(e)}) from e

    def recheck(self, ns: str, m: dict, d: dict, after: int) -> dict:
        """Under the write lock: a "new" decision made before it, against the facts written since (rowid >=
        after) only; a duplicate among them makes it a duplicate."""
        if d["decision"] != "new":
            return d
        vector = np.frombuffer(m["embedding"], np.float32)
        same = newer_duplicate(self.db, ns, m["content"], vector, near=self.settings.near_duplicate, after=after)
        return {"decision": "duplicate", "target": same} if same else d

    def settle(self, decisions: list[tuple[dict, dict]], current) -> list[tuple[dict, str, str | None]]:
        """The decisions as they may be applied now: current(target) is the target's valid_from if it is
        still current, else None. A fact closes another only if it is later, and only one fact closes it."""
        out, closing = [], set()
        for m, d in decisions:
            kind, target = d["decision"], d["target"]
            old = current(target) if target else None
            if kind != "new" and old is None:
                kind = "new"   # the target was closed or forgotten meanwhile
            if kind == "supersedes" and (m["valid_from"] <= old or target in closing):
                kind = "new"
            if kind == "supersedes":
                closing.add(target)
            out.append((m, kind, target if kind != "new" else None))
        return out

    def record(self) -> dict:
        return {"model": self.llm.model, "promptHash": self.llm.prompt_hash} if self.llm else {}
