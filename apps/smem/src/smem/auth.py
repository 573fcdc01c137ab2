"""Bearer tokens, scoped to namespaces; only a sha256 of each token is stored."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
from dataclasses import dataclass

from smem.db import DB, new_id, now

NS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def digest(token: str) -> str:
    # Tokens are 256 random bits, so a plain hash is enough: nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Principal:
    token_id: str
    namespaces: frozenset[str]
    admin: bool

    def allows(self, ns: str) -> bool:
        return self.admin or ns in self.namespaces


def create(db: DB, namespaces: list[str], admin: bool = False, label: str | None = None) -> str:
    bad = [n for n in namespaces if not NS_RE.match(n)]
    if bad:
        raise ValueError("bad namespace name(s): %s (letters, digits, . _ -; at most 64)" % ", ".join(bad))
    if not namespaces and not admin:
        raise ValueError("a token needs at least one --ns, or --admin")
    token = "smem_" + secrets.token_urlsafe(32)
    with db.tx() as c:
        c.execute("INSERT INTO tokens(id, hash, namespaces, admin, label, created_at) VALUES (?,?,?,?,?,?)",
                  (new_id("tok"), digest(token), json.dumps(sorted(set(namespaces))), int(admin), label, now()))
    return token


def resolve(db: DB, header: str | None) -> Principal | None:
    if not header or not header.startswith("Bearer "):
        return None
    row = db.one("SELECT id, namespaces, admin FROM tokens WHERE hash=? AND revoked_at IS NULL",
                 (digest(header[7:].strip()),))
    if row is None:
        return None
    return Principal(row["id"], frozenset(json.loads(row["namespaces"])), bool(row["admin"]))
