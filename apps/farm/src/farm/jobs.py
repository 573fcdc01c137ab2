"""Taking a job in: the checks that the CLI and the API share, and the job's chunks. Everything here
fails before anything is recorded (ValueError, with what to fix)."""

from __future__ import annotations

import time
from pathlib import Path

from farm import remotion
from farm.config import WORKER_KEYS, Settings
from farm.db import DB
from farm.gc import free_gib
from farm.plan import plan_chunks


def check_nodes(s: Settings, asked: list[str] | None) -> list[str]:
    nodes = list(asked or s.lendable)
    never = sorted(set(nodes) & set(s.never_lend))
    if never:
        raise ValueError("%s is never lent" % ", ".join(never))
    unknown = sorted(set(nodes) - set(s.farm_nodes))
    if unknown:    # a job on a node no worker serves would wait for ever
        raise ValueError("%s: not in farm_nodes (%s)" % (", ".join(unknown), ", ".join(s.farm_nodes)))
    if not nodes:
        raise ValueError("no nodes (farm_nodes is empty)")
    return nodes


def project_spec(s: Settings, project: Path, composition: str, props: dict) -> tuple[dict, dict]:
    """The spec of a Remotion project's job (bundled once) and how long that took: {"bundle_s"}
    (`remotion bundle` and reading the composition)."""
    t0 = time.monotonic()
    spec = remotion.job_spec(Path(project), composition, props, s)
    return spec, {"bundle_s": round(time.monotonic() - t0, 3)}


def resolve_out(s: Settings, out: str) -> Path:
    """The output's path: a relative one is under output_dir, and every one must resolve there (the
    coordinator's unit may write nowhere else, and a job must not overwrite the farm's own files)."""
    if not isinstance(out, str) or not out.strip() or "\0" in out:
        raise ValueError("out: a file name under output_dir (%s), not %r" % (s.output_dir, out))
    root = Path(s.output_dir).resolve()
    path = (root / out).resolve()          # an absolute `out` replaces root here
    if root not in path.parents:
        raise ValueError("out %r resolves to %s, outside output_dir %s: give a name under it" % (out, path, root))
    if path.is_dir():
        raise ValueError("out %r is a directory" % out)
    return path


def check_spec(s: Settings, spec, *, made_here: bool = False) -> dict:
    """The spec as the farm keeps it: frames and fps checked, and no executables from the sender (a
    worker renders with its own node, browser and node_modules, the host verifies with its own; a
    sender's would run there as the farm's user). made_here: the farm's own job_spec, whose paths are
    the host's settings."""
    if not isinstance(spec, dict):
        raise ValueError("the spec is a JSON object")
    try:
        frames, fps = spec["frames"], spec["fps"]
    except KeyError as e:
        raise ValueError("the job's spec has no %s" % e) from None
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise ValueError("frames must be a whole number >= 1, not %r" % (frames,))
    if isinstance(fps, bool) or not isinstance(fps, (int, float)) or fps <= 0:
        raise ValueError("fps must be a number > 0, not %r" % (fps,))
    given = sorted(set(spec) & set(WORKER_KEYS))
    if given and not made_here:
        raise ValueError("the spec names %s: executables come from each machine's own settings ([render]),"
                         " never from a job" % ", ".join(given))
    s.s_per_frame(spec)                    # a bad s_per_frame is an error here, not at the first chunk
    return spec


def check_free_space(s: Settings, spec: dict | None = None) -> None:
    """min_free_gib must stay free under parts_dir and output_dir once the job's parts and output are
    written (Settings.job_bytes: an estimate from its frames and size)."""
    need = s.job_bytes(spec) / 2**30 if spec else 0.0
    for where in (s.parts_dir, s.output_dir):
        free = free_gib(where)
        if free < s.min_free_gib:
            raise ValueError("only %.1f GiB free under %s (min_free_gib %g): run `farm gc`, or free space"
                             % (free, where, s.min_free_gib))
        if free - need < s.min_free_gib:
            raise ValueError("the job needs about %.1f GiB for its parts and output (%d frames at %sx%s), and %s"
                             " has %.1f GiB free: less than min_free_gib (%g) would be left. Free space (`farm gc`)"
                             " or send a shorter job" % (need, spec["frames"], spec.get("width", "?"),
                                                         spec.get("height", "?"), where, free, s.min_free_gib))


def submit(s: Settings, spec: dict, out: str, nodes: list[str], *, verify: bool = False,
           timings: dict | None = None, made_here: bool = False, s_per_frame: float | None = None) -> str:
    """s_per_frame: the job's own estimate of one node's seconds per frame (its chunks' size and first
    time limits; the limits then follow what its chunks measure)."""
    if s_per_frame is not None and isinstance(spec, dict):
        spec = {**spec, "s_per_frame": s_per_frame}
    spec = check_spec(s, spec, made_here=made_here)
    out_path = resolve_out(s, out)
    db = DB(s.db_path)
    if other := db.one("SELECT id, state FROM jobs WHERE out=? AND state IN ('submitted','running','joining')",
                       (str(out_path),)):
        raise ValueError("job %s (%s) writes %s already: give another out, or cancel it first"
                         % (other["id"], other["state"], out_path))
    check_free_space(s, spec)
    chunks = plan_chunks(spec["frames"], len(nodes), min_chunk=s.min_chunk, per_node=s.per_node,
                         max_chunk=s.max_chunk(spec))
    return db.submit(spec, str(out_path), nodes, chunks, frames=spec["frames"],
                                fps=float(spec["fps"]), verify=verify, timings=timings)
