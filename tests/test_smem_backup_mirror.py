"""roles/smem's backup unit as Ansible renders it: with smem_backup_mirror set, the rsync it runs after
each backup and prune (run here on two directories) leaves the mirror equal to the backups, a pruned
copy gone from the mirror too; the mirror writable under ProtectSystem=strict; unset, no mirror at all."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "roles" / "smem"


def unit(**overrides) -> str:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in defaults.items()}
    variables.update(ansible_managed="Ansible managed", smem_user="smem", smem_db="/var/lib/smem/smem.db",
                     smem_prefix="/opt/smem", **overrides)
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template((ROLE / "templates" / "smem-backup.service.j2").read_text()))


def directives(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(key + "=")]


def test_the_mirror_follows_the_backups_a_pruned_copy_included(tmp_path):
    backups, mirror = tmp_path / "backups", tmp_path / "mirror"
    backups.mkdir()
    text = unit(smem_backup_dir=str(backups), smem_backup_mirror=str(mirror))
    [rsync] = [c for c in directives(text, "ExecStartPost") if "rsync" in c]
    prune = [i for i, c in enumerate(directives(text, "ExecStartPost")) if "prune" in c]
    assert prune and prune[0] < directives(text, "ExecStartPost").index(rsync)   # after the prune
    assert str(mirror) in directives(text, "ReadWritePaths")[0].split()

    mirror.mkdir()
    (backups / "smem-20261201T033000Z.db").write_bytes(b"old, before the erase")
    (backups / "smem-20261202T033000Z.db").write_bytes(b"new")
    subprocess.run(shlex.split(rsync), check=True)
    assert sorted(p.name for p in mirror.iterdir()) == ["smem-20261201T033000Z.db", "smem-20261202T033000Z.db"]
    (backups / "smem-20261201T033000Z.db").unlink()               # pruned: it held erased text
    subprocess.run(shlex.split(rsync), check=True)
    assert [p.name for p in mirror.iterdir()] == ["smem-20261202T033000Z.db"]
    assert (mirror / "smem-20261202T033000Z.db").read_bytes() == b"new"


@pytest.mark.parametrize("mirror", ["backup@nas:/srv/smem", ""])
def test_a_remote_mirror_or_none(mirror):
    text = unit(smem_backup_mirror=mirror)
    rsyncs = [c for c in directives(text, "ExecStartPost") if "rsync" in c]
    assert rsyncs == ([f"/usr/bin/rsync -a --delete /var/backups/smem/ {mirror}/"] if mirror else [])
    assert directives(text, "ReadWritePaths") == ["/var/lib/smem /var/backups/smem"]
