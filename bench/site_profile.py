#!/usr/bin/env python3
"""Where a playbook run's time goes: the slowest tasks, as a Markdown table (issue 30).

Runs the command given after `--` with Ansible's JSON callback (ansible.posix.json), then prints the
`--top` tasks by wall time (first host's start to last host's end), with their play, how many hosts ran
them and how many changed, and the run's wall time and recap.

    .venv/bin/python bench/site_profile.py -- ansible-playbook site.yml              # the lab (make lab first)
    .venv/bin/python bench/site_profile.py --plays -- ansible-playbook site.yml      # and each play's time
    .venv/bin/python bench/site_profile.py --top 15 -- ansible-playbook -i inventory/mysite site.yml --check
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime


def _t(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def merged_tasks(play):
    """A play's tasks, one entry per task: under a strategy the json callback does not know as
    lockstep (Mitogen's linear, which ansible.cfg uses) it records each host's run of a task
    apart; those are joined here (first start, last end, every host)."""
    merged = {}
    for entry in play.get("tasks", []):
        task = entry["task"]
        duration = task.get("duration") or {}
        if not duration.get("start") or not duration.get("end"):
            continue
        span = (_t(duration["start"]), _t(duration["end"]))
        key = task.get("id") or id(entry)
        if key in merged:
            first = merged[key]
            first["span"] = (min(first["span"][0], span[0]), max(first["span"][1], span[1]))
            first["hosts"].update(entry.get("hosts", {}))
        else:
            merged[key] = {"name": task["name"] or "(unnamed)", "span": span, "hosts": dict(entry.get("hosts", {}))}
    return list(merged.values())


def slowest(report, top):
    """[(seconds, task, play, hosts, changed)] from ansible.posix.json's report, slowest first."""
    rows = []
    for play in report.get("plays", []):
        for task in merged_tasks(play):
            hosts = task["hosts"]
            rows.append((task["span"][1] - task["span"][0], task["name"], play["play"]["name"], len(hosts),
                         sum(1 for h in hosts.values() if h.get("changed"))))
    return sorted(rows, reverse=True)[:top]


def plays(report):
    """[(seconds, play, tasks)] in run order: each play's wall time (its first task's start to its
    last task's end) and how many tasks it ran; the long tail of small tasks shows here."""
    rows = []
    for play in report.get("plays", []):
        spans = [task["span"] for task in merged_tasks(play)]
        if spans:
            rows.append((max(end for _, end in spans) - min(start for start, _ in spans), play["play"]["name"],
                         len(spans)))
    return rows


def play_table(rows):
    lines = ["| play | seconds | tasks |", "|---|---:|---:|"]
    lines += ["| %s | %.1f | %d |" % (name.replace("|", "\\|"), seconds, n) for seconds, name, n in rows]
    lines.append("| all plays | %.1f | %d |" % (sum(r[0] for r in rows), sum(r[2] for r in rows)))
    return "\n".join(lines)


def table(rows):
    lines = ["| # | seconds | task | play | hosts | changed |", "|---:|---:|---|---|---:|---:|"]
    for i, (seconds, task, play, hosts, changed) in enumerate(rows, 1):
        cells = (i, seconds, task.replace("|", "\\|"), play.replace("|", "\\|"), hosts, changed)
        lines.append("| %d | %.1f | %s | %s | %d | %d |" % cells)
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--plays", action="store_true", help="also each play's wall time and task count")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the ansible-playbook command")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --, e.g. -- ansible-playbook site.yml")
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1")
    t0 = time.monotonic()
    run = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    try:
        # the report, with ansible.cfg's profile_tasks lines before and after it
        report, _ = json.JSONDecoder().raw_decode(run.stdout[run.stdout.index("{"):])
    except ValueError:
        sys.exit("no JSON report from %s (exit %d):\n%s" % (" ".join(command), run.returncode, run.stderr[-2000:]))
    print(table(slowest(report, args.top)))
    if args.plays:
        print()
        print(play_table(plays(report)))
    stats = report.get("stats", {})
    print("\n%s: exit %d, %.0f s wall; changed %s" % (" ".join(command), run.returncode, wall,
                                                      {h: s.get("changed", 0) for h, s in sorted(stats.items())}))
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
