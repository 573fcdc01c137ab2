"""smem restore: the file owned as the service runs it (or refused as the wrong user, naming both), and
refused while any process has the database open: smem serve, smem mcp (build without workers), a tool."""

from __future__ import annotations

import os

from smem import archive, cli
from smem.config import Settings
from smem.service import build, let_go, open_db, take_lock

SERVICE_UID = 4242   # a user with no passwd entry: the service's, as far as the test goes


def backup_of(svc, tmp_path) -> str:
    svc.remember("alice", "Ann keeps bees")
    path = str(tmp_path / "copy.db")
    archive.backup(str(svc.path), to=path)
    return path


def test_root_restores_into_the_service_users_directory_as_that_user(svc, tmp_path):
    copy = backup_of(svc, tmp_path)
    home = tmp_path / "lib"
    home.mkdir()
    os.chown(home, SERVICE_UID, SERVICE_UID)
    target = str(home / "smem.db")
    assert cli.main(["restore", copy, "--db", target]) == 0
    for path in (target, target + ".lock", target + ".users"):
        assert (os.stat(path).st_uid, os.stat(path).st_gid) == (SERVICE_UID, SERVICE_UID), path
    assert oct(os.stat(target).st_mode & 0o777) == "0o600"


def test_another_user_is_refused_naming_the_owner(svc, tmp_path, monkeypatch, capsys):
    copy = backup_of(svc, tmp_path)
    target = tmp_path / "lib" / "smem.db"
    target.parent.mkdir()
    archive.restore(copy, str(target))
    os.chown(target, SERVICE_UID, SERVICE_UID)
    monkeypatch.setattr(os, "geteuid", lambda: 4343)
    assert cli.main(["restore", copy, "--db", str(target), "--force"]) == 1
    err = capsys.readouterr().err
    assert "belongs to uid 4242" in err and "not as uid 4343" in err
    assert not os.path.exists(str(target) + ".lock")   # refused before it made a file as the wrong user


def test_restore_refuses_while_smem_mcp_has_the_file_open(svc, tmp_path, capsys):
    copy = backup_of(svc, tmp_path)
    target = str(tmp_path / "live.db")
    build(target, Settings(), embedder=svc.embedder, start_workers=False)   # what `smem mcp` opens
    assert cli.main(["restore", copy, "--db", target, "--force"]) == 1
    assert "has %s open" % target in capsys.readouterr().err
    let_go(target)   # the mcp process gone
    assert cli.main(["restore", copy, "--db", target, "--force"]) == 0


def test_a_root_tool_leaves_the_lock_files_to_the_databases_owner(svc, tmp_path):
    """The role makes tokens as root: the DB.users (and DB.lock) it makes must stay the service's to open."""
    home = tmp_path / "lib"
    home.mkdir()
    target = str(home / "smem.db")
    archive.restore(backup_of(svc, tmp_path), target)
    os.chown(target, SERVICE_UID, SERVICE_UID)
    open_db(target, Settings(), check_embedder=False)
    os.close(take_lock(target))
    let_go(target)
    for path in (target + ".users", target + ".lock"):
        assert os.stat(path).st_uid == SERVICE_UID, path
