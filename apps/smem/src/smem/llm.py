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

# A window of many lines (a conversation's turns): one answer item per line, each the facts that line states
# (maybe none), so that a small model reads every line and each fact names the line it came from.
LINES_PROMPT = [
    {"role": "system", "content": "For each numbered line of a conversation, list the facts it states, one short"
                                  " sentence per fact, as JSON: one list per line, in order. A fact names who or"
                                  " what it is about. A line that states no fact: an empty list."},
    {"role": "user", "content": "1. Ann: I moved to Oslo in May.\n2. Bo: Nice! I still live in Bergen.\n"
                                "3. Ann: Thanks!\n4. Bo: My sister plays the violin."},
    {"role": "assistant", "content": json.dumps({"lines": [["Ann moved to Oslo in May."], ["Bo lives in Bergen."],
                                                           [], ["Bo's sister plays the violin."]]})},
]


def lines_schema(n: int) -> dict:
    return {"type": "object", "additionalProperties": False, "required": ["lines"],
            "properties": {"lines": {"type": "array", "minItems": n, "maxItems": n,
                                     "items": {"type": "array", "maxItems": 4,
                                               "items": {"type": "string", "minLength": 1, "maxLength": 300}}}}}


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
    """smem.extract.Extractor on the chat model. A window of one line is asked for its facts; a window of several
    (a conversation's turns, one a line) for each line's facts, numbered, with an answer schema of exactly that
    many lists, so that no line is skipped; a fact's `line` says which it came from."""

    def __init__(self, chat: LaneChat, retries: int):
        self.chat, self.retries = chat, retries
        self.model = chat.model
        self.prompt_hash = prompt_hash([EXTRACT_PROMPT, LINES_PROMPT], [FACTS_SCHEMA, lines_schema(0)])

    def extract(self, text: str, context: dict) -> list[Fact]:
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if len(lines) <= 1:
            answer = ask(self.chat, [*EXTRACT_PROMPT, {"role": "user", "content": text}], FACTS_SCHEMA, self.retries)
            found = [(t, None) for t in answer["facts"]]
        else:
            numbered = "\n".join("%d. %s" % (i + 1, ln) for i, ln in enumerate(lines))
            answer = ask(self.chat, [*LINES_PROMPT, {"role": "user", "content": numbered}], lines_schema(len(lines)),
                         self.retries)
            found = [(t, i) for i, facts in enumerate(answer["lines"]) for t in facts]
        out, seen = [], set()
        for t, line in found:
            key = normalise(t)
            if key and key not in seen:  # small models repeat themselves
                seen.add(key)
                out.append(Fact(t.strip(), line=line))
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
