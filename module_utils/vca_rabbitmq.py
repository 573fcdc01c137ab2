# SPDX-License-Identifier: MIT
"""RabbitMQ users and their rights on one vhost, read and written as definitions.

One `rabbitmqctl export_definitions` gives every user with its password hash, tags and
permissions; a password is checked against its hash here (RabbitMQ's default scheme,
rabbit_password_hashing_sha256: base64(salt[4] + sha256(salt + password))), so a run that
changes nothing starts the broker's CLI once instead of several times per user. What differs is
written back with one `import_definitions` of the users concerned, hashes included, so no
password is ever on a command line."""

from __future__ import annotations

import base64
import hashlib
import os

SHA256 = "rabbit_password_hashing_sha256"
RIGHTS = ("configure", "write", "read")


def password_hash(password, salt=None):
    """RabbitMQ's sha256 hash of password, with a new random salt unless one is given."""
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def password_matches(user, password):
    """Whether an exported user's hash is password's (False for a scheme this cannot check)."""
    if user.get("hashing_algorithm") != SHA256:
        return False
    try:
        raw = base64.b64decode(user.get("password_hash", ""), validate=True)
    except ValueError:
        return False
    return len(raw) == 36 and password_hash(password, raw[:4]) == user["password_hash"]


def plan(definitions, vhost, users, *, managed_prefix="", absent=(), keep=()):
    """What to change so that the broker holds exactly `users` on `vhost`.

    users: [{name, password, configure, write, read, tags}]; a user of the broker whose name starts
    with managed_prefix (and is neither wanted nor in keep) and every name in absent are removed. Returns
    {vhost: bool (to create), put: [names], clear: [(vhost, name)], delete: [names]}."""
    have = {u["name"]: u for u in definitions.get("users", [])}
    rights = {}
    for perm in definitions.get("permissions", []):
        rights.setdefault(perm["user"], {})[perm["vhost"]] = {k: perm[k] for k in RIGHTS}
    wanted = {u["name"] for u in users} | set(keep)
    put, clear = [], []
    for user in users:
        found = have.get(user["name"])
        want_rights = {k: user[k] for k in RIGHTS}
        held = rights.get(user["name"], {})
        if (found is None or not password_matches(found, user["password"])
                or sorted(found.get("tags") or []) != sorted(user.get("tags") or [])
                or held.get(vhost) != want_rights):
            put.append(user["name"])
        clear.extend((other, user["name"]) for other in sorted(held) if other != vhost)
    delete = sorted(name for name in have
                    if name not in wanted and ((managed_prefix and name.startswith(managed_prefix)) or name in absent))
    return {"vhost": vhost not in {v["name"] for v in definitions.get("vhosts", [])},
            "put": put, "clear": clear, "delete": delete}


def import_document(vhost, users, names):
    """The definitions that put the named users (new hashes) and their rights on vhost."""
    chosen = [u for u in users if u["name"] in names]
    return {
        "vhosts": [{"name": vhost}],
        "users": [{"name": u["name"], "password_hash": password_hash(u["password"]), "hashing_algorithm": SHA256,
                   "tags": list(u.get("tags") or [])} for u in chosen],
        "permissions": [{"user": u["name"], "vhost": vhost, **{k: u[k] for k in RIGHTS}} for u in chosen],
    }
