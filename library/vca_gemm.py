#!/usr/bin/python
# SPDX-License-Identifier: MIT

DOCUMENTATION = r"""
---
module: vca_gemm
short_description: SGEMM probe (autotuned OpenCL or AVX2 CPU), verified by content
description:
  - Multiplies random float32 matrices and reports GFLOP/s only for results that
    match a float64 CPU reference within a tolerance that grows with sqrt(K)
    (relative to sum |a||b|). A wrong result fails the module; no figure is returned.
  - Timing is the median of at least 5 runs after a warm-up, with the spread, and
    CPU time against wall time so that a run on a shared host is flagged C(noisy).
  - Runs under the thermal guard; a probe stopped by it returns C(aborted=thermal)
    and the temperature seen, never a figure. Without a coretemp sensor the guard
    is blind, and the probe fails before it loads the node unless the platform is
    C(lab) or O(allow_no_sensor) is set.
  - The record's C(platform) is C(hardware) only on VCA evidence found under
    O(sysfs_root) (see M(vca_sensors)); figures on an C(unknown) platform are
    reported with C(platform=unknown), never as hardware figures.
  - OpenCL tiling comes from O(params), else the tuning cache, else an autotuning
    search (random sampling plus local refinement, every candidate verified) whose
    winner is cached per device, driver and N class.
  - Never changes the managed system (the tuning cache is the probe's own state).
options:
  backend:
    description: C(opencl) (the tiled kernel family, or the shipped reproduction) or C(cpu) (the C AVX2/FMA SGEMM).
    type: str
    choices: [opencl, cpu]
    required: true
  device:
    description: OpenCL device whose name contains this string; default the first GPU, else the first device.
    type: str
  sizes:
    description: Square sizes N to measure.
    type: list
    elements: int
    default: [1024]
  repetitions:
    description: Timed runs per size (at least 5).
    type: int
    default: 5
  sustain_seconds:
    description: Keep running each size for at least this long (sustained mode); 0 for plain repetitions.
    type: float
    default: 0
  kernel:
    description: C(tuned) (the tiled family) or C(shipped) (one element per work-item, implicit local size).
    type: str
    choices: [tuned, shipped]
    default: tuned
  params:
    description: Explicit tiling macros (TM, TN, TK, WPTM, WPTN, VW, LMEM, KBARRIER; optionally PF, PACK); no tuning.
    type: dict
  tune:
    description: Search the tiling space when the cache has no winner for this device and size class.
    type: bool
    default: true
  tune_budget:
    description: Trials the search may spend.
    type: int
    default: 60
  tune_size:
    description: N used while tuning (default the largest size, at most 1024).
    type: int
  build_options:
    description: Extra OpenCL compiler options.
    type: list
    elements: str
    default: []
  kernel_dir:
    description: Where the role put sgemm.cl and sgemm_shipped.cl.
    type: path
    default: /usr/local/share/vcafleet/probes
  cpu_library:
    description: The compiled CPU SGEMM.
    type: path
    default: /usr/local/lib/vcafleet/libvcasgemm.so
  cache_path:
    description: JSON file of tuning winners on the node.
    type: path
    default: /var/cache/vcafleet/gemm-tuning.json
  sysfs_root:
    description: Sysfs root for the thermal guard (C(vca_sysfs_root)).
    type: path
    default: /sys
  thermal_limit_c:
    description: Stop before the hottest core reaches this.
    type: float
    default: 90
  allow_no_sensor:
    description:
      - Run without a coretemp sensor on a platform that is not C(lab), where nothing can stop
        the probe before the node overheats. The record's C(thermal) then says
        C(sensor=absent) and C(allow_no_sensor=true).
    type: bool
    default: false
  seed:
    description: Seed of the random operands.
    type: int
    default: 20260928
author: vcafleet
"""

EXAMPLES = r"""
- name: GEMM on the node's GPU, autotuned
  vca_gemm:
    backend: opencl
    sizes: [1024, 2048]
    sysfs_root: "{{ vca_sysfs_root }}"
    thermal_limit_c: "{{ vca_thermal_limit_c }}"
  register: gemm
"""

RETURN = r"""
record:
  description: device, backend, kernel, params, platform (lab|hardware|unknown) and the
    platform_evidence it rests on, tuning, thermal guard (limit, max seen, sensor, allow_no_sensor),
    and per size the GFLOP/s, timing (median, spread, cpu_per_wall, noisy) and verification
    (max_rel_error, wrong elements, tolerance).
  returned: unless the probe failed
  type: dict
aborted:
  description: C(thermal) when the thermal guard stopped the probe; then no figure is returned.
  returned: when aborted
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_autotune import START_PARAMS, Tuner, cache_key, load_cache, store_cache
from ansible.module_utils.vca_gemm import (
    CPURunner,
    OpenCLRunner,
    Reference,
    VerificationFailed,
    gflops,
    measure,
    random_operands,
)
from ansible.module_utils.vca_sensors import platform_evidence, platform_label
from ansible.module_utils.vca_sysfs import Sysfs
from ansible.module_utils.vca_thermal import NoThermalSensor, ThermalAbort, ThermalGuard

PARAM_KEYS = ("TM", "TN", "TK", "WPTM", "WPTN", "VW", "LMEM", "KBARRIER")
OPTIONAL_PARAM_KEYS = ("PF", "PACK")   # the kernel defaults them to 0


def pick_device(module, want):
    import pyopencl as cl

    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    if want:
        devices = [d for d in devices if want.lower() in d.name.lower()]
    if not devices:
        module.fail_json(msg="no OpenCL device%s" % (" matching %r" % want if want else ""))
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


def tiling(module, runner, n_max, guard):
    p = module.params
    if p["params"]:
        missing = [k for k in PARAM_KEYS if k not in p["params"]]
        unknown = sorted(set(p["params"]) - set(PARAM_KEYS) - set(OPTIONAL_PARAM_KEYS))
        if missing or unknown:
            module.fail_json(msg="; ".join(["params lacks %s" % ", ".join(missing)] * bool(missing)
                                           + ["params has unknown %s" % ", ".join(unknown)] * bool(unknown)))
        return dict((k, int(v)) for k, v in p["params"].items()), {"source": "given"}
    device = runner.describe()
    key = cache_key(device, n_max)
    cached = load_cache(p["cache_path"]).get(key)
    if cached:
        return cached["params"], {"source": "cache", "key": key, "gflops_when_tuned": cached.get("gflops")}
    start = START_PARAMS["cpu" if runner.is_cpu() else "gpu"]
    if not p["tune"]:
        return start, {"source": "default"}
    n = p["tune_size"] or min(n_max, 1024)
    a, b = random_operands(n, n, n, p["seed"] + 1)
    ref = Reference(a, b)
    limits = {"max_work_group_size": device["max_work_group_size"], "local_mem_bytes": device["local_mem_bytes"]}

    def evaluate(params):
        guard.check()
        try:
            run, result = runner.prepare(a, b, params, p["build_options"])
            _, t = measure(run, result, ref, repetitions=2, guard=guard)
        except VerificationFailed:
            return None
        except (ThermalAbort, NoThermalSensor):
            raise
        except Exception:  # a tiling the compiler or device refuses is simply not a candidate
            return None
        return gflops(n, n, n, t["median_s"])

    tuner = Tuner(evaluate, limits, n, budget=p["tune_budget"], seed=p["seed"])
    score, best = tuner.run(start=start)
    if best is None:
        module.fail_json(msg="autotuning found no tiling that verifies on %s" % device["name"],
                         trials=len(tuner.trials))
    store_cache(p["cache_path"], key, {"params": best, "gflops": score, "tune_size": n})
    return best, {"source": "tuned", "key": key, "trials": len(tuner.trials),
                  "verified_candidates": sum(1 for _, s in tuner.trials if s is not None), "gflops_at_tune_size": score}


def make_runner(module):
    """The runner for the chosen backend, and the threads a CPU-bound run should keep busy."""
    p = module.params
    if p["backend"] == "cpu":
        if not os.path.exists(p["cpu_library"]):
            module.fail_json(msg="%s is missing: the probes role compiles it on the node" % p["cpu_library"])
        runner = CPURunner(p["cpu_library"])
        return runner, runner.threads()
    try:
        with open(os.path.join(p["kernel_dir"], "sgemm.cl")) as fh:
            source = fh.read()
        with open(os.path.join(p["kernel_dir"], "sgemm_shipped.cl")) as fh:
            shipped = fh.read()
    except OSError as exc:
        module.fail_json(msg="kernel sources: %s (the probes role installs them)" % exc)
    runner = OpenCLRunner(pick_device(module, p["device"]), source, shipped)
    return runner, (runner.describe()["compute_units"] if runner.is_cpu() else 0)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            backend=dict(type="str", required=True, choices=["opencl", "cpu"]),
            device=dict(type="str"),
            sizes=dict(type="list", elements="int", default=[1024]),
            repetitions=dict(type="int", default=5),
            sustain_seconds=dict(type="float", default=0),
            kernel=dict(type="str", default="tuned", choices=["tuned", "shipped"]),
            params=dict(type="dict"),
            tune=dict(type="bool", default=True),
            tune_budget=dict(type="int", default=60),
            tune_size=dict(type="int"),
            build_options=dict(type="list", elements="str", default=[]),
            kernel_dir=dict(type="path", default="/usr/local/share/vcafleet/probes"),
            cpu_library=dict(type="path", default="/usr/local/lib/vcafleet/libvcasgemm.so"),
            cache_path=dict(type="path", default="/var/cache/vcafleet/gemm-tuning.json"),
            sysfs_root=dict(type="path", default="/sys"),
            thermal_limit_c=dict(type="float", default=90),
            allow_no_sensor=dict(type="bool", default=False),
            seed=dict(type="int", default=20260928),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["repetitions"] < 5:
        module.fail_json(msg="repetitions must be at least 5 (the figure is a median), got %d" % p["repetitions"])
    if not p["sizes"] or min(p["sizes"]) < 1:
        module.fail_json(msg="sizes must be positive, got %s" % p["sizes"])

    runner, threads = make_runner(module)
    evidence = platform_evidence(Sysfs(p["sysfs_root"]))
    record = {"backend": p["backend"], "kernel": p["kernel"] if p["backend"] == "opencl" else "vca_sgemm",
              "device": runner.describe(), "platform": platform_label(evidence), "platform_evidence": evidence,
              "results": []}
    guard = ThermalGuard(p["sysfs_root"], p["thermal_limit_c"], platform=record["platform"],
                         allow_no_sensor=p["allow_no_sensor"])
    try:
        with guard:
            if p["backend"] == "opencl" and p["kernel"] == "tuned":
                record["params"], record["tuning"] = tiling(module, runner, max(p["sizes"]), guard)
            for n in p["sizes"]:
                a, b = random_operands(n, n, n, p["seed"])
                if p["backend"] == "cpu":
                    run, result = runner.prepare(a, b)
                elif p["kernel"] == "shipped":
                    run, result = runner.prepare_shipped(a, b)
                else:
                    run, result = runner.prepare(a, b, record["params"], p["build_options"])
                verification, timing = measure(run, result, Reference(a, b), p["repetitions"], guard=guard,
                                               expected_threads=threads, sustain_s=p["sustain_seconds"])
                record["results"].append({"n": n, "gflops": round(gflops(n, n, n, timing["median_s"]), 2),
                                          "timing": timing, "verification": verification})
    except ThermalAbort as exc:
        module.exit_json(changed=False, aborted="thermal", temperature_c=exc.temperature_c, limit_c=exc.limit_c,
                         msg=str(exc), thermal=guard.record(), platform=record["platform"])
    except NoThermalSensor as exc:
        module.fail_json(msg="%s; sysfs_root %s" % (exc, p["sysfs_root"]), thermal=guard.record(),
                         platform=record["platform"], platform_evidence=evidence)
    except VerificationFailed as exc:
        module.fail_json(msg="GEMM result is wrong, no figure reported: %s" % exc, verification=exc.verification,
                         device=record["device"], params=record.get("params"))
    record["thermal"] = guard.record()
    module.exit_json(changed=False, record=record)


if __name__ == "__main__":
    main()
