"""Tokens an owner can manage (issue 27, point 4): list without secrets, revoke and rotate at once,
read / write / lease scopes, over HTTP and the CLI, and the CLI needing no embedder."""

from __future__ import annotations

import os
import stat

import pytest
from test_cli import smem

from smem import auth
from smem.config import Settings
from smem.service import open_db


def bearer(token: str) -> dict:
    return {"Authorization": "Bearer " + token}


def test_admin_routes_list_create_revoke_and_rotate_and_never_show_a_secret(svc):
    r = svc.call("POST", "/v5/admin/tokens", "admin", json={"namespaces": ["alice"], "label": "agent-1"})
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["scopes"] == ["read", "write"] and made["token"].startswith("smem_")
    assert svc.client.get("/v5/ns/alice/memories", headers=bearer(made["token"])).status_code == 200
    listed = svc.call("GET", "/v5/admin/tokens", "admin").json()["tokens"]
    assert made["id"] in [t["id"] for t in listed]
    assert all(set(t) == {"id", "label", "admin", "namespaces", "scopes", "createdAt", "revokedAt"} for t in listed)
    assert made["token"] not in str(listed)

    r = svc.call("POST", "/v5/admin/tokens/%s/rotate" % made["id"], "admin")
    assert r.status_code == 200 and r.json()["id"] == made["id"], r.text
    new = r.json()["token"]
    assert svc.client.get("/v5/ns/alice/memories", headers=bearer(made["token"])).status_code == 401
    assert svc.client.get("/v5/ns/alice/memories", headers=bearer(new)).status_code == 200

    r = svc.call("DELETE", "/v5/admin/tokens/" + made["id"], "admin")
    assert r.status_code == 200 and r.json()["revokedAt"], r.text
    assert svc.client.get("/v5/ns/alice/memories", headers=bearer(new)).status_code == 401   # at once
    r = svc.call("POST", "/v5/admin/tokens/%s/rotate" % made["id"], "admin")
    assert r.status_code == 409 and "revoked" in r.json()["error"]
    assert svc.call("DELETE", "/v5/admin/tokens/tok_nope", "admin").status_code == 404


@pytest.mark.parametrize("who", ["alice", "both"])
def test_only_an_admin_manages_tokens(svc, who):
    for method, path in (("GET", "/v5/admin/tokens"), ("POST", "/v5/admin/tokens"),
                         ("DELETE", "/v5/admin/tokens/x"), ("POST", "/v5/admin/tokens/x/rotate")):
        r = svc.call(method, path, who, json={"namespaces": ["alice"]} if method == "POST" else None)
        assert r.status_code == 403, (method, path, r.text)


def test_bad_token_requests_are_400(svc):
    for body, message in (({"scopes": ["admin"]}, "is not one of"), ({"namespaces": ["../x"]}, "bad namespace"),
                          ({"scopes": ["read"]}, "needs at least one"), ({"colour": 1}, "unexpected")):
        r = svc.call("POST", "/v5/admin/tokens", "admin", json=body)
        assert r.status_code == 400 and message in r.json()["error"], (body, r.text)


def test_read_write_and_lease_scopes(svc):
    reader = auth.create(svc.db, ["alice"], scopes=["read"])
    writer = auth.create(svc.db, ["alice"], scopes=["write"])
    lease = auth.create(svc.db, [], scopes=["lease"])
    svc.ingest("alice", "Scoped tokens see only what they may.")
    get = lambda t, path: svc.client.get(path, headers=bearer(t)).status_code  # noqa: E731
    post = lambda t, path, body: svc.client.post(path, headers=bearer(t), json=body).status_code  # noqa: E731
    assert post(reader, "/v5/ns/alice/search", {"q": "scoped"}) == 200
    assert post(reader, "/v5/ns/alice/memories", {"content": "x"}) == 403
    assert post(writer, "/v5/ns/alice/memories", {"content": "Writers write."}) in (200, 201)
    assert post(writer, "/v5/ns/alice/search", {"q": "scoped"}) == 403
    assert get(writer, "/v5/ns/alice/memories") == 403
    for t in (reader, writer):
        assert get(t, "/v5/admin/leases") == 403
    assert get(lease, "/v5/admin/leases") == 200
    for path in ("/v5/ns/alice/memories", "/v5/ns/alice/documents", "/v5/admin/tokens", "/v5/admin/lanes"):
        assert get(lease, path) == 403, path
    assert svc.client.get("/v5/namespaces", headers=bearer(lease)).json() == {"namespaces": []}
    assert post(lease, "/v5/ns/alice/search", {"q": "scoped"}) == 403


def test_cli_lists_revokes_and_rotates_without_an_embedder(tmp_path):
    db = str(tmp_path / "s.db")
    # The config names an embedder that is nowhere: token commands never load or check it.
    cfg = tmp_path / "smem.toml"
    cfg.write_text('[embedder]\nkind = "http"\nurl = "http://127.0.0.1:9"\nmodel = "nowhere"\ndim = 8\n')
    assert smem("token", "create", "--db", db, "--ns", "alice").returncode == 0   # the database: MiniLM's
    r = smem("token", "create", "--db", db, "--scope", "lease", "--label", "farm", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    secret = r.stdout.strip()
    listed = smem("token", "list", "--db", db, "--config", str(cfg))
    assert listed.returncode == 0 and "farm" in listed.stdout and "lease" in listed.stdout
    assert "smem_" not in listed.stdout                       # never a secret
    handle = open_db(db, Settings(), check_embedder=False)
    tid = auth.token_id(handle, secret)
    assert tid in listed.stdout

    f = tmp_path / "lease.token"
    f.write_text(secret + "\n")
    os.chmod(f, 0o640)
    r = smem("token", "rotate", "--file", str(f), "--db", db)
    assert r.returncode == 0, r.stderr
    rotated = f.read_text().strip()
    assert rotated != secret and stat.S_IMODE(os.stat(f).st_mode) == 0o640
    assert auth.resolve(handle, "Bearer " + secret) is None
    assert auth.resolve(handle, "Bearer " + rotated).token_id == tid

    r = smem("token", "rotate", "--file", "-", "--db", db, input_text=rotated)
    assert r.returncode == 0 and r.stdout.strip().startswith("smem_"), r.stderr
    assert auth.resolve(handle, "Bearer " + r.stdout.strip()).token_id == tid

    r = smem("token", "revoke", tid, "--db", db)
    assert r.returncode == 0 and "revoked " + tid in r.stderr
    assert "revoked 20" in smem("token", "list", "--db", db).stdout
    r = smem("token", "rotate", tid, "--db", db)
    assert r.returncode == 2 and "was revoked" in r.stderr
    for args in (("revoke", "tok_nope"), ("rotate", "tok_nope"), ("rotate",), ("rotate", tid, "--file", str(f))):
        r = smem("token", *args, "--db", db)
        assert r.returncode == 2 and r.stderr.startswith("smem: "), (args, r.stderr)
