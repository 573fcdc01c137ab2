"""Settings: embedded defaults, overridden by a TOML file (`smem serve --config FILE`)."""

from __future__ import annotations

import json
import re
import tomllib
from dataclasses import dataclass, field, fields

ROLES = ("embed", "chat", "rerank")
LANES = {"interactive": {"concurrency": 2, "timeout_s": 10.0},   # search: query embeddings, rerank
         "background": {"concurrency": 1, "timeout_s": 120.0}}   # ingest: embeddings, extraction, judge


@dataclass
class Settings:
    max_document_bytes: int = 1_000_000   # a larger POST body is refused with 413
    max_drain_bytes: int = 128 * 2**20    # of a body over the cap, this much is read (and dropped) before the 413
    chunk_tokens: int = 200               # text.estimate_tokens units
    turn_tokens: int = 0                  # a transcript's turn over this is split at sentences (0: chunk_tokens)
    rrf_k: int = 20                       # Reciprocal Rank Fusion: score = sum weight / (rrf_k + rank)
    bm25_weight: float = 2.0              # the BM25 lists' weight in the fusion (vector lists: 1)
    context_before: int = 2               # chunks of the document before a chunk that its BM25 entry holds
    context_after: int = 4                # ... and after it (search still returns and counts the chunk alone)
    context_date: bool = True             # and the document's validAt in words ("8 May 2023")
    candidates: int = 50                  # per list (BM25, vectors) before fusion
    # KNN (search, the duplicate check, the judge): this many times the candidates by the bit vectors, then
    # ranked exactly by cosine (smem.vectors); 0: exact KNN over the namespace's float vectors.
    coarse_oversample: int = 8
    # The bit vectors of the namespaces queried, held in memory (smem.bit_cache) up to this many MiB in all
    # (about 70 MiB a million 384-dim vectors), the least recently used dropped first; a namespace larger than
    # this, and every one with 0, is scanned in SQLite instead (~0.5 s of CPU a query at a million).
    bit_cache_mb: int = 256
    # The keyword phase reads at most about this many index rows a word (smem.search._bm25): a word that
    # matches more is left out of BM25 where a rarer word is in the query, else only its newest matches count.
    keyword_scan: int = 4000
    speaker_boost: float = 0.4            # a transcript turn whose speaker the query names: score * (1 + this)
    default_limit: int = 10
    max_limit: int = 100
    near_duplicate: float = 0.97          # cosine at or above which a new fact is a duplicate
    workers: int = 1
    synchronous: str = "FULL"             # SQLite's: FULL, a 202 is on disk; NORMAL, faster, a power cut may lose it
    db_retry_max_s: float = 30.0          # a worker's database error is retried with backoff up to this
    stuck_after_s: float = 600.0          # /healthz fails when a due job waited this long and no job moved
    embed_batch: int = 16
    job_max_attempts: int = 3
    retry_backoff_s: float = 2.0          # a failed stage waits retry_backoff_s * 2**attempts (at most 60 s)
    # A model call that failed outside the document (node down, timeout, 5xx) spends no attempt: the job waits
    # transient_backoff_s * 2**n (at most transient_backoff_max_s) and tries the lane again, for this long.
    transient_retry_s: float = 900.0
    transient_backoff_s: float = 2.0
    transient_backoff_max_s: float = 60.0
    poll_interval_s: float = 0.5
    lease_wait_s: float = 5.0             # a job whose lane is all leased away looks again after this
    allow_public_listen: bool = False     # listening on every address (0.0.0.0, ::, a name for one) needs this
    embedder: dict = field(default_factory=lambda: {"kind": "local"})   # without [lanes]
    models: dict | None = None            # [models] embed/chat/rerank: names (and the embedding dim)
    lanes: dict | None = None             # [lanes.interactive], [lanes.background]: nodes serving the models
    down_s: float = 15.0                  # a node whose call failed is skipped this long
    # A JSON file {"node": "key"}: each call to a lane node carries its key (Authorization: Bearer), the one
    # its llama-servers take (--api-key-file). A node not in it gets no header. "": no keys.
    lane_keys_file: str = ""
    lane_keys: dict = field(default_factory=dict, init=False, repr=False, compare=False)   # read from it
    llm_retries: int = 2                  # an LLM answer that fails validation is asked for again, this often
    llm_max_tokens: int = 512             # per extraction or judge answer
    # Extraction asks the chat model about windows of a document's chunks (smem.extract.windows), not each chunk:
    # consecutive chunks up to this many tokens (text.estimate_tokens) a window, so a session that fits is one
    # call; 0: one call a chunk.
    extract_window_tokens: int = 0
    extract_overlap_chunks: int = 1       # a window starts this many chunks before the end of the one before
    judge_candidates: int = 5             # the nearest current facts the judge shows the LLM
    judge_close: float = 0.6              # cosine at or above which a current fact is a candidate
    rerank_top_k: int = 20                # only the fused top k go to the reranker
    rerank_budget_ms: float = 800.0       # over it, search answers unreranked ("reranker" in degraded)
    test_chunk_sleep_s: float = 0.0       # tests only: each chunk's embedding waits this long
    erase_checkpoint_tries: int = 5       # after an erase, the WAL checkpoint is tried this often
    erase_checkpoint_wait_s: float = 1.0  # each try waits this long for readers of older snapshots
    # A node whose lanes it shares with the host's LLM workers (roles/llm_workers): a lease drains the
    # node's worker in HAProxy too, through this admin socket, and its end returns it ("": off).
    haproxy_socket: str = ""
    haproxy_backend: str = "llm_workers"
    haproxy_sync_s: float = 5.0           # expired leases are noticed, and a missed command retried, this often

    def __post_init__(self):
        validate(self)
        self.lane_keys = read_lane_keys(self.lane_keys_file) if self.lane_keys_file else {}

    def model(self, role: str) -> dict | None:
        return (self.models or {}).get(role)

    def lane(self, name: str) -> dict:
        """A lane's table with its defaults filled in ({"nodes": {}} when the lane is absent)."""
        return {**LANES[name], "nodes": {}, **(self.lanes or {}).get(name, {})}


def _keys(where: str, table, known) -> None:
    if not isinstance(table, dict):
        raise ValueError("%s: expected a table, got %r" % (where, table))
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ValueError("%s: unknown key %s (known: %s)" % (where, ", ".join(unknown), ", ".join(sorted(known))))


def validate(s: Settings) -> None:
    if not isinstance(s.lane_keys_file, str):
        raise ValueError("lane_keys_file: a path (a string), got %r" % (s.lane_keys_file,))
    if not isinstance(s.haproxy_sync_s, int | float) or s.haproxy_sync_s <= 0:
        raise ValueError("haproxy_sync_s: a positive number of seconds")
    _validate_retrieval(s)
    if s.models is not None:
        _keys("models", s.models, ROLES)
        for role, m in s.models.items():
            _keys("models.%s" % role, m, ("name", "dim") if role == "embed" else ("name",))
            if not isinstance(m.get("name"), str) or not m["name"]:
                raise ValueError("models.%s: name is required" % role)
    if s.lanes is None:
        if s.models:
            raise ValueError("models: needs [lanes] (the nodes that serve them)")
        return
    _keys("lanes", s.lanes, LANES)
    embed = s.model("embed")
    if embed is None:
        raise ValueError("lanes: [models].embed is required with [lanes]")
    if not isinstance(embed.get("dim"), int) or embed["dim"] < 1:
        raise ValueError("models.embed: dim (a positive integer) is required")
    if s.embedder.get("kind", "local") != "local":
        raise ValueError("embedder: with [lanes] the embedder is [models].embed on the lanes; remove [embedder]")
    for name in s.lanes:
        _validate_lane(s, name)


def _validate_retrieval(s: Settings) -> None:
    if not isinstance(s.keyword_scan, int) or isinstance(s.keyword_scan, bool) or s.keyword_scan < 1:
        raise ValueError("keyword_scan: a whole number >= 1, got %r" % (s.keyword_scan,))
    for key in ("turn_tokens", "extract_window_tokens", "extract_overlap_chunks", "coarse_oversample",
                "bit_cache_mb"):
        value = getattr(s, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError("%s: a whole number >= 0, got %r" % (key, value))
    if not isinstance(s.speaker_boost, int | float) or s.speaker_boost < 0:
        raise ValueError("speaker_boost: a number >= 0, got %r" % (s.speaker_boost,))
    for key in ("transient_retry_s", "transient_backoff_s", "transient_backoff_max_s"):
        if not isinstance(getattr(s, key), int | float) or getattr(s, key) < 0:
            raise ValueError("%s: a number of seconds >= 0, got %r" % (key, getattr(s, key)))
    if not isinstance(s.erase_checkpoint_tries, int) or s.erase_checkpoint_tries < 1:
        raise ValueError("erase_checkpoint_tries: a whole number >= 1, got %r" % (s.erase_checkpoint_tries,))
    if not isinstance(s.erase_checkpoint_wait_s, int | float) or s.erase_checkpoint_wait_s < 0:
        raise ValueError("erase_checkpoint_wait_s: a number >= 0, got %r" % (s.erase_checkpoint_wait_s,))


def _validate_lane(s: Settings, name: str) -> None:
    lane = s.lane(name)
    _keys("lanes.%s" % name, lane, ("concurrency", "timeout_s", "nodes"))
    if not isinstance(lane["concurrency"], int) or lane["concurrency"] < 1:
        raise ValueError("lanes.%s.concurrency: a positive integer" % name)
    if not isinstance(lane["timeout_s"], int | float) or lane["timeout_s"] <= 0:
        raise ValueError("lanes.%s.timeout_s: a positive number of seconds" % name)
    if not isinstance(lane["nodes"], dict):
        raise ValueError("lanes.%s.nodes: expected a table of node = {role = URL}" % name)
    for node, roles in lane["nodes"].items():
        where = "lanes.%s.nodes.%s" % (name, node)
        _keys(where, roles, ROLES)
        for role, url in roles.items():
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError("%s.%s: an http:// URL, got %r" % (where, role, url))
            if s.model(role) is None:
                raise ValueError("%s: serves %s, but [models] has no %s" % (where, role, role))


# Printable ASCII, no space: one header value and one line of --api-key-file, where "#" starts a comment.
KEY = re.compile(r"[\x21\x22\x24-\x7e][\x21-\x7e]*")


def read_lane_keys(path: str) -> dict[str, str]:
    """{node: key} from lane_keys_file. Its errors name the file and the node, never a key."""
    where = "lane_keys_file %s" % path
    try:
        with open(path, "rb") as f:
            data = json.load(f)
    except OSError as e:
        raise ValueError("%s: cannot read it: %s" % (where, e.strerror or type(e).__name__)) from None
    except UnicodeDecodeError:
        raise ValueError("%s: not UTF-8 text" % where) from None
    except json.JSONDecodeError as e:
        raise ValueError("%s: not JSON (%s at line %d column %d)" % (where, e.msg, e.lineno, e.colno)) from None
    if not isinstance(data, dict):
        raise ValueError('%s: expected a JSON object {"node": "key", ...}, got a %s' % (where, type(data).__name__))
    for node, key in data.items():
        if not node:
            raise ValueError("%s: a node with an empty name" % where)
        if not isinstance(key, str) or not KEY.fullmatch(key):
            raise ValueError("%s: node %r: its key must be a non-empty string of printable ASCII, no spaces,"
                             " not starting with #" % (where, node))
    return data


def load(path: str | None) -> Settings:
    if not path:
        return Settings()
    with open(path, "rb") as f:
        data = tomllib.load(f)
    known = {f.name for f in fields(Settings) if f.init}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError("%s: unknown settings %s" % (path, ", ".join(unknown)))
    try:
        return Settings(**data)
    except ValueError as e:
        raise ValueError("%s: %s" % (path, e)) from None
