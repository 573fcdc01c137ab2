"""The smem command: tokens, and where it will listen."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import uvicorn

from conftest import free_port
from smem import auth, cli
from smem.config import Settings
from smem.service import Busy, open_db

APP_SRC = Path(__file__).resolve().parent.parent / "src"
ENV = dict(os.environ, PYTHONPATH=str(APP_SRC))


def smem(*args, input_text: str | None = None):
    return subprocess.run([sys.executable, "-m", "smem", *args], check=False, env=ENV, capture_output=True,
                          text=True, timeout=120, input=input_text)


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
    # The acceptance line: `smem serve --listen 0:PORT` refuses and says why. The database is in a
    # directory that does not exist, so that a guard that failed cannot get as far as listening.
    r = smem("serve", "--db", str(tmp_path / "absent" / "s.db"), "--listen", "0:%d" % free_port())
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("smem: refusing to listen on every address") and r.stderr.count("\n") == 1
    assert "resolves to 0.0.0.0;" in r.stderr and "allow_public_listen = true" in r.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text("allow_public_listen = true\nno_such_setting = 1\n")
    r = smem("serve", "--db", str(tmp_path / "s.db"), "--listen", "0.0.0.0:0", "--config", str(cfg))
    assert r.returncode != 0 and "unknown settings no_such_setting" in r.stderr


# -- the listen guard, in-process: what getaddrinfo answers decides, not how the host is spelled --------------
REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture
def serve(tmp_path, monkeypatch, capsys):
    """smem serve in-process, up to its database lock: a guard that lets the address through reaches
    take_lock, which answers Busy here, so that nothing is ever bound (rc 1 and "passed the guard")."""
    def fake_lock(db):
        raise Busy("passed the guard")
    monkeypatch.setattr(cli, "take_lock", fake_lock)

    def run(listen: str, config: str = "") -> tuple[int, str]:
        args = ["serve", "--db", str(tmp_path / "s.db"), "--listen", listen]
        if config:
            (tmp_path / "c.toml").write_text(config)
            args += ["--config", str(tmp_path / "c.toml")]
        rc = cli.main(args)
        return rc, capsys.readouterr().err
    return run


def resolver(monkeypatch, names: dict):
    """getaddrinfo that answers for some names (a list of sockaddrs, or an exception) and asks the real one
    for the rest; the calls made (host, family) are recorded."""
    calls = []

    def fake(host, port, *rest, **kw):
        calls.append((host, rest[0] if rest else kw.get("family", 0)))
        if host in names:
            if isinstance(names[host], Exception):
                raise names[host]
            return [(socket.AF_INET6 if ":" in a[0] else socket.AF_INET, socket.SOCK_STREAM, 6, "", a)
                    for a in names[host]]
        return REAL_GETADDRINFO(host, port, *rest, **kw)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return calls


def refused_to(err: str) -> set[str]:
    m = re.fullmatch(r"smem: refusing to listen on every address: --listen \S+ resolves to (.+); to mean it, set"
                     r" allow_public_listen = true in the config \(the smem role: smem_allow_public_listen: true\)\n",
                     err)
    assert m, err
    return set(m.group(1).split(", "))


@pytest.mark.parametrize(("listen", "resolved"), [
    ("0:8787", {"0.0.0.0"}),
    ("0.0.0.0:8787", {"0.0.0.0"}),
    ("0.0:8787", {"0.0.0.0"}),           # inet_aton's short forms are the wildcard too
    ("0x0:8787", {"0.0.0.0"}),
    ("[::]:8787", {"::"}),
    ("::0:8787", {"::"}),
    ("[::0]:8787", {"::"}),
    ("[0:0:0:0:0:0:0:0]:8787", {"::"}),
    ("[::ffff:0.0.0.0]:8787", {"::ffff:0.0.0.0"}),
    (":8787", {"0.0.0.0", "::"}),        # an empty host is every address, in both families
    ("[]:8787", {"0.0.0.0", "::"}),
])
def test_every_spelling_of_every_address_is_refused(serve, listen, resolved):
    rc, err = serve(listen)
    assert rc == 2 and refused_to(err) == resolved


def test_a_name_that_resolves_to_every_address_is_refused_even_beside_loopback(serve, monkeypatch):
    calls = resolver(monkeypatch, {"sneaky.test": [("127.0.0.1", 8787), ("::", 8787, 0, 0)]})
    rc, err = serve("sneaky.test:8787")
    assert rc == 2 and refused_to(err) == {"127.0.0.1", "::"}
    assert calls == [("sneaky.test", socket.AF_UNSPEC)]    # every family was asked for


def test_a_name_that_does_not_resolve_is_a_clear_error(serve, monkeypatch):
    resolver(monkeypatch, {"nowhere.test": socket.gaierror(socket.EAI_NONAME, "Name or service not known")})
    rc, err = serve("nowhere.test:8787")
    assert rc == 2
    assert err == "smem: --listen nowhere.test:8787: 'nowhere.test' does not resolve" \
                  " ([Errno -2] Name or service not known)\n"


@pytest.mark.parametrize("listen", ["127.0.0.1:8787", "[::1]:8787", "localhost:8787"])
def test_loopback_passes_the_guard(serve, listen):
    assert serve(listen) == (1, "smem: passed the guard\n")


def test_the_opt_in_lets_every_address_through(serve, monkeypatch):
    assert serve("0:8787", "allow_public_listen = true\n") == (1, "smem: passed the guard\n")
    resolver(monkeypatch, {"sneaky.test": [("::", 8787, 0, 0)]})
    assert serve("sneaky.test:8787", "allow_public_listen = true\n") == (1, "smem: passed the guard\n")
    rc, err = serve("0:8787", "allow_public_listen = false\n")
    assert rc == 2 and refused_to(err) == {"0.0.0.0"}


def test_serve_binds_the_addresses_it_checked_not_a_second_answer(tmp_path, monkeypatch):
    # A resolver whose second answer differs (a DNS record that changes, a rebinding trick): uvicorn must get
    # sockets bound to what the guard saw, not the name to look up again.
    answers = [[("127.0.0.1", 0)], [("0.0.0.0", 0)]]
    names: dict = {}
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **kw: (
        [(socket.AF_INET, socket.SOCK_STREAM, 6, "", sa) for sa in answers.pop(0)] if host == "flip.test"
        else REAL_GETADDRINFO(host, *a, **kw)))
    monkeypatch.setattr(cli, "build", lambda db, settings: (object(), None))

    def fake_run(self, sockets=None):
        names["bound"] = [s.getsockname()[0] for s in sockets or []]
        names["host"] = self.config.host if sockets is None else None
        for s in sockets or []:
            s.close()
        self.started = True
    monkeypatch.setattr(uvicorn.Server, "run", fake_run)
    assert cli.main(["serve", "--db", str(tmp_path / "s.db"), "--listen", "flip.test:0"]) == 0
    assert names == {"bound": ["127.0.0.1"], "host": None}
