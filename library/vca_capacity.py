#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_capacity
short_description: The additive-capacity benchmark's load, transcode and record
description:
  - O(action=chat) runs Locust 2.x headless (the locustfile C(capacity_locustfile.py) of
    playbooks/bench/files) against an OpenAI-compatible chat endpoint for O(duration_s) seconds
    with O(users) concurrent closed-loop users, and returns the leg's requests, failures,
    completion tokens, tok/s and p50/p95 latency, parsed from Locust's C(--json-file) and the
    locustfile's token file. Tokens are only those the answers' C(usage.completion_tokens) report.
  - O(action=transcode) encodes O(frames) frames of ffmpeg's C(testsrc2) (lavfi) at O(size) to
    C(/dev/null) and returns the frames, seconds and fps. O(encoder=auto) picks C(h264_qsv) on a
    C(hardware) platform whose ffmpeg lists it, C(libx264) elsewhere (the lab); a failed QSV run
    is retried with C(libx264) and says so. A failed run gives no fps and a reason, not an error,
    so that the other machines' figures are still recorded.
  - O(action=report) builds the run's record from the legs, the energy snapshots of M(vca_energy),
    the loads and the transcode runs (module_utils/vca_capacity.py), to be written as JSON and
    rendered by C(capacity-table.md.j2).
  - Changes nothing on the managed system (chat and transcode write only to a temporary directory).
options:
  action:
    description: What to do.
    type: str
    choices: [chat, transcode, report]
    required: true
  url:
    description: (chat) The endpoint's base URL, for example the HAProxy frontend C(http://127.0.0.1:8090).
    type: str
  locust:
    description: (chat) The locust executable.
    type: path
    default: /opt/vcafleet-bench/venv/bin/locust
  locustfile:
    description: (chat) The capacity locustfile on the target.
    type: path
    default: /opt/vcafleet-bench/capacity_locustfile.py
  users:
    description: (chat) Concurrent users (each one request in flight at a time); also the spawn rate.
    type: int
    default: 8
  duration_s:
    description: (chat) Seconds of load.
    type: int
    default: 60
  stop_timeout_s:
    description: (chat) Seconds the users get at the end to finish the request in flight, so that
      its tokens are counted; the run's time includes them.
    type: int
    default: 120
  max_tokens:
    description: (chat) C(max_tokens) of every request.
    type: int
    default: 128
  prompt:
    description: (chat) The user message of every request.
    type: str
    default: Write a short story about a lighthouse keeper.
  model:
    description: (chat) The request's C(model) field (llama-server serves its one model whatever it says).
    type: str
    default: default
  stream:
    description: >-
      (chat) Stream the answers (server-sent events) and time each one's first token (ttft_p50_ms,
      ttft_p95_ms).
    type: bool
    default: false
  token:
    description: (chat) Bearer token the frontend wants (C(llm_workers_token)); passed to Locust
      through the environment, never on its command line.
    type: str
    default: ""
  ffmpeg:
    description: (transcode) The ffmpeg executable.
    type: path
    default: ffmpeg
  encoder:
    description: (transcode) C(auto), C(h264_qsv) or C(libx264).
    type: str
    choices: [auto, h264_qsv, libx264]
    default: auto
  frames:
    description: (transcode) Frames to encode.
    type: int
    default: 1800
  size:
    description: (transcode) Frame size of the test source.
    type: str
    default: 1920x1080
  rate:
    description: (transcode) Frame rate of the test source.
    type: int
    default: 30
  sysfs_root:
    description: (transcode) Sysfs root for the platform label (C(vca_sysfs_root)).
    type: path
    default: /sys
  timestamp:
    description: (report) The run's UTC time.
    type: str
  params:
    description: (report) The run's parameters, copied into the record.
    type: dict
    default: {}
  legs:
    description:
      - (report) The legs in order, each a dict with C(name), C(setup), C(kind) (C(chat) or
        C(transcode)), C(group) (C(main) or C(scaling)), C(machines) and, when it was not run, C(reason).
    type: list
    elements: dict
    default: []
  results:
    description:
      - (report) {machine {leg name {before, after, load, transcode}}}, what each machine
        registered; C(before) and C(after) are M(vca_energy) snapshots, C(load) the frontend's
        O(action=chat) result, C(transcode) the machine's O(action=transcode) result.
    type: dict
    default: {}
  frontend:
    description: (report) The machine that ran the load generator (its C(load) results count).
    type: str
author: vcafleet
"""

EXAMPLES = r"""
- name: Chat load at the HAProxy frontend
  vca_capacity:
    action: chat
    url: http://127.0.0.1:8090
    users: 8
    duration_s: 60
  register: load

- name: Transcode on this machine
  vca_capacity:
    action: transcode
    frames: 1800
    sysfs_root: "{{ vca_sysfs_root | default('/sys') }}"
  register: transcode
"""

RETURN = r"""
load:
  description: (chat) requests, failures, completion_tokens, prompt_tokens, seconds, tok_s, p50_ms,
    p95_ms (exact, of the answered requests), locust (Locust's own p50/p95 from its histogram),
    consistent (Locust's counts agree with the token file's).
  returned: action=chat
  type: dict
transcode:
  description: (transcode) encoder, frames, frames_wanted, seconds, fps (null when the run failed),
    reason, platform, fallback (why QSV was not used, when it was wanted).
  returned: action=transcode
  type: dict
record:
  description: (report) The run's record (format vcafleet-capacity/1).
  returned: action=report
  type: dict
"""

import os
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_capacity import assemble, chat_load, transcode_result
from ansible.module_utils.vca_sensors import platform
from ansible.module_utils.vca_sysfs import Sysfs


def run_chat(module):
    p = module.params
    if not p["url"]:
        module.fail_json(msg="action=chat needs url")
    for name in ("users", "duration_s", "max_tokens"):
        if p[name] < 1:
            module.fail_json(msg="%s must be at least 1, got %d" % (name, p[name]))
    for path in (p["locust"], p["locustfile"]):
        if not os.path.exists(path):
            module.fail_json(msg="%s is missing (playbooks/bench/capacity.yml installs it)" % path)
    work = tempfile.mkdtemp(prefix="vca-capacity-")
    try:
        argv = [p["locust"], "-f", p["locustfile"], "--headless", "--only-summary", "--skip-log-setup",
                "-u", str(p["users"]), "-r", str(p["users"]), "-t", "%ds" % p["duration_s"],
                "--stop-timeout", str(p["stop_timeout_s"]), "--host", p["url"],
                "--json-file", os.path.join(work, "locust"), "--exit-code-on-error", "0",
                "--vca-tokens-file", os.path.join(work, "tokens.json"),
                "--vca-max-tokens", str(p["max_tokens"]), "--vca-prompt", p["prompt"], "--vca-model", p["model"]]
        if p["stream"]:
            argv.append("--vca-stream")
        env = dict(os.environ, VCA_BENCH_TOKEN=p["token"] or "")
        rc, out, err = module.run_command(argv, environ_update=env)
        if rc != 0:
            module.fail_json(msg="locust exited %d" % rc, stdout=out[-4000:], stderr=err[-4000:])
        try:
            with open(os.path.join(work, "locust.json")) as fh:
                stats = fh.read()
            with open(os.path.join(work, "tokens.json")) as fh:
                tokens = fh.read()
            load = chat_load(stats, tokens)
        except (OSError, ValueError, KeyError) as exc:
            module.fail_json(msg="Locust's output could not be read: %s" % exc, stderr=err[-4000:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load.update(users=p["users"], duration_s=p["duration_s"], max_tokens=p["max_tokens"], url=p["url"])
    module.exit_json(changed=False, load=load)


def ffmpeg_argv(p, encoder):
    argv = [p["ffmpeg"], "-hide_banner", "-nostdin", "-nostats", "-loglevel", "error",
            "-f", "lavfi", "-i", "testsrc2=size=%s:rate=%d" % (p["size"], p["rate"]),
            "-frames:v", str(p["frames"])]
    if encoder == "h264_qsv":
        argv += ["-vf", "format=nv12", "-c:v", "h264_qsv"]
    else:
        argv += ["-c:v", "libx264", "-preset", "veryfast"]
    return [*argv, "-progress", "pipe:1", "-f", "h264", "-y", "/dev/null"]


def run_transcode(module):
    p = module.params
    if p["frames"] < 1:
        module.fail_json(msg="frames must be at least 1, got %d" % p["frames"])
    label = platform(Sysfs(p["sysfs_root"]))
    ffmpeg = shutil.which(p["ffmpeg"]) if os.sep not in p["ffmpeg"] else p["ffmpeg"]
    if not ffmpeg or not os.path.exists(ffmpeg):
        module.exit_json(changed=False, transcode={"encoder": None, "fps": None, "platform": label,
                                                   "reason": "ffmpeg (%s) is not installed" % p["ffmpeg"]})
    p = dict(p, ffmpeg=ffmpeg)
    encoder, fallback = p["encoder"], None
    if encoder == "auto":
        _, listed, _ = module.run_command([ffmpeg, "-hide_banner", "-encoders"])
        has_qsv = " h264_qsv " in listed
        encoder = "h264_qsv" if label == "hardware" and has_qsv else "libx264"
        if encoder == "libx264":
            fallback = "platform is %s" % label if label != "hardware" else "this ffmpeg has no h264_qsv"

    def timed(encoder):
        t0 = time.monotonic()
        rc, out, err = module.run_command(ffmpeg_argv(p, encoder))
        return rc, out, err, time.monotonic() - t0

    rc, out, err, seconds = timed(encoder)
    if rc != 0 and encoder == "h264_qsv" and p["encoder"] == "auto":
        fallback = "h264_qsv failed (rc %d): %s" % (rc, err.strip()[-300:])
        encoder = "libx264"
        rc, out, err, seconds = timed(encoder)
    result = transcode_result(out, seconds, p["frames"], encoder)
    if rc != 0:
        result["fps"] = None
        result["reason"] = "ffmpeg exited %d: %s" % (rc, err.strip()[-300:])
    result.update(platform=label, fallback=fallback, size=p["size"])
    module.exit_json(changed=False, transcode=result)


def run_report(module):
    p = module.params
    try:
        record = assemble(p["timestamp"], p["params"], p["legs"], p["results"], p["frontend"])
    except (ValueError, KeyError, TypeError) as exc:
        module.fail_json(msg="the capacity record could not be built: %s" % exc)
    module.exit_json(changed=False, record=record)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True, choices=["chat", "transcode", "report"]),
            url=dict(type="str"),
            locust=dict(type="path", default="/opt/vcafleet-bench/venv/bin/locust"),
            locustfile=dict(type="path", default="/opt/vcafleet-bench/capacity_locustfile.py"),
            users=dict(type="int", default=8),
            duration_s=dict(type="int", default=60),
            stop_timeout_s=dict(type="int", default=120),
            max_tokens=dict(type="int", default=128),
            prompt=dict(type="str", default="Write a short story about a lighthouse keeper."),
            model=dict(type="str", default="default"),
            stream=dict(type="bool", default=False),
            token=dict(type="str", default="", no_log=True),
            ffmpeg=dict(type="path", default="ffmpeg"),
            encoder=dict(type="str", default="auto", choices=["auto", "h264_qsv", "libx264"]),
            frames=dict(type="int", default=1800),
            size=dict(type="str", default="1920x1080"),
            rate=dict(type="int", default=30),
            sysfs_root=dict(type="path", default="/sys"),
            timestamp=dict(type="str"),
            params=dict(type="dict", default={}),
            legs=dict(type="list", elements="dict", default=[]),
            results=dict(type="dict", default={}),
            frontend=dict(type="str"),
        ),
        supports_check_mode=False,
    )
    {"chat": run_chat, "transcode": run_transcode, "report": run_report}[module.params["action"]](module)


if __name__ == "__main__":
    main()
