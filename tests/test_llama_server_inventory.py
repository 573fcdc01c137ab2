"""roles/llama_server/files/llama-server-inventory.py: what tasks/prune.yml may remove is read from
the node as ansible's find read it (regular files, no hidden ones; builds any owner's unit runs)."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "roles/llama_server/files/llama-server-inventory.py"


def test_one_look_answers_the_three_questions(tmp_path):
    units, models, prefix = tmp_path / "units", tmp_path / "models", tmp_path / "prefix"
    for d in (units, models, prefix / "abc123", prefix / "def456", prefix / "0dd", prefix / "fed", prefix / ".partial"):
        d.mkdir(parents=True)
    for name in ("a.gguf", "b.gguf", ".b.gguf.part"):
        (models / name).write_text("x")
    (models / "link.gguf").symlink_to(models / "a.gguf")
    (units / "llama-server-smem-embed.service").write_text(f"ExecStart={prefix}/abc123/llama-server -m a\n")
    (units / "llama-server-llm-chat.service").write_text(f"ExecStart={prefix}/def456/llama-server -m b\n")
    (units / "llama-server-smem-old.service").write_text("ExecStart=/usr/bin/true\n")
    (units / "sshd.service").write_text(f"ExecStart={prefix}/0dd/llama-server\n")   # not a llama-server unit
    (tmp_path / "elsewhere.service").write_text(f"ExecStart={prefix}/fed/llama-server\n")
    (units / "llama-server-farm-linked.service").symlink_to(tmp_path / "elsewhere.service")   # not smem's, but runs fed
    (units / "llama-server-smem-gone.service").symlink_to(tmp_path / "nothing")
    out = subprocess.run([sys.executable, SCRIPT, "smem", models, prefix, units], capture_output=True, text=True,
                         check=True).stdout
    held = json.loads(out)
    assert held["units"] == ["llama-server-smem-embed.service", "llama-server-smem-old.service"]
    assert held["models"] == [str(models / "a.gguf"), str(models / "b.gguf")]
    assert held["builds"] == [str(prefix / n) for n in ("0dd", "abc123", "def456", "fed")]
    assert held["builds_used"] == [str(prefix / "abc123"), str(prefix / "def456"), str(prefix / "fed")]


def test_a_node_with_nothing_yet(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, "smem", tmp_path / "no-models", tmp_path / "no-prefix", tmp_path],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == {"units": [], "models": [], "builds": [], "builds_used": []}
