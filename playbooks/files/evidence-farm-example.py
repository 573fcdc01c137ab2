#!/usr/bin/env python3
"""The farm's example job, end to end, for the hardware evidence (playbooks/verify-hardware.yml):
submit it detached, follow `farm status --json` until it ends (bounded), print one JSON line.
Usage: evidence-farm-example.py PROJECT COMPOSITION OUT TIMEOUT_S"""

import json
import subprocess
import sys
import time

project, composition, out, timeout_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
started = time.monotonic()
submitted = subprocess.run(["farm", "submit", "--project", project, "--composition", composition, "--out", out,
                            "--detach"], capture_output=True, text=True, check=False)
if submitted.returncode != 0:
    print(json.dumps({"ok": False, "reason": "farm submit: " + (submitted.stderr or submitted.stdout).strip()[-300:]}))
    sys.exit(1)
job = submitted.stdout.split()[0]
while True:
    v = json.loads(subprocess.run(["farm", "status", job, "--json"], capture_output=True, text=True,
                                  check=True).stdout)
    state = v["job"]["state"]
    if state in ("done", "failed", "cancelled") or time.monotonic() - started > timeout_s:
        break
    time.sleep(2)
ok = state == "done"
print(json.dumps({"ok": ok, "job": job, "state": state, "frames": v["job"]["frames"],
                  "seconds": round(time.monotonic() - started, 1),
                  "reason": "" if ok else (v["job"].get("reason") or "still %s after %d s" % (state, timeout_s))}))
sys.exit(0 if ok else 1)
