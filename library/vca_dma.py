#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_dma
short_description: PLX DMA engine probe through /dev/vca_dma<N>, verified by content
description:
  - Drives the PLX PEX87xx DMA engine through the vca_dma driver's ioctls
    (modules_c/vca_dma/include/uapi/vca_dma_ioctl.h) and reports MiB/s only for copies verified
    by content. The source is random 32-bit words, the destination starts as their complement;
    after the copy the words equal to the source are counted (C(landed_words)) and the others
    (C(mismatched_words)). A leg gets a figure (the median over O(repeats) of bytes over the
    driver's C(elapsed_ns), with the wall time beside it) only when every repeat had status 0,
    C(bytes_done) equal to the length and no mismatched word; otherwise C(mibps) is null and
    C(reason) says why (timeout -EINPROGRESS, engine error -EIO, short copy, N mismatched words,
    engine gone).
  - A copy into a window cannot be read by this process, so it is verified by copying the window
    back (FROM_TARGET) into a fresh buffer and comparing with what was sent. A recv leg first
    writes the source into the window, untimed, and times the FROM_TARGET copy. A mismatch can
    therefore come from either direction; the leg says only that the data did not survive.
  - C(selftest) copies a user buffer to a second user buffer (TARGET_USER). C(matrix) runs send
    (TO_TARGET) and recv (FROM_TARGET) for every window onto the host, then for every window onto
    a node. C(ring) uses a ring order (O(order) less the O(dead) nodes, else the planner's order
    from O(node_rates)).
  - "C(ring) with O(node) set is this node's part of a pipelined ring: the driver takes one copy at
    a time per engine, so a pipeline is every node's engine sending its own hop at once. The module
    runs only the hop this node sends (node -> its successor, through the window onto the
    successor), first sleeping until O(start_at), and every leg carries the epoch start and end of
    each timed copy (C(copies), C(started_at), C(ended_at)). Run it on every node with one
    O(start_at), then C(ring_overlap) on the results says whether the hops overlapped and gives the
    ring's figure only if they did."
  - C(ring) without O(node) is the sequential ring, every hop one after another on this engine,
    each relayed through a local buffer (FROM one window, TO the other; times added). It measures
    each hop as this engine drives it, NOT a pipelined ring, nor contention between hops.
  - C(ring_overlap) touches no engine (run it anywhere, e.g. localhost). From O(results), every
    node's result of one pipelined ring run, it returns C(ring) (module_utils/vca_dma.py
    ring_overlap()).
  - "One leg failing never stops the others. When the engine vanishes (ENODEV/ENOENT), the rest of
    that engine's legs are C(skipped: engine gone)."
  - Runs under the thermal guard (as M(vca_gemm)), checked between legs; a run it stops returns
    C(aborted=thermal) and no figure.
  - Where no /dev/vca_dma* exists (the lab) the module returns C(unsupported=true) and
    C(looked_for), not a failure, and no figure.
  - Check mode plans only (INFO, WINDOW, COUNTERS, the planner's order and predictions); no copy is
    submitted.
options:
  mode:
    description: C(selftest), C(matrix), C(ring), or C(ring_overlap) (no engine; reads O(results)).
    type: str
    choices: [selftest, matrix, ring, ring_overlap]
    default: selftest
  dev_root:
    description: Where to look for vca_dma<N> device nodes.
    type: path
    default: /dev
  sysfs_root:
    description: Sysfs root for the PCI evidence, the platform label and the thermal guard (C(vca_sysfs_root)).
    type: path
    default: /sys
  engines:
    description: Device paths to use; default every /dev/vca_dma<N> found.
    type: list
    elements: path
  bytes:
    description: Bytes per copy (a multiple of 4); longer than the engine's C(max_copy_bytes) it is split into
      max-size copies, and a window copy is cut to the window's length.
    type: int
    default: 67108864
  repeats:
    description: Timed copies per leg; the figure is their median.
    type: int
    default: 5
  timeout_ms:
    description: WAIT timeout per copy, 1 to 60000 (the driver refuses a longer WAIT).
    type: int
    default: 5000
  node:
    description: The node index this engine's side is (names the legs C(node<N>) and lets ring hops start or end
      here); default C(local).
    type: int
  order:
    description: Ring order of node indices (ring mode); default the planner's from O(node_rates).
    type: list
    elements: int
  node_rates:
    description: Per node C({send, recv}) MiB/s for the planner (module_utils/vca_ring_plan.py); its prediction is
      put beside each node-to-node leg.
    type: dict
  dead:
    description: Nodes the planner leaves out.
    type: list
    elements: int
    default: []
  efficiency:
    description: The planner's efficiency factor.
    type: float
    default: 0.96
  thermal_limit_c:
    description: Stop before the hottest core reaches this.
    type: float
    default: 90
  allow_no_sensor:
    description: Run without a coretemp sensor on a platform that is not C(lab) (see M(vca_gemm)).
    type: bool
    default: false
  record_dir:
    description: Also write the run's record as JSON here (C(vca_dma-<mode>-<UTC time>.json), atomically); not in
      check mode. The record is returned either way.
    type: path
  seed:
    description: Seed of the random words.
    type: int
    default: 20260928
  start_at:
    description: Ring mode with O(node) set only. Epoch seconds (this machine's clock) at which
      this node's hop starts; the module sleeps until then, at most 600 s ahead (further is refused
      before any engine is opened). A start already past runs at once, with C(start.late_s) > 0.
      Give every node the same value.
    type: float
  results:
    description: C(ring_overlap) only. Every node's registered result of one pipelined ring run,
      as a mapping host -> result.
    type: dict
author: vcafleet
"""

EXAMPLES = r"""
- name: Engine self-test on the host
  vca_dma:
    mode: selftest
    bytes: 16777216
  register: dma

- name: Matrix on a node, the planner's predictions beside each node leg
  vca_dma:
    mode: matrix
    node: 0
    node_rates: {0: {send: 3997, recv: 3949}, 1: {send: 2058, recv: 4849}, 2: {send: 5642, recv: 3129}}
    sysfs_root: "{{ vca_sysfs_root }}"
    thermal_limit_c: "{{ vca_thermal_limit_c }}"
    record_dir: /var/lib/vcafleet/dma

- name: This node's hop of a pipelined ring, every node starting at one agreed moment
  vca_dma:
    mode: ring
    node: "{{ vca_node }}"
    node_rates: {0: {send: 3997, recv: 3949}, 1: {send: 2058, recv: 4849}, 2: {send: 5642, recv: 3129}}
    start_at: "{{ hostvars['localhost'].vca_bench_dma_start_at }}"
  register: ring_hop

- name: Did the hops overlap, and the ring's figure if they did
  vca_dma:
    mode: ring_overlap
    results: "{{ dict(groups['vca_nodes'] | zip(groups['vca_nodes'] | map('extract', hostvars, 'ring_hop'))) }}"
  delegate_to: localhost
  run_once: true

- name: What a ring run would do (no copy submitted)
  vca_dma:
    mode: ring
    node: 0
    node_rates: {0: {send: 3997, recv: 3949}, 1: {send: 2058, recv: 4849}, 2: {send: 5642, recv: 3129}}
  check_mode: true
"""

RETURN = r"""
unsupported:
  description: "True where no /dev/vca_dma* exists; then C(msg) is C(unsupported: no PLX DMA engine found)."
  returned: when no engine was found
  type: bool
looked_for:
  description: "What was checked, e.g. the device glob, the sysfs PCI path and vendor id, every PLX
    function found and which driver holds it (C(plx87xx_dma owns 0000:03:00.1: bind vca_dma per docs/DMA.md))."
  returned: always
  type: list
  elements: str
record:
  description: platform (lab|hardware|unknown) and platform_evidence, thermal guard, and per engine (C(engines))
    the INFO answer, windows, counters_before and counters_after (COUNTERS), the ring plan, planned_legs and
    legs. Each leg has from, to, kind, bytes, repeats, mibps (null unless verified), reason, landed_words,
    mismatched_words, status, wall_s, and predicted_mibps for a node-to-node leg when node_rates are given;
    a leg that ran copies has copies (the epoch [start, end] of each timed copy), started_at and ended_at.
    In ring mode an engine's record has order, ring (C(pipelined) or C(sequential)) and skipped_dead; a
    pipelined one has start ({start_at, waited_s, late_s}) and, on a node outside the ring, ring_note.
  returned: when an engine was found
  type: dict
ring:
  description: "C(ring_overlap) only: order; hops (hop, host, bytes, mibps, predicted_mibps, reason,
    started_at, ended_at); missing (hops of the order that did not run); common_span_s (the hops' spans'
    common interval, <= 0 when they did not overlap); all_in_flight_s (how long every hop's engine had a
    piece in flight at once, by the drivers' per-piece spans); no_pieces (hops whose driver gave no per-piece
    spans, ABI 1); overlapped; pipelined (every hop ran, was verified and all were in flight at once);
    ring_mibps and slowest_hop (only when pipelined: the slowest hop's bytes over the longest hop's copy
    time); reason (why not pipelined); notes (a machine without a pipelined record, and why; a node
    outside the ring)."
  returned: in mode ring_overlap
  type: dict
record_path:
  description: The JSON file written under O(record_dir).
  returned: when written
  type: str
aborted:
  description: C(thermal) when the thermal guard stopped the run; then no leg has a figure.
  returned: when aborted
  type: str
"""

import json
import os
import tempfile
import time

from ansible.module_utils import vca_dma as dma
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_ring_plan import PlanError, plan_ring, predict
from ansible.module_utils.vca_sensors import platform_evidence, platform_label
from ansible.module_utils.vca_sysfs import Sysfs
from ansible.module_utils.vca_thermal import NoThermalSensor, ThermalAbort, ThermalGuard


def write_record(directory, record):
    if not os.path.isdir(directory):
        os.makedirs(directory)
    name = "vca_dma-%s-%s.json" % (record["mode"], time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".vca_dma-")
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh, indent=1, sort_keys=True)
    path = os.path.join(directory, name)
    os.replace(tmp, path)
    return path


def run_engines(p, paths, guard, check_mode):
    out = []
    for path in paths:
        try:
            dev = dma.open_device(path)
        except OSError as exc:
            out.append({"path": path, "error": "open: %s" % exc, "legs": [],
                        "engine_gone": exc.errno in dma.GONE_ERRNOS})
            continue
        try:
            rec = dma.probe(dev, p["mode"], nbytes=p["bytes"], repeats=p["repeats"], timeout_ms=p["timeout_ms"],
                            guard=guard, node=p["node"], order=p["order"], node_rates=p["node_rates"],
                            dead=p["dead"], efficiency=p["efficiency"], check_mode=check_mode, seed=p["seed"],
                            start_at=p["start_at"])
        except dma.EngineGone as exc:
            rec = {"error": str(exc), "engine_gone": True, "legs": []}
        except ThermalAbort as exc:
            rec = getattr(exc, "record", {"aborted": "thermal"})
            rec["path"] = path
            out.append(rec)
            exc.engines = out
            raise
        finally:
            close = getattr(dev, "close", None)
            if close:
                close()
        rec["path"] = path
        out.append(rec)
    return out


def check_params(module, p):
    """Bad input fails here, before any engine is opened; node_rates' keys become ints."""
    if p["bytes"] < 4 or p["bytes"] % 4:
        module.fail_json(msg="bytes must be a positive multiple of 4, got %d" % p["bytes"])
    if p["repeats"] < 1:
        module.fail_json(msg="repeats must be at least 1, got %d" % p["repeats"])
    if not 0 < p["timeout_ms"] <= dma.abi.WAIT_MAX_MS:
        module.fail_json(msg="timeout_ms must be 1 to %d, got %d" % (dma.abi.WAIT_MAX_MS, p["timeout_ms"]))
    if p["node_rates"]:
        try:
            p["node_rates"] = dict((int(k), v) for k, v in p["node_rates"].items())
            predict(p["node_rates"], p["dead"], p["efficiency"])
            if p["mode"] == "ring" and not p["order"]:
                plan_ring(p["node_rates"], p["dead"], p["efficiency"])
        except (PlanError, ValueError) as exc:
            module.fail_json(msg="node_rates: %s" % exc)
    elif p["mode"] == "ring" and not p["order"]:
        module.fail_json(msg="ring mode needs order or node_rates")
    if p["mode"] == "ring" and p["order"]:
        try:
            dma.ring_order(p["order"], dead=p["dead"])
        except PlanError as exc:
            module.fail_json(msg="order: %s" % exc)
    if p["start_at"] is not None:
        if p["mode"] != "ring" or p["node"] is None:
            module.fail_json(msg="start_at is for ring mode with node set (a pipelined ring's hop)")
        try:
            dma.check_start_at(p["start_at"])   # before any engine is opened
        except ValueError as exc:
            module.fail_json(msg=str(exc))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", default="selftest", choices=["selftest", "matrix", "ring", "ring_overlap"]),
            dev_root=dict(type="path", default="/dev"),
            sysfs_root=dict(type="path", default="/sys"),
            engines=dict(type="list", elements="path"),
            bytes=dict(type="int", default=dma.DEFAULT_BYTES),
            repeats=dict(type="int", default=dma.DEFAULT_REPEATS),
            timeout_ms=dict(type="int", default=dma.DEFAULT_TIMEOUT_MS),
            node=dict(type="int"),
            order=dict(type="list", elements="int"),
            node_rates=dict(type="dict"),
            dead=dict(type="list", elements="int", default=[]),
            efficiency=dict(type="float", default=0.96),
            thermal_limit_c=dict(type="float", default=90),
            allow_no_sensor=dict(type="bool", default=False),
            record_dir=dict(type="path"),
            seed=dict(type="int", default=20260928),
            start_at=dict(type="float"),
            results=dict(type="dict"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["mode"] == "ring_overlap":
        # Pure: reads the nodes' results, touches no engine, the same in check mode.
        module.exit_json(changed=False, ring=dma.ring_overlap(p["results"] or {}))
    if p["results"] is not None:
        module.fail_json(msg="results is for mode ring_overlap")
    check_params(module, p)

    found = dma.find_engines(p["dev_root"], p["sysfs_root"])
    if "unsupported" in found:
        module.exit_json(changed=False, unsupported=True, msg=found["unsupported"], looked_for=found["looked_for"],
                         plx_functions=found["plx_functions"])
    paths = p["engines"] or found["engines"]
    if dma.np is None:
        module.fail_json(msg="an engine is here (%s) but the DMA probe needs NumPy (python3-numpy) to fill and check"
                         " its buffers" % ", ".join(paths), looked_for=found["looked_for"])

    evidence = platform_evidence(Sysfs(p["sysfs_root"]))
    record = {"mode": p["mode"], "platform": platform_label(evidence), "platform_evidence": evidence,
              "plx_functions": found["plx_functions"], "check_mode": module.check_mode}
    if module.check_mode:
        record["engines"] = run_engines(p, paths, None, True)
        module.exit_json(changed=False, record=record, looked_for=found["looked_for"])

    guard = ThermalGuard(p["sysfs_root"], p["thermal_limit_c"], platform=record["platform"],
                         allow_no_sensor=p["allow_no_sensor"])
    try:
        with guard:
            record["engines"] = run_engines(p, paths, guard, False)
    except ThermalAbort as exc:
        record["engines"] = getattr(exc, "engines", [])
        record["aborted"] = "thermal"
        record["thermal"] = guard.record()
        result = dict(changed=False, aborted="thermal", temperature_c=exc.temperature_c, limit_c=exc.limit_c,
                      msg=str(exc), thermal=guard.record(), platform=record["platform"])
        if p["record_dir"]:
            result["record_path"] = write_record(p["record_dir"], record)
        module.exit_json(**result)
    except NoThermalSensor as exc:
        module.fail_json(msg="%s; sysfs_root %s" % (exc, p["sysfs_root"]), thermal=guard.record(),
                         platform=record["platform"], platform_evidence=evidence)
    record["thermal"] = guard.record()
    result = dict(changed=False, record=record, looked_for=found["looked_for"])
    if p["record_dir"]:
        result["record_path"] = write_record(p["record_dir"], record)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
