"""The one service layer: every operation with its checks (token scope, namespace, input), called alike
by the HTTP API (smem.api) and the MCP tools (smem.mcp_server). Each takes the caller's Principal and
plain values, and returns what the caller answers, or raises ServiceError (or NotFound, Conflict)."""

from __future__ import annotations

import base64
import json
import logging
import time

from jsonschema import Draft202012Validator

from smem import auth, facts, memories
from smem.db import DB, parse_time
from smem.errors import NotFound
from smem.metrics import Metrics
from smem.search import MODES, search

log = logging.getLogger("smem.ops")

MAX_PAGE = 1000
MAX_DEPTH = 32   # JSON nesting of a request body


class ServiceError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def object_schema(props: dict, required=()) -> Draft202012Validator:
    """A validator of a JSON object with exactly these properties (unknown ones refused)."""
    return Draft202012Validator({"type": "object", "additionalProperties": False, "properties": props,
                                 "required": list(required)})


_TIME = {"type": "string", "minLength": 1}
DOCUMENT = object_schema({"content": {"type": "string"}, "metadata": {"type": "object"},
                    "customId": {"type": "string", "minLength": 1, "maxLength": 255}, "validAt": _TIME}, ["content"])
SEARCH_FIELDS = {"q": {"type": "string", "minLength": 1}, "mode": {"enum": list(MODES)},
           "limit": {"type": "integer", "minimum": 1}, "asOf": _TIME, "rerank": {"enum": ["none", "order"]},
           "threshold": {"type": "number", "minimum": 0, "maximum": 1},
           "budgetTokens": {"type": "integer", "minimum": 1}}
SEARCH = object_schema(SEARCH_FIELDS, ["q"])
MEMORY = object_schema({"content": {"type": "string", "minLength": 1}, "validAt": _TIME,
                  "supersedes": {"type": "string", "minLength": 1}, "metadata": {"type": "object"}}, ["content"])
FORGET = object_schema({"id": {"type": "string", "minLength": 1}, "content": {"type": "string", "minLength": 1},
                  "dryRun": {"type": "boolean"}, "erase": {"type": "boolean"}})
LEASE = object_schema({"nodes": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                 "holder": {"type": "string", "minLength": 1, "maxLength": 200},
                 "ttlSeconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 30 * 86400}},
                ["nodes", "holder", "ttlSeconds"])
RENEW = object_schema({"ttlSeconds": LEASE.schema["properties"]["ttlSeconds"]}, ["ttlSeconds"])
TOKEN = object_schema({"namespaces": {"type": "array", "items": {"type": "string"}},
                 "scopes": {"type": "array", "minItems": 1, "items": {"enum": list(auth.SCOPES)}},
                 "admin": {"type": "boolean"}, "label": {"type": "string", "maxLength": 200}})

FORBIDDEN = "forbidden: this token has no access to that namespace"
ADMIN_ONLY = "forbidden: this needs an admin token"


def check_body(body, validator: Draft202012Validator):
    if depth(body) > MAX_DEPTH:
        raise ServiceError(400, "JSON nested deeper than %d levels" % MAX_DEPTH)
    errors = sorted(validator.iter_errors(body), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path)
        raise ServiceError(400, "%s%s" % (where + ": " if where else "", e.message))
    return body


def depth(value) -> int:
    """How deep lists and objects nest in a parsed JSON value, without recursion."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d > MAX_DEPTH:
                return d
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def parse_json(raw: bytes):
    try:
        return json.loads(raw)
    except RecursionError:
        raise ServiceError(400, "JSON nested deeper than %d levels" % MAX_DEPTH) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ServiceError(400, "malformed JSON: %s" % e) from None


def time_field(value, field: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError:
        raise ServiceError(400, "%s: not an ISO-8601 date or time: %r" % (field, value)) from None


def integer(value, field: str, default: int, lo: int, hi: int) -> int:
    """A query parameter or tool argument: an integer in lo..hi, else a 400 that says so."""
    if value is None or value == "":
        return default
    try:
        n = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        n = None
    if n is None or not lo <= n <= hi:
        raise ServiceError(400, "%s: an integer from %d to %d, got %r" % (field, lo, hi, value))
    return n


def encode_cursor(key: list) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> list | None:
    if not cursor:
        return None
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(key, list) and len(key) == 2 and isinstance(key[0], str) and isinstance(key[1], int):
            return key
    except (ValueError, UnicodeDecodeError):
        pass
    raise ServiceError(400, "cursor: not one this server gave (pass nextCursor back as it is)")


def distinct_ns(db: DB, table: str) -> list[str]:
    """The namespaces with a row in table, one index seek each (not a pass over every row)."""
    return [r[0] for r in db.conn.execute(
        "WITH RECURSIVE n(ns) AS (SELECT min(ns) FROM %s UNION ALL SELECT (SELECT min(ns) FROM %s WHERE ns > n.ns)"
        " FROM n WHERE n.ns IS NOT NULL) SELECT ns FROM n WHERE ns IS NOT NULL" % (table, table))]


class Ops:
    def __init__(self, db: DB, settings, pipeline, embedder, *, reranker=None, leases=None, lanes=None,
                 supervisor=None, metrics: Metrics | None = None):
        self.db, self.settings, self.pipeline, self.embedder = db, settings, pipeline, embedder
        self.reranker, self.leases, self.lanes, self.supervisor = reranker, leases, lanes, supervisor
        self.metrics = metrics or Metrics()
        self.metrics.bind(self)

    # -- who may do what -------------------------------------------------------------------
    @staticmethod
    def ns(p: auth.Principal, ns: str | None, scope: str) -> str:
        """The namespace the call is about: given, or the token's only one. One answer for a namespace
        the token lacks, whether or not it exists."""
        if not p.can(scope):
            raise ServiceError(403, "forbidden: this token's scopes (%s) do not include %s"
                               % (", ".join(sorted(p.scopes)), scope))
        if ns is None:
            if len(p.namespaces) != 1 or p.admin:
                raise ServiceError(400, "ns: required (this token has %s)" % (
                    "every namespace" if p.admin else "%d namespaces" % len(p.namespaces)))
            ns = next(iter(p.namespaces))
        if not p.allows(ns):
            raise ServiceError(403, FORBIDDEN)
        if not auth.NS_RE.match(ns):
            raise ServiceError(400, "bad namespace name")
        return ns

    @staticmethod
    def admin(p: auth.Principal) -> None:
        if not p.admin:
            raise ServiceError(403, ADMIN_ONLY)

    @staticmethod
    def scope(p: auth.Principal, scope: str) -> None:
        if not p.can(scope):
            raise ServiceError(403, "forbidden: this needs a token with the %s scope" % scope)

    def _size(self, content: str) -> None:
        if len(content.encode()) > self.settings.max_document_bytes:
            raise ServiceError(413, "content over max_document_bytes (%d)" % self.settings.max_document_bytes)

    # -- documents -------------------------------------------------------------------------
    def add_document(self, p, ns: str | None, body: dict) -> dict:
        ns = self.ns(p, ns, "write")
        check_body(body, DOCUMENT)
        content = body["content"]
        if not content.strip():
            raise ServiceError(400, "content is empty")
        self._size(content)
        valid_at = time_field(body.get("validAt"), "validAt")
        doc_id, status = self.pipeline.enqueue(ns, content, body.get("metadata") or {}, body.get("customId"),
                                               valid_at)
        return {"id": doc_id, "status": status}

    def document_view(self, d: dict) -> dict:
        job = self.db.one("SELECT stage, state, attempts, stages FROM jobs WHERE document_id=?", (d["id"],))
        out = {"id": d["id"], "status": d["status"], "error": d["error"], "customId": d["custom_id"],
               "metadata": json.loads(d["metadata"]), "validAt": d["valid_at"], "createdAt": d["created_at"],
               "updatedAt": d["updated_at"],
               "chunks": self.db.scalar("SELECT count(*) FROM chunks WHERE document_id=?", (d["id"],))}
        if job:
            out["job"] = {"stage": job["stage"], "state": job["state"], "attempts": job["attempts"],
                          "stages": json.loads(job["stages"])}
        return out

    def get_document(self, p, ns: str | None, doc_id: str) -> dict:
        ns = self.ns(p, ns, "read")
        d = self.db.one("SELECT * FROM documents WHERE id=? AND ns=?", (doc_id, ns))
        if d is None:
            raise NotFound("no document %s in this namespace" % doc_id)
        return self.document_view(d)

    def list_documents(self, p, ns: str | None, status: str | None = None, limit=None, offset=None) -> dict:
        ns = self.ns(p, ns, "read")
        limit = integer(limit, "limit", 100, 1, MAX_PAGE)
        offset = integer(offset, "offset", 0, 0, 2**62)
        where, params = "ns=?", [ns]
        if status:
            where += " AND status=?"
            params.append(status)
        rows = self.db.rows("SELECT * FROM documents WHERE %s ORDER BY created_at, id LIMIT ? OFFSET ?" % where,
                            (*params, limit, offset))
        return {"documents": [self.document_view(d) for d in rows],
                "total": self.db.scalar("SELECT count(*) FROM documents WHERE %s" % where, params)}

    def delete_document(self, p, ns: str | None, doc_id: str, erase: bool = False) -> dict:
        """The document, its chunks and job gone (overwritten in the file); its facts retired, and with
        erase their content erased too."""
        ns = self.ns(p, ns, "write")
        with self.db.tx() as c:
            if not self.db.one("SELECT 1 FROM documents WHERE id=? AND ns=?", (doc_id, ns)):
                raise NotFound("no document %s in this namespace" % doc_id)
            facts.drop_chunk_index(c, doc_id)
            retired = facts.retire_document_facts(self.db, c, ns, doc_id, erase=erase)
            c.execute("DELETE FROM documents WHERE id=?", (doc_id,))  # chunks and jobs cascade
            self.db.mark_erase(c)
        out = {"id": doc_id, "deleted": True, "factsRetired": retired, "erased": erase}
        return {**out, **self._after_erase(erase)}

    def _after_erase(self, erased: bool) -> dict:
        """The deleted pages are overwritten in the WAL; copied into the file and the WAL truncated, no copy
        is left anywhere. A reader of an older snapshot keeps the WAL: the checkpoint is tried again, a
        bounded number of times; if it still cannot finish, the answer says the erase is pending and why
        (the next checkpoint, `smem vacuum` or a clean stop finishes it)."""
        s = self.settings
        for attempt in range(max(1, s.erase_checkpoint_tries)):
            busy, wal, copied = self.db.checkpoint(wait_s=s.erase_checkpoint_wait_s)
            if not busy:
                return {}
            log.info("checkpoint after a delete, try %d: busy (%s of %s WAL frames copied)", attempt + 1, copied, wal)
        reason = ("the WAL still holds the deleted pages: a reader of an older snapshot kept the checkpoint from"
                  " finishing (%d tries, %.1f s each); the next checkpoint, smem vacuum or a clean stop removes them"
                  % (s.erase_checkpoint_tries, s.erase_checkpoint_wait_s))
        log.warning("erase pending: %s", reason)
        return {"erased": "pending", "erasePending": reason} if erased else {"walPending": reason}

    # -- search and facts ------------------------------------------------------------------
    def search(self, p, ns: str | None, body: dict) -> dict:
        ns = self.ns(p, ns, "read")
        b = check_body(body, SEARCH)
        limit = b.get("limit")
        if limit is not None and limit > self.settings.max_limit:
            raise ServiceError(400, "limit: at most %d" % self.settings.max_limit)
        mode, t = b.get("mode", "hybrid"), time.perf_counter()
        out = search(self.db, self.embedder, self.settings, ns, b["q"], mode=mode, limit=limit,
                     as_of=time_field(b.get("asOf"), "asOf"), rerank=b.get("rerank", "none"),
                     threshold=b.get("threshold"), budget_tokens=b.get("budgetTokens"), reranker=self.reranker)
        self.metrics.searched(mode, time.perf_counter() - t, out["degraded"])
        return out

    def add_memory(self, p, ns: str | None, body: dict) -> dict:
        ns = self.ns(p, ns, "write")
        b = check_body(body, MEMORY)
        self._size(b["content"])
        return memories.add(self.db, self.embedder, self.settings.near_duplicate, ns, b["content"],
                            valid_at=time_field(b.get("validAt"), "validAt"), supersedes=b.get("supersedes"),
                            metadata=b.get("metadata"))

    def list_memories(self, p, ns: str | None, *, as_of=None, limit=None, cursor=None, history=False) -> dict:
        ns = self.ns(p, ns, "read")
        t = time_field(as_of, "asOf")
        n = integer(limit, "limit", 100, 1, MAX_PAGE)
        rows, last = memories.page_at(self.db, ns, t, n, decode_cursor(cursor))
        if history:
            for m in rows:
                m["history"] = memories.history(self.db, ns, m["id"])
        return {"memories": rows, "asOf": t, "nextCursor": encode_cursor(last) if last else None}

    def forget(self, p, ns: str | None, body: dict) -> dict:
        ns = self.ns(p, ns, "write")
        b = check_body(body, FORGET)
        if ("id" in b) == ("content" in b):
            raise ServiceError(400, "give exactly one of id and content")
        out = memories.forget(self.db, ns, b.get("id"), b.get("content"), b.get("dryRun", False),
                              erase=b.get("erase", False))
        if out["erased"] and not out["dryRun"]:
            out.update(self._after_erase(True))
        return out

    def profile(self, p, ns: str | None) -> dict:
        return memories.profile(self.db, self.ns(p, ns, "read"))

    def namespaces(self, p) -> list[dict]:
        seen = set(distinct_ns(self.db, "documents")) | set(distinct_ns(self.db, "memories")) if p.admin else set()
        names = sorted(seen | p.namespaces)
        return [{"name": n, "documents": self.db.scalar("SELECT count(*) FROM documents WHERE ns=?", (n,)),
                 "memories": self.db.scalar("SELECT count(*) FROM memories m INDEXED BY memories_state"
                                            " WHERE m.ns=? AND " + facts.CURRENT, (n,))} for n in names]

    # -- tokens (admin) --------------------------------------------------------------------
    def list_tokens(self, p) -> dict:
        self.admin(p)
        return {"tokens": auth.list_tokens(self.db)}

    def create_token(self, p, body: dict) -> dict:
        self.admin(p)
        b = check_body(body, TOKEN)
        try:
            return auth.create_token(self.db, b.get("namespaces", []), admin=b.get("admin", False),
                                     label=b.get("label"), scopes=b.get("scopes"))
        except ValueError as e:
            raise ServiceError(400, str(e)) from None

    def revoke_token(self, p, token_id: str) -> dict:
        self.admin(p)
        return auth.revoke(self.db, token_id)

    def rotate_token(self, p, token_id: str) -> dict:
        self.admin(p)
        return auth.rotate(self.db, token_id)

    # -- leases (the lease scope) and lanes (admin) ----------------------------------------
    def create_lease(self, p, body: dict) -> dict:
        self.scope(p, "lease")
        b = check_body(body, LEASE)
        return self.leases.create(b["nodes"], b["holder"], b["ttlSeconds"])

    def list_leases(self, p) -> dict:
        self.scope(p, "lease")
        return {"leases": self.leases.live()}

    def renew_lease(self, p, lease_id: str, body: dict) -> dict:
        self.scope(p, "lease")
        return self.leases.renew(lease_id, check_body(body, RENEW)["ttlSeconds"])

    def release_lease(self, p, lease_id: str) -> dict:
        self.scope(p, "lease")
        return self.leases.release(lease_id)

    def lanes_report(self, p) -> dict:
        self.admin(p)
        return {"lanes": self.lanes.report()}

    def metrics_text(self, p) -> bytes:
        self.scope(p, "metrics")
        return self.metrics.render()

    # -- health ----------------------------------------------------------------------------
    def health(self) -> dict:
        if self.supervisor is None:
            return {"ok": True, "workers": [], "queue": None, "problems": []}
        return self.supervisor.health(self.settings.stuck_after_s)
