# SPDX-License-Identifier: MIT
"""Locust 2.x load for playbooks/bench/capacity.yml: closed-loop chat requests to an
OpenAI-compatible endpoint (llama-server behind HAProxy), no think time.

Locust keeps the request counts, failures and latency percentiles (--csv / --json-file). What
it cannot know is how many tokens an answer held: this file reads ``usage.completion_tokens``
(and ``prompt_tokens``) from every answer and writes, at the end of the run, one JSON file
(--vca-tokens-file) with the per-request samples and the run's start and stop times. An answer
without ``usage`` is counted as a failure: a figure is only made of tokens that were counted.

  locust -f capacity_locustfile.py --headless -u 8 -r 8 -t 60s --host http://127.0.0.1:8090 \
    --csv out/load --json-file out/load --vca-tokens-file out/tokens.json
The bearer token, when HAProxy wants one, comes from the environment (VCA_BENCH_TOKEN).

With --vca-stream the requests stream ("stream": true, server-sent events): each sample also has
ttft_ms, the time from the request to its first token (the first event with content), and its tokens
are the final event's usage.completion_tokens (llama-server sends it when asked, stream_options), or
else the events with content counted.
"""

import json
import re
import time

from locust import FastHttpUser, constant, events, task

SAMPLES = []
RUN = {}


@events.init_command_line_parser.add_listener
def _arguments(parser):
    parser.add_argument("--vca-tokens-file", default="tokens.json", help="where the token samples go")
    parser.add_argument("--vca-prompt", default="Write a short story about a lighthouse keeper.")
    parser.add_argument("--vca-max-tokens", type=int, default=128)
    parser.add_argument("--vca-model", default="default", help="the model field of the request")
    parser.add_argument("--vca-stream", action="store_true", help="stream the answers; time the first token")
    parser.add_argument("--vca-token", default="", env_var="VCA_BENCH_TOKEN", is_secret=True,
                        help="bearer token (HAProxy's llm_workers_token), from the environment")


@events.test_start.add_listener
def _start(environment, **_kwargs):
    SAMPLES.clear()
    RUN.clear()
    RUN["start"] = time.time()


@events.test_stop.add_listener
def _stop(environment, **_kwargs):
    RUN["stop"] = time.time()
    opts = environment.parsed_options
    with open(opts.vca_tokens_file, "w") as fh:
        json.dump({"format": "vcafleet-capacity-tokens/1", "start": RUN.get("start"), "stop": RUN["stop"],
                   "max_tokens": opts.vca_max_tokens, "stream": bool(opts.vca_stream), "samples": SAMPLES}, fh)


FIRST_CONTENT = re.compile(r'"content"\s*:\s*"[^"]')


def read_stream(resp, t0):
    """(ttft_ms, usage or None, content events) of a streamed answer, read as it comes. The first token
    is timed when its bytes arrive, not when its event ends: a read returns once it has its whole size,
    so the end of an event can wait for the next one (16 bytes: the content field comes early in
    llama-server's events)."""
    ttft, usage, events, buffer = None, None, 0, ""
    for chunk in resp.iter_content(chunk_size=16):
        buffer += chunk if isinstance(chunk, str) else chunk.decode("utf-8", "replace")
        if ttft is None and FIRST_CONTENT.search(buffer):
            ttft = (time.perf_counter() - t0) * 1000.0
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            data = "".join(line[5:].strip() for line in event.splitlines() if line.startswith("data:"))
            if not data or data == "[DONE]":
                continue
            message = json.loads(data)
            if any((c.get("delta") or {}).get("content") for c in message.get("choices") or []):
                events += 1
            if message.get("usage"):
                usage = message["usage"]
    return ttft, usage, events


class ChatUser(FastHttpUser):
    wait_time = constant(0)
    network_timeout = 600.0
    connection_timeout = 30.0

    @task
    def chat(self):
        opts = self.environment.parsed_options
        headers = {"Content-Type": "application/json"}
        if opts.vca_token:
            headers["Authorization"] = "Bearer %s" % opts.vca_token
        stream = bool(opts.vca_stream)
        body = {"model": opts.vca_model, "max_tokens": opts.vca_max_tokens, "stream": stream,
                "messages": [{"role": "user", "content": opts.vca_prompt}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        t0 = time.perf_counter()
        with self.client.post("/v1/chat/completions", json=body, headers=headers, name="chat-stream" if stream
                              else "chat", catch_response=True, stream=stream) as resp:
            sample = {"t": time.time(), "ms": None, "ok": False, "completion_tokens": None,
                      "prompt_tokens": None, "status": resp.status_code,
                      "worker": resp.headers.get("X-LLM-Worker")}   # HAProxy names the server that answered
            try:
                if stream:
                    ttft, usage, events = read_stream(resp, t0)
                    if ttft is None:
                        raise ValueError("no token in the stream")
                    sample["ttft_ms"] = round(ttft, 3)
                    usage = usage or {"completion_tokens": events}
                else:
                    usage = resp.json()["usage"]
                sample["completion_tokens"] = int(usage["completion_tokens"])
                sample["prompt_tokens"] = int(usage.get("prompt_tokens") or 0)
            except Exception as exc:  # an answer we cannot count is a failure, never zero tokens
                resp.failure("no usage.completion_tokens in the answer (HTTP %s): %s" % (resp.status_code, exc))
            else:
                if resp.status_code == 200:
                    sample["ok"] = True
                    resp.success()
                else:
                    resp.failure("HTTP %s" % resp.status_code)
            sample["ms"] = round((time.perf_counter() - t0) * 1000.0, 3)   # the whole answer, streamed or not
            SAMPLES.append(sample)
