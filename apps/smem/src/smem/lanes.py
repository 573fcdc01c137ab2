"""Model lanes: which node servers answer which model calls.

A lane (interactive: search; background: ingest) is a set of nodes, each serving some of the
models (embed, chat, rerank) at a URL. Each call picks the least-busy healthy, unleased server of
its lane for that model; one that fails (connect error, timeout, 5xx, bad shape) is marked down
for `down_s` and the call moves to the next. At most `concurrency` calls are in flight per server.
Every call to a node carries that node's key from `lane_keys_file` (none: no header); a node that
answers 401 is misconfigured, not down: said so, and skipped for `down_s` like a down one."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import numpy as np

from smem.config import Settings
from smem.db import TIME_FMT
from smem.embed import EmbedderError, normalise_rows

log = logging.getLogger("smem.lanes")


class NodeDown(Exception):
    """The server failed this call: mark it down, try the next."""


class Refused(RuntimeError):
    """The server refused the request (4xx): the request's fault, not the node's."""


class InputTooLarge(Refused):
    """The node says the input is more than its model takes (llama-server: "input (N tokens) is too large
    to process", a 500, or exceed_context_size_error, a 400): the request's fault, never the node down."""


class OutOfTime(Exception):
    """The call ran past its caller's budget: the caller degrades its answer; the node is not down."""


class Unauthorized(RuntimeError):
    """The server answered 401: smem's key for the node (lane_keys_file) is not the one it takes.
    Neither the request's fault nor a node down: the configuration's. Skip it, say why."""


class NoNode(RuntimeError):
    """No server of the lane could answer; `down` names the nodes skipped as down. `leased_only`:
    nothing failed, every server that could have answered is leased away (a wait, not an error)."""

    def __init__(self, message: str, down: list[str], leased_only: bool = False):
        super().__init__(message)
        self.down = down
        self.leased_only = leased_only


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime(TIME_FMT)


@dataclass(eq=False)
class Server:
    lane: str
    node: str
    role: str
    url: str
    sem: threading.Semaphore
    client: httpx.Client       # with the node's Authorization header, when it has a key
    inflight: int = 0          # calls assigned to it: waiting for the semaphore or running
    down_until: float = 0.0    # epoch seconds
    auth_error: str | None = None   # why its last call got a 401 (cleared by one that is answered)
    key: str = field(default="", repr=False)
    late_until: float = 0.0    # epoch seconds: it ran past its share of a budget; equally busy nodes go first
    until: float | None = None  # this try's own deadline (time.monotonic()), set by Lanes.call

    @property
    def label(self) -> str:
        return "%s/%s" % (self.lane, self.node)

    def _text(self, r: httpx.Response) -> str:
        text = r.text
        return (text.replace(self.key, "<key>") if self.key else text)[:300]

    def post(self, path: str, body: dict, timeout: float | None = None) -> dict:
        """timeout: the caller's budget for this call (running past it is OutOfTime, not NodeDown)."""
        url = self.url.rstrip("/") + path
        try:
            r = self.client.post(url, json=body, **({"timeout": timeout} if timeout else {}))
        except httpx.TimeoutException as e:
            if timeout is not None:
                raise OutOfTime("%s: over the %.0f ms budget" % (url, 1000 * timeout)) from e
            raise NodeDown("%s: %s" % (url, str(e) or type(e).__name__)) from e
        except httpx.HTTPError as e:
            raise NodeDown("%s: %s" % (url, str(e) or type(e).__name__)) from e
        if r.status_code >= 400 and _too_large(r):
            raise InputTooLarge("%s: the input is too large for the model (answered %d: %s)"
                                % (url, r.status_code, self._text(r)))
        if r.status_code >= 500:
            raise NodeDown("%s answered %d: %s" % (url, r.status_code, self._text(r)))
        if r.status_code == 401:
            why = ("the node refused lane_keys_file's key for %s (its llama-servers' --api-key-file holds another)"
                   if self.key else "the node wants an API key and lane_keys_file has none for %s") % self.node
            raise Unauthorized("%s answered 401 (%s): %s; a configuration error, not the node down"
                               % (url, self._text(r), why))
        if r.status_code >= 400:
            raise Refused("%s answered %d: %s" % (url, r.status_code, self._text(r)))
        try:
            return r.json()
        except ValueError as e:
            raise NodeDown("%s answered something that is not JSON" % url) from e


def _too_large(r: httpx.Response) -> bool:
    try:
        err = r.json().get("error")
    except (ValueError, AttributeError):
        return False
    if not isinstance(err, dict):
        return False
    message = str(err.get("message", ""))
    return err.get("type") == "exceed_context_size_error" or "too large to process" in message


@dataclass
class Answer:
    value: object
    served: str                              # "lane/node"
    down: list[str] = field(default_factory=list)


class Lanes:
    def __init__(self, settings: Settings):
        self.down_s = settings.down_s
        self.cond = threading.Condition()
        self.leases: dict[str, dict] = {}    # node -> {id, holder, expiresAt, until (epoch)}
        self.config: dict[str, dict] = {}
        self.servers: dict[tuple[str, str], list[Server]] = {}
        for lane in settings.lanes or {}:
            cfg = self.config[lane] = settings.lane(lane)
            for node, roles in cfg["nodes"].items():
                key = settings.lane_keys.get(node, "")
                headers = {"Authorization": "Bearer " + key} if key else {}
                for role, url in roles.items():
                    self.servers.setdefault((lane, role), []).append(Server(
                        lane, node, role, url, threading.Semaphore(cfg["concurrency"]),
                        httpx.Client(timeout=cfg["timeout_s"], headers=headers), key=key))

    @property
    def nodes(self) -> set[str]:
        return {s.node for group in self.servers.values() for s in group}

    def has(self, lane: str, role: str) -> bool:
        return bool(self.servers.get((lane, role)))

    def timeout(self, lane: str) -> float:
        return self.config[lane]["timeout_s"]

    # -- calls -----------------------------------------------------------------------------
    def _lease_of(self, node: str) -> dict | None:
        lease = self.leases.get(node)
        if lease and lease["until"] <= time.time():   # expired: the node is back by itself
            del self.leases[node]
            return None
        return lease

    def _pick(self, lane: str, role: str, tried: set, down: list[str]) -> Server | None:
        t = time.time()
        free = []
        for s in self.servers.get((lane, role), []):
            if s in tried or self._lease_of(s.node):
                continue
            if s.down_until > t:
                if s.label not in down:
                    down.append(s.label)
                continue
            free.append(s)
        if not free:
            return None
        # Least busy; between equally busy ones, one that ran late lately goes after the others (then the first).
        return min(free, key=lambda s: (s.inflight, s.late_until > t))

    def _none_left(self, lane: str, role: str, down: list[str], errors: list[str]) -> NoNode:
        group = self.servers.get((lane, role), [])
        why = list(errors)
        if down and not errors:
            refused = {x.label for x in group if x.auth_error}
            if [x for x in down if x not in refused]:
                why.append("down: " + ", ".join(x for x in down if x not in refused))
            if [x for x in down if x in refused]:
                why.append("skipped, they refused their key from lane_keys_file (a configuration error, see the"
                           " log): " + ", ".join(x for x in down if x in refused))
        leased = sorted({x.node for x in group if self._lease_of(x.node)})
        if leased:
            why.append("leased: " + ", ".join(leased))
        return NoNode("no %s node in the %s lane could answer (%s)" % (role, lane, "; ".join(why) or "none configured"),
                      down, leased_only=bool(leased) and not down and not errors)

    def _share_left(self, lane: str, role: str, s: Server, tried: set) -> int:
        """How many servers the rest of a budget is split over: s and the healthy ones not yet tried."""
        t = time.time()
        return 1 + sum(1 for x in self.servers.get((lane, role), []) if x not in tried and x is not s
                       and x.down_until <= t and not self._lease_of(x.node))

    def _skip(self, s: Server, role: str, e: Exception, down: list[str], errors: list[str]) -> None:
        """s failed (NodeDown, a 401): skipped for down_s, so that the lane's other nodes answer; a 401 is
        logged as what it is."""
        if isinstance(e, Unauthorized):
            s.auth_error = str(e)
            log.error("%s %s: skipped for %.0f s: %s", s.label, role, self.down_s, e)
        else:
            log.warning("%s %s: down for %.0f s: %s", s.label, role, self.down_s, e)
        s.down_until = time.time() + self.down_s
        down.append(s.label)
        errors.append(str(e))

    def call(self, lane: str, role: str, fn: Callable[[Server], object], deadline: float | None = None) -> Answer:
        """fn(server) on the least-busy healthy unleased server; NodeDown (or Unauthorized) moves on, NoNode
        when none is left (or when time.monotonic() passes deadline). Within a deadline each try gets its
        share of the time left (server.until): a slow node leaves time for the next."""
        tried: set[Server] = set()
        down: list[str] = []
        errors: list[str] = []
        while True:
            if deadline is not None and time.monotonic() >= deadline:
                raise NoNode("%s in the %s lane: out of time (%s)" % (role, lane, "; ".join(errors) or "-"), down)
            with self.cond:
                s = self._pick(lane, role, tried, down)
                if s is None:
                    raise self._none_left(lane, role, down, errors)
                s.inflight += 1
                left = self._share_left(lane, role, s, tried)
            tried.add(s)
            started = time.monotonic()
            s.until = None if deadline is None else started + (deadline - started) / left
            try:
                wait = self.timeout(lane)
                if deadline is not None:   # the caller's budget bounds the wait for a slot too
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                if not s.sem.acquire(timeout=wait):
                    errors.append("%s busy" % s.label)
                    continue
                try:
                    with self.cond:
                        leased = self._lease_of(s.node) is not None  # leased while this call waited
                    if leased:
                        continue
                    value = fn(s)
                    s.auth_error = None
                    return Answer(value, s.label, down)
                finally:
                    s.sem.release()
            except OutOfTime as e:
                # Slow for this call, not broken: not marked down, but for down_s it goes after the lane's
                # other idle nodes; the rest of the budget goes to the next node.
                log.info("%s %s: past its share of the budget: %s", s.label, role, e)
                s.late_until = time.time() + self.down_s
                errors.append(str(e))
                if deadline is None or time.monotonic() >= deadline:
                    raise NoNode("%s in the %s lane: out of time (%s)" % (role, lane, e), down) from e
            except (NodeDown, Unauthorized) as e:
                self._skip(s, role, e, down, errors)
            finally:
                with self.cond:
                    s.inflight -= 1
                    self.cond.notify_all()

    # -- leases (smem.leases keeps them in the database) -----------------------------------
    def lease(self, nodes: list[str], lease: dict) -> None:
        with self.cond:
            for n in nodes:
                self.leases[n] = lease

    def unlease(self, lease_id: str) -> None:
        with self.cond:
            for n in [n for n, lease in self.leases.items() if lease["id"] == lease_id]:
                del self.leases[n]

    def drain(self, nodes: list[str], timeout: float) -> bool:
        """Waits until no call is in flight on these nodes; False if that took longer than timeout."""
        busy = [s for group in self.servers.values() for s in group if s.node in nodes]
        with self.cond:
            return self.cond.wait_for(lambda: not any(s.inflight for s in busy), timeout)

    def report(self) -> dict:
        out: dict = {}
        t = time.time()
        with self.cond:
            for (lane, role), group in self.servers.items():
                cfg = self.config[lane]
                lane_out = out.setdefault(lane, {"concurrency": cfg["concurrency"], "timeoutS": cfg["timeout_s"],
                                                 "nodes": {}})
                for s in group:
                    node = lane_out["nodes"].setdefault(s.node, {"models": {}, "inFlight": 0, "downUntil": None,
                                                                 "leasedBy": None})
                    down = iso(s.down_until) if s.down_until > t else None
                    node["models"][role] = {"url": s.url, "inFlight": s.inflight, "downUntil": down,
                                            "authError": s.auth_error}
                    node["inFlight"] += s.inflight
                    if down and (node["downUntil"] is None or down > node["downUntil"]):
                        node["downUntil"] = down
                    lease = self._lease_of(s.node)
                    node["leasedBy"] = lease and {k: lease[k] for k in ("id", "holder", "expiresAt")}
        return out


def _shape(what: str, s: Server, get: Callable[[], object]):
    try:
        return get()
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        raise NodeDown("%s %s: unexpected answer (%s: %s)" % (s.label, what, type(e).__name__, e)) from e


class LaneEmbedder:
    """The embeddings model through a lane (ingest: background, falling back to interactive)."""

    def __init__(self, lanes: Lanes, model: dict, lane: str, fallback: str | None = None):
        self.lanes, self.lane, self.fallback = lanes, lane, fallback
        self.model, self.name, self.dim = model["name"], "http:%s" % model["name"], int(model["dim"])

    def _fn(self, texts: list[str]):
        def fn(s: Server) -> np.ndarray:
            data = s.post("/v1/embeddings", {"model": self.model, "input": texts})
            v = _shape("embeddings", s, lambda: np.asarray(
                [d["embedding"] for d in sorted(data["data"], key=lambda d: d["index"])], dtype=np.float32))
            if v.shape != (len(texts), self.dim):
                raise NodeDown("%s embeddings: shape %s, expected (%d, %d)" % (s.label, v.shape, len(texts), self.dim))
            return normalise_rows(v)
        return fn

    def embed_answer(self, texts: list[str]) -> Answer:
        """The vectors, who served them and which nodes were skipped as down; EmbedderError (with .down) if none."""
        if not texts:
            return Answer(np.zeros((0, self.dim), dtype=np.float32), "none")
        down: list[str] = []
        errors = []
        refused = False
        for lane in (self.lane, self.fallback):
            if lane is None:
                continue
            try:
                a = self.lanes.call(lane, "embed", self._fn(texts))
                a.down = down + a.down
                return a
            except NoNode as e:
                down += e.down
                errors.append(str(e))
            except InputTooLarge:
                raise   # the same input is as large for the fallback lane
            except Refused as e:
                errors.append(str(e))
                refused = True
                break
        err = EmbedderError("; ".join(errors))
        err.down = down
        err.transient = not refused   # nodes down or out of time: worth retrying; a refusal is not
        raise err

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_answer(texts).value


def embed_answer(embedder, texts: list[str]) -> Answer:
    """Any embedder: a lane embedder says who served; any other is "local"."""
    if isinstance(embedder, LaneEmbedder):
        return embedder.embed_answer(texts)
    return Answer(embedder.embed(texts), "local")


class LaneChat:
    """The chat model on the background lane (never the interactive one): one JSON-schema-constrained answer."""

    def __init__(self, lanes: Lanes, model: dict, max_tokens: int):
        self.lanes, self.model, self.max_tokens = lanes, model["name"], max_tokens

    def complete(self, messages: list[dict], schema: dict, temperature: float = 0.0) -> tuple[str, str]:
        """(the answer's text, finish_reason); the caller validates the text. NoNode or Refused if no node answers."""
        body = {"model": self.model, "messages": messages, "temperature": temperature,
                "max_tokens": self.max_tokens,
                "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}

        def fn(s: Server) -> tuple[str, str]:
            data = s.post("/v1/chat/completions", body)
            choice = _shape("chat", s, lambda: data["choices"][0])
            text = _shape("chat", s, lambda: choice["message"]["content"])
            if not isinstance(text, str):
                raise NodeDown("%s chat: content is not text" % s.label)
            return text, choice.get("finish_reason") or ""
        return self.lanes.call("background", "chat", fn).value


class LaneReranker:
    """llama-server's /v1/rerank on the interactive lane, within a time budget."""

    def __init__(self, lanes: Lanes, model: dict):
        self.lanes, self.model = lanes, model["name"]

    def rerank(self, query: str, documents: list[str], budget_s: float) -> Answer:
        """Answer.value: a relevance score per document, in their order; NoNode when over budget."""
        deadline = time.monotonic() + budget_s

        def fn(s: Server) -> list[float]:
            until = min(deadline, s.until or deadline)   # this node's share of the budget
            data = s.post("/v1/rerank", {"model": self.model, "query": query, "documents": documents,
                                         "top_n": len(documents)}, timeout=max(until - time.monotonic(), 0.001))
            scores = _shape("rerank", s, lambda: {int(r["index"]): float(r["relevance_score"])
                                                  for r in data["results"]})
            if sorted(scores) != list(range(len(documents))):
                raise NodeDown("%s rerank: %d scores for %d documents" % (s.label, len(scores), len(documents)))
            return [scores[i] for i in range(len(documents))]
        return self.lanes.call("interactive", "rerank", fn, deadline)
