"""Write requirements.lock: smem's runtime dependencies, closed and pinned to the versions in this venv.

The smem role installs from wheels of exactly these, with no index. Run after changing setup.cfg:
    .venv/bin/python apps/smem/tools/write_lock.py
"""

from __future__ import annotations

import configparser
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

APP = Path(__file__).resolve().parent.parent


def top_level() -> list[Requirement]:
    cfg = configparser.ConfigParser()
    cfg.read(APP / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    return [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]


def closure(reqs: list[Requirement]) -> dict[str, str]:
    """Follow each requirement's dependencies, the extras it asks for included (pyjwt[crypto])."""
    pinned: dict[str, str] = {}
    followed: set[tuple[str, str]] = set()
    todo = [(r, "") for r in reqs]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit("write_lock: %s is not installed in this venv (pip install -r requirements.txt)" % req.name)
        if not req.specifier.contains(dist.version, prereleases=True):
            sys.exit("write_lock: %s %s does not satisfy %s" % (req.name, dist.version, req))
        pinned[name] = dist.version
        for want in {""} | set(req.extras):
            if (name, want) in followed:
                continue
            followed.add((name, want))
            todo += [(Requirement(sub), want) for sub in dist.requires or []]
    return pinned


def main() -> None:
    pins = closure(top_level())
    out = APP / "requirements.lock"
    out.write_text("# smem's runtime dependencies, closed and pinned (tools/write_lock.py writes this file).\n"
                   + "".join("%s==%s\n" % kv for kv in sorted(pins.items())))
    print("%s: %d packages" % (out, len(pins)))


if __name__ == "__main__":
    main()
