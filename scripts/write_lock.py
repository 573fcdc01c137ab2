"""Write an app's requirements.lock: its runtime dependencies (and the extras named), closed and pinned
to the versions in this venv. The roles install from wheels of exactly these, with no index.

A top-level requirement with an environment marker keeps it; one whose marker does not hold here
(the nodes' Python 3.10: tomli, an older numpy) must be pinned with == in setup.cfg and is written
as it stands. Run after changing an app's setup.cfg:
    .venv/bin/python scripts/write_lock.py apps/smem
    .venv/bin/python scripts/write_lock.py apps/farm --extra api
"""

from __future__ import annotations

import argparse
import configparser
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirements(lines: str) -> list[Requirement]:
    return [Requirement(line.split("#")[0].strip()) for line in lines.splitlines() if line.split("#")[0].strip()]


def top_level(app: Path, extras: list[str]) -> list[Requirement]:
    cfg = configparser.ConfigParser()
    cfg.read(app / "setup.cfg")
    reqs = requirements(cfg["options"]["install_requires"])
    for extra in extras:
        reqs += requirements(cfg["options.extras_require"][extra])
    return reqs


def foreign(req: Requirement) -> str:
    """The lock line of a top-level requirement for another environment than this one."""
    pins = [s for s in req.specifier if s.operator == "=="]
    if len(pins) != 1:
        sys.exit("write_lock: %s is for another environment (%s): pin it with == in setup.cfg" % (req.name, req.marker))
    return "%s==%s; %s" % (canonicalize_name(req.name), pins[0].version, req.marker)


def closure(reqs: list[Requirement]) -> list[str]:
    """The lock's lines: each requirement's dependencies followed, the extras it asks for included (pyjwt[crypto])."""
    pinned: dict[str, str] = {}
    markers: dict[str, str] = {}
    others = [foreign(r) for r in reqs if r.marker and not r.marker.evaluate({"extra": ""})]
    followed: set[tuple[str, str]] = set()
    todo = [(r, "") for r in reqs if not (r.marker and not r.marker.evaluate({"extra": ""}))]
    top = {canonicalize_name(r.name): r for r, _ in todo}
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
        if name in top and top[name].marker:
            markers[name] = str(top[name].marker)
        for want in {""} | set(req.extras):
            if (name, want) in followed:
                continue
            followed.add((name, want))
            todo += [(Requirement(sub), want) for sub in dist.requires or []]
    lines = ["%s==%s%s" % (n, v, "; " + markers[n] if n in markers else "") for n, v in pinned.items()]
    return lines + others


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("app", type=Path, help="the app's directory (it has setup.cfg)")
    ap.add_argument("--extra", action="append", default=[], help="an extra of setup.cfg to include")
    args = ap.parse_args()
    lines = closure(top_level(args.app, args.extra))
    out = args.app / "requirements.lock"
    what = args.app.resolve().name + "".join("[%s]" % e for e in args.extra)
    out.write_text("# %s's runtime dependencies, closed and pinned (scripts/write_lock.py writes this file).\n" % what
                   + "".join(line + "\n" for line in sorted(lines, key=lambda line: line.split("==")[0])))
    print("%s: %d packages" % (out, len(lines)))


if __name__ == "__main__":
    main()
