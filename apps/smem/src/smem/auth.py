"""Bearer tokens, scoped to namespaces; only a sha256 of each token is stored."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass

from smem.db import DB, new_id, now
from smem.errors import Conflict, NotFound

NS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def digest(token: str) -> str:
    # Tokens are 256 random bits, so a plain hash is enough: nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


# lease: the leases routes only; metrics: GET /metrics only (a Prometheus scrape); neither reads namespace data
SCOPES = ("read", "write", "lease", "metrics")


@dataclass(frozen=True)
class Principal:
    token_id: str
    namespaces: frozenset[str]
    admin: bool
    scopes: frozenset[str] = frozenset(("read", "write"))

    def allows(self, ns: str) -> bool:
        return self.admin or ns in self.namespaces

    def can(self, scope: str) -> bool:
        return self.admin or scope in self.scopes


def _check(namespaces: list[str], admin: bool, scopes: list[str]) -> None:
    bad = [n for n in namespaces if not NS_RE.match(n)]
    if bad:
        raise ValueError("bad namespace name(s): %s (letters, digits, . _ -; at most 64)" % ", ".join(bad))
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValueError("unknown scope(s): %s (known: %s)" % (", ".join(unknown), ", ".join(SCOPES)))
    if admin:
        return
    if not scopes:
        raise ValueError("a token needs at least one scope")
    data = {"read", "write"} & set(scopes)
    if data and not namespaces:
        raise ValueError("a token with the %s scope needs at least one --ns (or --admin)" % "/".join(sorted(data)))
    if not data and namespaces:
        raise ValueError("a token with only the %s scope has no namespaces: drop --ns, or add --scope read or write"
                         % "/".join(sorted(scopes)))


def create_token(db: DB, namespaces: list[str], admin: bool = False, label: str | None = None,
                 scopes: list[str] | None = None) -> dict:
    """A new token: its public record and, once only, the secret ("token")."""
    scopes = sorted(set(SCOPES if admin else (scopes or ("read", "write"))))
    _check(namespaces, admin, scopes)
    token = "smem_" + secrets.token_urlsafe(32)
    token_id = new_id("tok")
    with db.tx() as c:
        c.execute("INSERT INTO tokens(id, hash, namespaces, admin, label, created_at, scopes) VALUES (?,?,?,?,?,?,?)",
                  (token_id, digest(token), json.dumps(sorted(set(namespaces))), int(admin), label, now(),
                   json.dumps(scopes)))
    return {**_one(db, token_id), "token": token}


def create(db: DB, namespaces: list[str], admin: bool = False, label: str | None = None,
           scopes: list[str] | None = None) -> str:
    """The secret of a new token."""
    return create_token(db, namespaces, admin, label, scopes)["token"]


def _public(row: dict) -> dict:
    return {"id": row["id"], "label": row["label"], "admin": bool(row["admin"]),
            "namespaces": json.loads(row["namespaces"]), "scopes": json.loads(row["scopes"]),
            "createdAt": row["created_at"], "revokedAt": row["revoked_at"]}


def _one(db: DB, token_id: str) -> dict:
    row = db.one("SELECT * FROM tokens WHERE id=?", (token_id,))
    if row is None:
        raise NotFound("no token %s" % token_id)
    return _public(row)


def list_tokens(db: DB) -> list[dict]:
    """Every token's record, never a secret (only their hashes are stored)."""
    return [_public(r) for r in db.rows("SELECT * FROM tokens ORDER BY created_at, id")]


def revoke(db: DB, token_id: str) -> dict:
    """Refused from the next request on (every request looks its token up)."""
    with db.tx() as c:
        row = _one(db, token_id)
        if row["revokedAt"] is None:
            c.execute("UPDATE tokens SET revoked_at=? WHERE id=?", (now(), token_id))
    return _one(db, token_id)


def token_id(db: DB, secret: str) -> str:
    """The id of the live token with this secret."""
    row = db.one("SELECT id FROM tokens WHERE hash=? AND revoked_at IS NULL", (digest(secret),))
    if row is None:
        raise NotFound("that secret is no live token's")
    return row["id"]


def rotate(db: DB, token_id: str) -> dict:
    """A new secret for a live token, same id, scopes and namespaces; the old secret is refused at once."""
    token = "smem_" + secrets.token_urlsafe(32)
    with db.tx() as c:
        row = _one(db, token_id)
        if row["revokedAt"] is not None:
            raise Conflict("token %s was revoked at %s: make a new one" % (token_id, row["revokedAt"]))
        c.execute("UPDATE tokens SET hash=? WHERE id=?", (digest(token), token_id))
    return {**_one(db, token_id), "token": token}


def resolve(db: DB, header: str | None) -> Principal | None:
    if not header or not header.startswith("Bearer "):
        return None
    row = db.one("SELECT id, namespaces, admin, scopes FROM tokens WHERE hash=? AND revoked_at IS NULL",
                 (digest(header[7:].strip()),))
    if row is None:
        return None
    return Principal(row["id"], frozenset(json.loads(row["namespaces"])), bool(row["admin"]),
                     frozenset(json.loads(row["scopes"])))
