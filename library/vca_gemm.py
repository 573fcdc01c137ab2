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
  - OpenCL tiling comes from O(params) (origin C(given)), else the tuning cache (C(cache)),
    else an autotuning search (C(tuned here); random sampling plus local refinement, every
    candidate verified) at the products this run will measure, whose winner is cached per
    device, driver, size class and those products, else with O(tune=false) the class's
    default (C(default)). Size classes: C(small) up to sqrt(M*N) = 768, C(medium) up to
    1152, C(large) beyond, C(skinny), and C(narrow32) to C(narrow128) for N from 16 to 127
    beside at least 1024 rows; each class in O(sizes) and O(shapes) is tuned and cached on
    its own. A cached winner is reused only for products it was tuned on.
  - On a GPU, the wave-aware choice may run a class's 8x8-block tiling in half-height tiles
    or split over K, where the work-groups would load the compute units unevenly (C(plan.wave)).
  - OpenCL figures are timed by the kernels' own profiling events (C(timing.clock) is
    C(device events)); the host's wall time per run stays beside them (C(timing.wall_median_s)).
    The CPU SGEMM is timed by the host's wall clock (C(host wall)).
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
    description:
      - Square sizes N to measure (M = N = K). Default C([1024]) when O(shapes) is not given
        either; with O(shapes) alone, none.
    type: list
    elements: int
  shapes:
    description:
      - Rectangular products to measure besides O(sizes), each C([M, N, K]) or the string
        C(MxNxK) (A is MxK, B is KxN, C is MxN), for example C(4096x64x4096) (tall-skinny, as in
        LLM inference) or C(97x33x65). Each is verified against the float64 reference like a
        square size.
      - Sides that are not multiples of the tiling's tiles run with bounds-checked edges
        (float4 tilings, C(LMEM=2)), or are padded with zeros on the device and cut back there;
        either way every step is inside the timed run, and only the real product's FLOPs count
        (GFLOP/s = 2MNK / time). A tiny product on CPU OpenCL runs a direct kernel (one launch).
      - The tiling is chosen per size class of the output, C(small), C(medium) or C(large) by
        sqrt(M*N), C(narrow32), C(narrow64), C(narrow96) or C(narrow128) (N from 16 to 127
        beside at least 1024 rows: the tile as wide as the next of 32, 64, 96, 128 at or above
        N), or C(skinny) (one side at most 256, the other and K at least 2048), whose K is split
        over the device when the output has too few tiles (C(plan) in each result).
    type: list
    elements: raw
    default: []
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
    description:
      - Explicit tiling macros (TM, TN, TK, WPTM, WPTN, VW, LMEM, KBARRIER; optionally PF, PACK,
        DB, APAD, EDGE); no tuning. SPLITK (optional) is the host's count of K slices (1 never
        splits; absent or 0, split when the output has too few tiles for the device).
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
    description:
      - Without it (the default), each size class is tuned at the products this run measures in
        it, the largest and the smallest by FLOPs, each candidate scored by its worse figure.
      - With it, at N and N + 128 instead; the C(skinny) class on 4096x128x4096 and
        4096x256x4096, C(narrowW) on 4096xWx4096 and 4096x(W-16)x4096 (2048 on CPU OpenCL).
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
  description:
    - device, backend, kernel, platform (lab|hardware|unknown) and the platform_evidence it
      rests on, thermal guard (limit, max seen, sensor, allow_no_sensor).
    - C(tilings), per size class used, the C(params) and C(tuning) (C(origin) C(given), C(cache),
      C(default) or C(tuned here), and the products it was tuned on); C(params) and C(tuning)
      alone are those of the largest product's class.
    - Each result's C(tiling) (the class's C(params) and their C(origin)) and C(plan) (C(tile) that
      ran, C(wave) what the wave-aware choice changed, K slices, edge checks or padding).
    - C(results), one per entry of O(sizes) then O(shapes), each with C(m), C(n), C(k),
      C(shape) (C(MxNxK)), C(size_class), C(gflops), C(timing) (clock, median, spread,
      wall_median_s, cpu_per_wall, noisy) and C(verification) (max_rel_error, wrong elements,
      tolerance).
  returned: unless the probe failed
  type: dict
  contains:
    results:
      description: One entry per square size, then per shape, in the order given.
      type: list
      elements: dict
      sample: [{"m": 4096, "n": 64, "k": 4096, "shape": "4096x64x4096", "size_class": "narrow64",
                "gflops": 11030.4, "timing": {"clock": "device events"},
                "tiling": {"params": {"TM": 128, "TN": 64}, "origin": "tuned here"},
                "plan": {"tile": "128x64x16", "slices": 8, "wave": null}}]
    tilings:
      description: Per size class, the tiling used and where it came from.
      type: dict
      sample: {"small": {"params": {"TM": 32, "TN": 32}, "tuning": {"origin": "tuned here",
               "tune_shapes": ["512x512x512"]}}}
aborted:
  description: C(thermal) when the thermal guard stopped the probe; then no figure is returned.
  returned: when aborted
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.vca_autotune import (
    Tuner,
    cached_for,
    load_cache,
    products_to_tune,
    shape_text,
    size_class,
    start_params,
    store_cache,
    tune_shapes,
    tuned_key,
)
from ansible.module_utils.vca_gemm import (
    CPURunner,
    OpenCLRunner,
    Reference,
    VerificationFailed,
    gflops,
    measure,
    parse_shape,
    random_operands,
)
from ansible.module_utils.vca_sensors import platform_evidence, platform_label
from ansible.module_utils.vca_sysfs import Sysfs
from ansible.module_utils.vca_thermal import NoThermalSensor, ThermalAbort, ThermalGuard

PARAM_KEYS = ("TM", "TN", "TK", "WPTM", "WPTN", "VW", "LMEM", "KBARRIER")
# the kernel's defaults: 0, 0, 0, 4, 0; SPLITK is the host's (K slices; 0 or absent: as
# vca_gemm.split_k decides, 1: never split)
OPTIONAL_PARAM_KEYS = ("PF", "PACK", "DB", "APAD", "EDGE", "SPLITK")


def pick_device(module, want):
    import pyopencl as cl

    devices = [d for p in cl.get_platforms() for d in p.get_devices()]
    if want:
        devices = [d for d in devices if want.lower() in d.name.lower()]
    if not devices:
        module.fail_json(msg="no OpenCL device%s" % (" matching %r" % want if want else ""))
    gpus = [d for d in devices if d.type & cl.device_type.GPU]
    return (gpus or devices)[0]


def given_params(module):
    """O(params), checked: every macro the kernel needs, none it does not know."""
    p = module.params
    missing = [k for k in PARAM_KEYS if k not in p["params"]]
    unknown = sorted(set(p["params"]) - set(PARAM_KEYS) - set(OPTIONAL_PARAM_KEYS))
    if missing or unknown:
        module.fail_json(msg="; ".join(["params lacks %s" % ", ".join(missing)] * bool(missing)
                                       + ["params has unknown %s" % ", ".join(unknown)] * bool(unknown)))
    return dict((k, int(v)) for k, v in p["params"].items())


def tiling(module, runner, cls, products, guard):
    """The tiling for one size class and where it came from: (params, tuning record with its origin).
    products: the class's (M, N, K) in this run, which the search tunes at (or O(tune_size))."""
    p = module.params
    if p["params"]:
        return given_params(module), {"origin": "given"}
    device = runner.describe()
    shapes = (tune_shapes(cls, runner.is_cpu(), p["tune_size"]) if p["tune_size"]
              else products_to_tune(products))
    key, cached = cached_for(load_cache(p["cache_path"]), device, cls, shapes)
    if cached:
        return cached["params"], {"origin": "cache", "key": key, "gflops_when_tuned": cached.get("gflops"),
                                  "tune_shapes": cached.get("tune_shapes")}
    start = start_params(runner.is_cpu(), cls)
    if not p["tune"]:
        return start, {"origin": "default"}
    # every candidate scored by its worse figure over the products it will run (or O(tune_size)
    # and the size above it): tuned at 1024, the large class ran slower than untuned (issue 42)
    problems_ = []
    for i, (tm, tn, tk) in enumerate(shapes):
        a, b = random_operands(tm, tn, tk, p["seed"] + 1 + i)
        problems_.append(((tm, tn, tk), a, b, Reference(a, b)))
    limits = {"max_work_group_size": device["max_work_group_size"], "local_mem_bytes": device["local_mem_bytes"]}

    def evaluate(params):
        scores = []
        for (tm, tn, tk), a, b, ref in problems_:
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
            scores.append(gflops(tm, tn, tk, t["median_s"]))
        return min(scores)

    tuner = Tuner(evaluate, limits, min(min(shape[0], shape[2]) for shape in shapes), budget=p["tune_budget"],
                  seed=p["seed"])
    score, best = tuner.run(start=start)
    if best is None:
        module.fail_json(msg="autotuning found no tiling that verifies on %s" % device["name"],
                         trials=len(tuner.trials))
    key = tuned_key(device, cls, shapes)
    store_cache(p["cache_path"], key, {"params": best, "gflops": score, "tune_shapes": [shape_text(s) for s in shapes]})
    return best, {"origin": "tuned here", "key": key, "trials": len(tuner.trials),
                  "tune_shapes": [shape_text(s) for s in shapes],
                  "verified_candidates": sum(1 for _, s in tuner.trials if s is not None), "gflops_at_tune_size": score}


def class_tilings(module, runner, todo, guard):
    """{class: {"params", "tuning"}} for every size class among the products to run."""
    by_class = {}
    for m, n, k in todo:
        by_class.setdefault(size_class(m, n, k), []).append((m, n, k))
    out = {}
    for cls, products in by_class.items():
        params, tuning = tiling(module, runner, cls, products, guard)
        out[cls] = {"params": params, "tuning": tuning}
    return out


def problems(module):
    """(M, N, K) for every square size, then every shape; fails on a malformed or non-positive one."""
    p = module.params
    sizes = p["sizes"] if p["sizes"] is not None else ([] if p["shapes"] else [1024])
    out = [(n, n, n) for n in sizes]
    for shape in p["shapes"]:
        try:
            out.append(parse_shape(shape))
        except ValueError as exc:
            module.fail_json(msg=str(exc))
    if not out or min(min(d) for d in out) < 1:
        module.fail_json(msg="sizes and shapes must be positive and not both empty, got sizes %s, shapes %s"
                         % (p["sizes"], p["shapes"]))
    return out


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
            sizes=dict(type="list", elements="int"),
            shapes=dict(type="list", elements="raw", default=[]),
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
    todo = problems(module)

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
                record["tilings"] = class_tilings(module, runner, todo, guard)
                largest = max(todo, key=lambda d: d[0] * d[1] * d[2])
                record["params"] = record["tilings"][size_class(*largest)]["params"]
                record["tuning"] = record["tilings"][size_class(*largest)]["tuning"]
            for m, n, k in todo:
                a, b = random_operands(m, n, k, p["seed"])
                cls = size_class(m, n, k)
                if p["backend"] == "cpu":
                    run, result = runner.prepare(a, b)
                elif p["kernel"] == "shipped":
                    run, result = runner.prepare_shipped(a, b)
                else:
                    run, result = runner.prepare(a, b, record["tilings"][cls]["params"], p["build_options"])
                verification, timing = measure(run, result, Reference(a, b), p["repetitions"], guard=guard,
                                               expected_threads=threads, sustain_s=p["sustain_seconds"])
                entry = {"m": m, "n": n, "k": k, "shape": "%dx%dx%d" % (m, n, k), "size_class": cls,
                         "gflops": round(gflops(m, n, k, timing["median_s"]), 2),
                         "timing": timing, "verification": verification}
                if p["backend"] == "opencl":
                    entry["plan"] = runner.last_plan   # direct or tiled, K slices, edge checks or padding
                if p["backend"] == "opencl" and p["kernel"] == "tuned":
                    # the tiling that ran and its origin; plan.tile and plan.wave say what the
                    # wave-aware choice made of it on a GPU
                    entry["tiling"] = {"params": record["tilings"][cls]["params"],
                                       "origin": record["tilings"][cls]["tuning"]["origin"]}
                record["results"].append(entry)
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
