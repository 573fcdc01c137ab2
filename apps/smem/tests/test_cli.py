"""The smem command: tokens, and where it will listen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from smem import auth
from smem.config import Settings
from smem.service import open_db

APP_SRC = Path(__file__).resolve().parent.parent / "src"
ENV = dict(os.environ, PYTHONPATH=str(APP_SRC))


def smem(*args):
    return subprocess.run([sys.executable, "-m", "smem", *args], check=False, env=ENV, capture_output=True,
                          text=True, timeout=120)


def test_token_create_prints_a_scoped_token_and_stores_only_its_hash(tmp_path):
    db_path = str(tmp_path / "s.db")
    r = smem("token", "create", "--db", db_path, "--ns", "alice", "--ns", "team.b")
    assert r.returncode == 0, r.stderr
    token = r.stdout.strip()
    db = open_db(db_path, Settings())
    p = auth.resolve(db, "Bearer " + token)
    assert p.namespaces == {"alice", "team.b"} and not p.admin
    assert db.scalar("SELECT count(*) FROM tokens WHERE hash=?", (auth.digest(token),)) == 1
    assert db.scalar("SELECT count(*) FROM tokens WHERE hash=? OR namespaces LIKE ?", (token, "%" + token + "%")) == 0
    admin = smem("token", "create", "--db", db_path, "--admin").stdout.strip()
    assert auth.resolve(db, "Bearer " + admin).admin


def test_token_create_refuses_bad_namespace_names(tmp_path):
    r = smem("token", "create", "--db", str(tmp_path / "s.db"), "--ns", "../etc")
    assert r.returncode == 2 and "bad namespace" in r.stderr


def test_serve_refuses_all_interfaces_unless_the_config_says_so(tmp_path):
    r = smem("serve", "--db", str(tmp_path / "s.db"), "--listen", "0.0.0.0:0")
    assert r.returncode == 2 and "allow_public_listen" in r.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text("allow_public_listen = true\nno_such_setting = 1\n")
    r = smem("serve", "--db", str(tmp_path / "s.db"), "--listen", "0.0.0.0:0", "--config", str(cfg))
    assert r.returncode != 0 and "unknown settings no_such_setting" in r.stderr
