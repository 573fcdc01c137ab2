"""Extraction and the judge through the chat model: the real llama-server end to end; a stub chat server on
127.0.0.1 only where an answer must be wrong (or a decision fixed) on demand."""

from __future__ import annotations

import json
import re

import pytest

from conftest import JSONStub, lane_settings
from smem.llm import EXTRACT_PROMPT, FACTS_SCHEMA, LINES_PROMPT, lines_schema, prompt_hash


def stages(svc, doc):
    return svc.call("GET", "/v5/ns/alice/documents/" + doc).json()


def mems(svc, doc=None):
    sql = "SELECT * FROM memories" + (" WHERE document_id=?" if doc else "") + " ORDER BY rowid"
    return svc.db.rows(sql, (doc,) if doc else ())


def test_real_llm_extracts_facts_and_judges_them(llama_embed, llama_chat, lane_service):
    svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url}},
                                     {"b0": {"embed": llama_embed.url, "chat": llama_chat.url}},
                                     chat=True, llm_max_tokens=300, near_duplicate=0.999, judge_close=0.0))
    first = svc.ingest("alice", "Ann moved to Oslo in 2021. Ann plays the cello every Sunday.")
    d = stages(svc, first)
    assert d["status"] == "done", d
    made = mems(svc, first)
    assert made and d["job"]["stages"]["extract"] == {"state": "done", "facts": len(made), "windows": 1,
                                                      "model": "smollm2-135m-instruct"}
    for m in made:
        assert (m["origin"], m["model"], m["indexed"]) == ("extracted", "smollm2-135m-instruct", 1)
        assert m["prompt_hash"] == prompt_hash([EXTRACT_PROMPT, LINES_PROMPT], [FACTS_SCHEMA, lines_schema(0)])
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", m["prompt_hash"])
    listed = svc.call("GET", "/v5/ns/alice/memories").json()["memories"]
    assert {m["id"] for m in listed} == {m["id"] for m in made}
    assert all(m["promptHash"] == made[0]["prompt_hash"] for m in listed)

    # The judge, for real: every new fact has close candidates (judge_close 0), so the LLM decides each one.
    # Only the contract is asserted: a valid decision, applied.
    second = svc.ingest("alice", "Ann moved to Bergen in 2024.", validAt="2024-06-01")
    d = stages(svc, second)
    assert d["status"] == "done", d
    judge = d["job"]["stages"]["judge"]
    new = mems(svc, second)
    assert judge["state"] == "done" and judge["model"] == "smollm2-135m-instruct"
    assert judge["new"] + judge["duplicate"] + judge["supersedes"] + judge["extends"] == d["job"]["stages"][
        "extract"]["facts"] >= 1
    assert len(new) == d["job"]["stages"]["extract"]["facts"] - judge["duplicate"]
    first_ids = {m["id"] for m in made}
    for m in new:
        assert m["indexed"] == 1
        if m["supersedes"]:
            old = svc.db.one("SELECT * FROM memories WHERE id=?", (m["supersedes"],))
            assert old["id"] in first_ids and old["valid_to"] == m["valid_from"] and old["expired_at"]
        if m["extends"]:
            assert m["extends"] in first_ids
    assert sum(1 for m in new if m["supersedes"]) == judge["supersedes"]
    assert sum(1 for m in new if m["extends"]) == judge["extends"]


class StubChat(JSONStub):
    """A chat server whose answers the test writes: answer(kind, user_text, schema) -> (content, finish_reason)."""

    def __init__(self, answer):
        self.calls = []

        def respond(path, body, headers):
            schema = body["response_format"]["json_schema"]["schema"]
            kind = "judge" if "oneOf" in schema else "extract"
            text = body["messages"][-1]["content"]
            self.calls.append((kind, text))
            content, finish = answer(kind, text, schema)
            return 200, {"choices": [{"index": 0, "finish_reason": finish,
                                      "message": {"role": "assistant", "content": content}}]}
        super().__init__(respond)


@pytest.fixture
def stub_chat():
    made = []

    def make(answer) -> StubChat:
        made.append(StubChat(answer))
        return made[-1]
    yield make
    for s in made:
        s.close()


def facts(*texts):
    return json.dumps({"facts": list(texts)}), "stop"


def test_an_answer_that_fails_validation_fails_the_document_never_done(llama_embed, stub_chat, lane_service):
    bad = iter([("{\"facts\": [\"Ann plays", "stop"),                 # not JSON
                ("{\"facts\": \"Ann plays the cello.\"}", "stop"),     # JSON, not valid against the schema
                ("{\"facts\": [\"Ann plays the cello", "length")])      # cut off at max_tokens

    def answer(kind, text, schema):
        return facts("Ann lives in Oslo.") if "Alpha" in text else next(bad)
    stub = stub_chat(answer)
    svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url}},
                                     {"b0": {"embed": llama_embed.url, "chat": stub.url}},
                                     chat=True, chunk_tokens=8, llm_retries=2, extract_window_tokens=8))
    doc = svc.ingest("alice", "Alpha: Ann lives in Oslo.\n\nBeta: Ann plays the cello.")
    chunks = svc.db.rows("SELECT id FROM chunks WHERE document_id=? ORDER BY seq", (doc,))
    assert len(chunks) == 2
    d = stages(svc, doc)
    assert d["status"] == "failed"
    assert d["error"].startswith("extract: the LLM's answer failed validation 3 times")
    assert "not valid against the schema" in d["error"] and "cut off at max_tokens" in d["error"]
    extract = d["job"]["stages"]["extract"]
    assert extract["state"] == "failed" and extract["chunksDone"] == 1 and extract["facts"] == 1
    assert extract["windows"] == [[0, 1], [1, 2]] and extract["windowsDone"] == 1
    assert extract["failedChunk"] == chunks[1]["id"] and extract["failedWindow"] == [1, 2]
    assert extract["reason"] in d["error"]
    assert d["job"]["attempts"] == 1 and "index" not in d["job"]["stages"]    # no more attempts: it is final
    assert len(stub.calls) == 4
    assert mems(svc) == []          # none from the failed chunk, and none of the chunk before it
    assert svc.search("alice", "Ann Oslo cello", mode="memories")["results"] == []


def test_the_judge_supersedes_and_extends_and_checks_its_target(llama_embed, stub_chat, lane_service):
    decide = {}

    def answer(kind, text, schema):
        if kind == "extract":
            return facts(text.split(": ", 1)[1])
        known = dict(re.findall(r"^(mem_[0-9a-f]+): (.*)$", text, re.M))
        decision, word = decide["next"]
        target = next((i for i, c in known.items() if word in c), "mem_0000000000000000")
        return json.dumps({"decision": decision, "target": target}), "stop"
    stub = stub_chat(answer)
    svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url}},
                                     {"b0": {"embed": llama_embed.url, "chat": stub.url}},
                                     chat=True, near_duplicate=0.999, judge_close=0.0, llm_retries=1))
    oslo = svc.remember("alice", "Ann lives in Oslo.", validAt="2020-01-01")
    cello = svc.remember("alice", "Ann plays the cello.", validAt="2020-01-01")

    decide["next"] = ("supersedes", "Oslo")
    doc = svc.ingest("alice", "Note: Ann lives in Bergen.", validAt="2024-06-01")
    assert stages(svc, doc)["job"]["stages"]["judge"]["supersedes"] == 1
    (bergen,) = mems(svc, doc)
    old = svc.db.one("SELECT * FROM memories WHERE id=?", (oslo["id"],))
    assert bergen["supersedes"] == oslo["id"] and bergen["valid_from"] == "2024-06-01T00:00:00.000000Z"
    assert old["valid_to"] == bergen["valid_from"] and old["expired_at"] and old["forgotten_at"] is None
    now = [m["content"] for m in svc.call("GET", "/v5/ns/alice/memories").json()["memories"]]
    assert "Ann lives in Bergen." in now and "Ann lives in Oslo." not in now
    then = [m["content"] for m in svc.call("GET", "/v5/ns/alice/memories?asOf=2022-01-01").json()["memories"]]
    assert "Ann lives in Oslo." in then and "Ann lives in Bergen." not in then
    hist = svc.call("GET", "/v5/ns/alice/memories?asOf=2022-01-01&history=1").json()["memories"]
    events = {m["id"]: [(h["event"], h["otherId"]) for h in m["history"]] for m in hist}
    assert ("superseded", bergen["id"]) in events[oslo["id"]]
    assert ("created", oslo["id"]) in [(h["event"], h["otherId"]) for h in
                                       svc.db.rows("SELECT event, other_id AS otherId FROM history"
                                                   " WHERE memory_id=?", (bergen["id"],))]

    decide["next"] = ("extends", "cello")
    doc = svc.ingest("alice", "Note: Ann plays the cello in the city orchestra.")
    (orchestra,) = mems(svc, doc)
    assert orchestra["extends"] == cello["id"]
    listed = {m["id"]: m for m in svc.call("GET", "/v5/ns/alice/memories").json()["memories"]}
    assert listed[orchestra["id"]]["extends"] == cello["id"] and cello["id"] in listed   # both stay current
    assert svc.db.scalar("SELECT count(*) FROM history WHERE memory_id=? AND event='extended' AND other_id=?",
                         (cello["id"], orchestra["id"])) == 1
    assert svc.db.scalar("SELECT count(*) FROM memories") == 4   # nothing deleted

    decide["next"] = ("supersedes", "no such fact")   # a target that was not shown: asked again, then failed
    doc = svc.ingest("alice", "Note: Ann sold her cello.")
    d = stages(svc, doc)
    assert d["status"] == "failed" and d["error"].startswith("judge: the LLM's answer failed validation 2 times")
    assert mems(svc, doc) == [] and [k for k, _ in stub.calls[-2:]] == ["judge", "judge"]


def test_a_session_is_one_call_not_one_a_turn(llama_embed, stub_chat, lane_service, tmp_path):
    """Extraction over windows: a transcript that fits extract_window_tokens is asked about once, its turns
    numbered, with a schema of exactly one list a turn; each fact's source is the turn its list stands for.
    With extract_window_tokens = 0, once a turn (as before windows)."""
    seen = []

    def answer(kind, text, schema):
        seen.append(schema)
        lines = text.splitlines()
        if "lines" in schema["properties"]:   # "1. Ann: I moved to Oslo." -> [["I moved to Oslo."], ...]
            return json.dumps({"lines": [[ln.split(": ", 1)[1]] for ln in lines]}), "stop"
        return facts(*(ln.split(": ", 1)[1] for ln in lines))
    turns = ["Ann: I moved to Oslo.", "Bo: Nice, I live in Bergen.", "Ann: I play the cello.", "Bo: I sing."]
    numbered = "\n".join("%d. %s" % (i + 1, t) for i, t in enumerate(turns))
    for window, calls in ((800, [("extract", numbered)]), (0, [("extract", t) for t in turns])):
        seen.clear()
        stub = stub_chat(answer)
        svc = lane_service(lane_settings({"i0": {"embed": llama_embed.url}},
                                         {"b0": {"embed": llama_embed.url, "chat": stub.url}},
                                         chat=True, near_duplicate=0.999, extract_window_tokens=window),
                           path=tmp_path / ("window-%d.db" % window))
        doc = svc.ingest("alice", "\n\n".join(turns))
        assert stages(svc, doc)["status"] == "done"
        assert stub.calls == calls
        if window:
            assert seen[0]["properties"]["lines"]["minItems"] == seen[0]["properties"]["lines"]["maxItems"] == 4
        chunks = {r["id"]: r["content"] for r in svc.db.rows("SELECT id, content FROM chunks")}
        made = mems(svc, doc)
        assert len(made) == 4
        for m in made:
            assert chunks[m["source_chunk_id"]].endswith(m["content"])
