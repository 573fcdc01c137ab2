#!/usr/bin/env python3
"""Every repository path, playbook and tag that the docs name must exist.

  scripts/check-doc-refs.py [FILE.md ...]     (default: README.md, docs/*.md and the READMEs of
                                               roles/, apps/, bench/, modules_c/, lab/sim/, image_builder/)

What is checked, in code spans and link targets:
- a path whose first part is one of the repository's top-level entries (roles/x/README.md,
  playbooks/image.yml, ...) must be a tracked file or directory (a `:line` or `#anchor` after it
  is dropped; a path with a placeholder, `<node>`, `*`, `{`, `$`, `...`, is not a path; a path
  that exists relative to the document's own directory is taken as that one; another repository's
  file is written with its name first, `owner/repo:path`, and is not checked);
- an `ansible-playbook ... X.yml` names a playbook that must exist;
- every tag given to `--tags` or `--skip-tags` must be a tag some play, role or task carries;
- no "issue N": the repository ships without its tracker, so a reader cannot look one up;
- no path under /work/: the machine the project was written on, which no reader has;
- no `ansible-playbook -i inventory/production`: the template is copied, and the copy
  (`inventory/mysite`) is what runs; only a playbook that documents the template itself
  (TEMPLATE_PLAYBOOKS) runs against it.
Paths the owner makes (NOT_IN_THE_REPOSITORY) are left alone. Exit 1 naming each miss (file:line).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
# Made by the owner or by a run, never tracked: inventory/mysite (docs/SETUP.md's name for the
# owner's copy), build outputs, the venv, credentials.
NOT_IN_THE_REPOSITORY = re.compile(r"^(inventory/(mysite|<site>)|build/|\.venv|.*/credentials(/|$))")
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.")
CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PLAYBOOK = re.compile(r"ansible-playbook\b[^`\n]*?\s((?:\S+/)?[\w.-]+\.ya?ml)\b")
TAGS = re.compile(r"--(?:skip-)?tags[ =]([\w,.-]+)")
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
WRITERS_MACHINE = re.compile(r"(?<![\w.~-])/work/\S*")
ON_THE_TEMPLATE = re.compile(r"ansible-playbook\b[^`\n]*?-i\s*inventory/production\b[^`\n]*")
TEMPLATE_PLAYBOOKS = ("playbooks/exposure.yml",)    # docs/EXPOSURE.md is the template's own table
DOCS = ("README.md", "docs/*.md", "roles/*/README.md", "apps/README.md", "apps/*/README.md", "bench/README.md",
        "modules_c/README.md", "lab/sim/README.md", "image_builder/README.md")


# Not part of the repository when the tree is walked (a copy without .git, as make test's fresh machine has)
UNTRACKED_DIRS = {".git", ".venv", "build", "__pycache__", ".pytest_cache", ".ruff_cache", "node_modules", ".cache"}


def tracked():
    try:
        files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):     # no git, or not a checkout: the files as they lie
        files = []
        for top, dirs, names in os.walk(ROOT):
            dirs[:] = [d for d in dirs if d not in UNTRACKED_DIRS and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(top, n), ROOT) for n in names]
    paths = set(files)
    for f in files:
        parts = f.split("/")
        paths.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return paths


def tags_in(node, found):
    if isinstance(node, dict):
        tags = node.get("tags")
        if isinstance(tags, str):
            found.add(tags)
        elif isinstance(tags, list):
            found.update(t for t in tags if isinstance(t, str))
        for value in node.values():
            tags_in(value, found)
    elif isinstance(node, list):
        for value in node:
            tags_in(value, found)
    return found


def known_tags():
    found = {"always", "never", "all", "tagged", "untagged"}
    for path in [ROOT / "site.yml", *ROOT.glob("playbooks/**/*.yml"), *ROOT.glob("roles/*/tasks/*.yml")]:
        try:
            tags_in(yaml.safe_load(path.read_text()), found)
        except yaml.YAMLError:
            continue
    return found


def candidates(line):
    for match in CODE.finditer(line):
        yield from match.group(1).split()
    for match in LINK.finditer(line):
        yield match.group(1)


def as_path(word, tops):
    word = word.strip("'\".,;:()")
    if "://" in word or word.startswith(("/", "~", "-")):
        return None
    word = word.split("#", 1)[0]
    word = re.sub(r":\d+(-\d+)?$", "", word)
    if word.startswith("./"):
        word = word[2:]
    if "/" not in word and word not in tops:
        return None
    if word.split("/", 1)[0] not in tops or PLACEHOLDER.search(word) or NOT_IN_THE_REPOSITORY.match(word):
        return None
    return word.rstrip("/")


def check(doc, paths, tops, tags):
    misses = []
    base = doc.parent.relative_to(ROOT)
    for n, line in enumerate(doc.read_text().splitlines(), 1):
        where = "%s:%d" % (doc.relative_to(ROOT), n)
        for word in candidates(line):
            path = as_path(word, tops)
            if path is None and LINK.search(line) and word in [m.group(1) for m in LINK.finditer(line)]:
                rel = os.path.normpath(base / word.split("#", 1)[0]) if not word.startswith(("http", "#")) else None
                path = as_path(rel, tops) if rel else None
            if path and path not in paths and os.path.normpath(base / path) not in paths:
                misses.append("%s: no %s in the repository" % (where, path))
        for match in PLAYBOOK.finditer(line):
            book = match.group(1)
            if not PLACEHOLDER.search(book) and book not in paths and book.split("/", 1)[0] in tops:
                misses.append("%s: no playbook %s" % (where, book))
        for match in TAGS.finditer(line):
            for tag in match.group(1).split(","):
                if tag and tag not in tags:
                    misses.append("%s: no tag %s in site.yml, playbooks/ or roles/" % (where, tag))
        misses += text_misses(where, line)
    return misses


def text_misses(where, line):
    """What a reader of the repository alone cannot follow: an issue number, the writer's paths, a run
    on the template."""
    misses = []
    if ISSUE.search(line):
        misses.append("%s: cites %r, and no issue tracker comes with the repository: say what it was "
                      "(a commit, a date)" % (where, ISSUE.search(line).group(0)))
    if WRITERS_MACHINE.search(line):
        misses.append("%s: names %s, a path on the machine this was written on" % (
            where, WRITERS_MACHINE.search(line).group(0).rstrip("`.,;:)")))
    for match in ON_THE_TEMPLATE.finditer(line):
        if not any(book in match.group(0) for book in TEMPLATE_PLAYBOOKS):
            misses.append("%s: runs against inventory/production, the template: your copy "
                          "(-i inventory/mysite) is meant" % where)
    return misses


def main(argv):
    docs = [Path(a).resolve() for a in argv] or [doc for pattern in DOCS for doc in sorted(ROOT.glob(pattern))]
    paths = tracked()
    tops = {p for p in paths if "/" not in p}
    tags = known_tags()
    misses = list(dict.fromkeys(m for doc in docs for m in check(doc, paths, tops, tags)))
    for miss in misses:
        print(miss)
    print("%d documents: %s" % (len(docs), "%d stale references" % len(misses) if misses else "every reference exists"))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
