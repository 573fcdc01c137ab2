#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""What a node holds of llama-server, as JSON: one owner's unit files and model files, the build
directories, and the builds any owner's unit runs (tasks/prune.yml removes what no one uses).

usage: llama-server-inventory.py OWNER MODELS_DIR PREFIX [UNIT_DIR]"""

import json
import os
import re
import sys


def listing(path, want_dirs):
    """The regular files (or directories) in path, hidden ones left out, as ansible's find lists them."""
    try:
        entries = sorted(os.scandir(path), key=lambda e: e.name)
    except FileNotFoundError:
        return []
    kind = (lambda e: e.is_dir(follow_symlinks=False)) if want_dirs else (lambda e: e.is_file(follow_symlinks=False))
    return [e.path for e in entries if kind(e) and not e.name.startswith(".")]


def main(owner, models, prefix, unit_dir="/etc/systemd/system"):
    units = [os.path.basename(p) for p in listing(unit_dir, False)]
    used = set()
    try:
        every_unit = sorted(n for n in os.listdir(unit_dir) if re.fullmatch(r"llama-server-.+\.service", n))
    except FileNotFoundError:
        every_unit = []
    for name in every_unit:   # links followed, as systemd follows them
        try:
            with open(os.path.join(unit_dir, name), encoding="utf-8", errors="replace") as fh:
                used.update(re.findall(re.escape(prefix) + r"/[0-9a-f]*(?=/llama-server)", fh.read()))
        except OSError:   # a dangling link runs nothing
            continue
    json.dump({
        "units": [u for u in units if u.startswith("llama-server-%s-" % owner) and u.endswith(".service")],
        "models": listing(models, False),
        "builds": listing(prefix, True),
        "builds_used": sorted(used),
    }, sys.stdout)


if __name__ == "__main__":
    main(*sys.argv[1:])
