"""Fact extraction and the judge, through llama-server's grammar-constrained JSON on the background lane.

Every answer is parsed and validated (jsonschema, then the caller's own check); one that fails is
asked for again, at most `llm_retries` times, then ExtractionError: never a partial answer."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from smem.extract import ExtractionError, Fact
from smem.lanes import LaneChat
from smem.text import normalise

FACTS_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["facts"],
    "properties": {"facts": {"type": "array", "maxItems": 12,
                             "items": {"type": "string", "minLength": 1, "maxLength": 300}}},
}
EXTRACT_PROMPT = [
    {"role": "system", "content": "You list the facts stated in a text, one short sentence per fact, as JSON."
                                  " A fact names who or what it is about. No facts: an empty list."},
    {"role": "user", "content": "Bo lives in Rome. He likes jazz."},
    {"role": "assistant", "content": json.dumps({"facts": ["Bo lives in Rome.", "Bo likes jazz."]})},
]

DECISIONS = ("supersedes", "extends", "duplicate")
JUDGE_PROMPT = (
    "You compare a new fact with facts already known. Answer with one decision:\n"
    "duplicate: a known fact says the same thing.\n"
    "supersedes: the new fact replaces a known fact that is no longer true (a change of place, job, plan, taste).\n"
    "extends: the new fact adds detail to a known fact; both stay true.\n"
    "new: none of the known facts is about the same thing.\n"
    "For duplicate, supersedes and extends, target is the id of that known fact.")


def judge_schema(ids: list[str]) -> dict:
    return {"oneOf": [
        {"type": "object", "additionalProperties": False, "required": ["decision"],
         "properties": {"decision": {"const": "new"}}},
        {"type": "object", "additionalProperties": False, "required": ["decision", "target"],
         "properties": {"decision": {"enum": list(DECISIONS)}, "target": {"enum": ids}}},
    ]}


def prompt_hash(prompt, schema: dict) -> str:
    return "sha256:" + hashlib.sha256(json.dumps([prompt, schema], sort_keys=True).encode()).hexdigest()


def ask(chat: LaneChat, messages: list[dict], schema: dict, retries: int, check: Callable[[dict], None] | None = None):
    """The first answer that is JSON, valid against schema and passes check (which raises ValueError)."""
    validator = Draft202012Validator(schema)
    errors = []
    for attempt in range(retries + 1):
        # Greedy first; a retry samples, or it would give the same answer again.
        text, finish = chat.complete(messages, schema, temperature=0.0 if attempt == 0 else 0.7)
        try:
            if finish == "length":
                raise ValueError("cut off at max_tokens")
            answer = json.loads(text)
            err = best_match(validator.iter_errors(answer))
            if err is not None:
                raise ValueError("not valid against the schema: %s" % err.message)
            if check:
                check(answer)
            return answer
        except ValueError as e:
            errors.append("answer %d: %s" % (attempt + 1, str(e)[:200]))
    raise ExtractionError("the LLM's answer failed validation %d times (%s)" % (len(errors), "; ".join(errors)))


class LLMExtractor:
    """smem.extract.Extractor on the chat model."""

    def __init__(self, chat: LaneChat, retries: int):
        self.chat, self.retries = chat, retries
        self.model = chat.model
        self.prompt_hash = prompt_hash(EXTRACT_PROMPT, FACTS_SCHEMA)

    def extract(self, chunk: str, context: dict) -> list[Fact]:
        answer = ask(self.chat, [*EXTRACT_PROMPT, {"role": "user", "content": chunk}], FACTS_SCHEMA, self.retries)
        out, seen = [], set()
        for text in answer["facts"]:
            key = normalise(text)
            if key and key not in seen:  # small models repeat themselves
                seen.add(key)
                out.append(Fact(text.strip()))
        return out


class LLMJudge:
    """Decides how a new fact relates to the close current facts shown to it."""

    def __init__(self, chat: LaneChat, retries: int):
        self.chat, self.retries = chat, retries
        self.model = chat.model
        self.prompt_hash = prompt_hash(JUDGE_PROMPT, judge_schema(["<id>"]))

    def decide(self, fact: str, candidates: list[dict]) -> dict:
        """{"decision": new|supersedes|extends|duplicate, "target": a candidate's id or None}."""
        ids = [c["id"] for c in candidates]
        known = "\n".join("%s: %s" % (c["id"], c["content"]) for c in candidates)
        messages = [{"role": "system", "content": JUDGE_PROMPT},
                    {"role": "user", "content": "Known facts:\n%s\n\nNew fact: %s" % (known, fact)}]

        def check(answer: dict) -> None:
            if answer["decision"] != "new" and answer.get("target") not in ids:
                raise ValueError("target %r is not one of the facts shown" % answer.get("target"))
        answer = ask(self.chat, messages, judge_schema(ids), self.retries, check)
        return {"decision": answer["decision"], "target": answer.get("target")}
