#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The autotuned vcafleet SGEMM against the best BLAS on the same device, in one run.

  CPU OpenCL (PoCL):  against CLBlast after its own tuner on that device, and NumPy's OpenBLAS
  NVIDIA GPU:         through NVIDIA's OpenCL, against cuBLAS SGEMM (torch float32, TF32 off)

Prints GFLOP/s per N with the ratios, and the shipped-kernel reproduction for
the before/after figure. Every figure is verified against a float64 reference
(on a sample of rows for large N); a figure that fails is printed as FAILED.

Timing: ours (and the shipped kernel) by OpenCL profiling events, cuBLAS by CUDA
events, at every N: kernels against kernels. The host's wall time per call (launch
and wait included) is the second, labelled column ("wall"). OpenBLAS and CLBlast
are timed by the host's wall clock (they have no device events here).

Sustained (issue 31): besides the one-call figure, each product runs in bursts of
back-to-back calls (--burst calls, more if needed to last --burst-min-s), sides
alternating, --trials bursts a side; the figure is the median trial, by device events
over the whole burst, with the SM clock (min/median/max), mean power, throttle reasons
(NVML, sampled every 20 ms) and the energy from NVML's total-energy counter, as GFLOP/J.

Nothing is padded on the host: float4 tilings bound-check the edges (EDGE), others pad
on the device inside the timed run; skinny outputs split K over the device. Only the real
product's 2MNK FLOPs count, on both sides.

The tiling is tuned once per size class (small, medium, large by sqrt(M*N), skinny for
tall-skinny outputs over a long K; vca_autotune.size_class), each candidate scored by its
worse figure over the class's two tuning products (vca_autotune.tune_shapes), so a tiling
that only suits one size does not win; each N or shape then runs its class's winner.

  bench/gemm_ratio.py                        # PoCL, N = 512 1024 2048 4096
  bench/gemm_ratio.py --device NVIDIA --json out.json      # N = 512 ... 8192
  bench/gemm_ratio.py --sweep                # the cliff check: N = 256..4096 step 128, tuned per class
  bench/gemm_ratio.py --shapes 4096x64x4096 97x33x65       # M x N x K, against OpenBLAS/cuBLAS
  bench/gemm_ratio.py --variants '[{"TM": 128, ...}, ...]'  # fixed tilings side by side (levers)
  bench/gemm_ratio.py --device NVIDIA --burst 20 --trials 5  # sustained figures with clocks and energy
  bench/gemm_ratio.py --cpu-sgemm --threads 2               # the nodes' CPU path against OpenBLAS
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "module_utils"))
import vca_autotune
import vca_gemm

KERNELS = ROOT / "roles" / "probes" / "files"
SAMPLE_ROWS = 96


# Seconds to wait after a float64 reference on a CPU OpenCL device: NumPy's OpenBLAS threads
# spin for a while after a product, on the cores PoCL is about to be timed on.
SETTLE_S = {"s": 0.0}


def reference_for(a, b, rng):
    """Full float64 reference up to N = 2048; a row sample beyond (the check stays random-data)."""
    if a.shape[0] <= 2048:
        rows, ref = np.arange(a.shape[0]), vca_gemm.Reference(a, b)
    else:
        rows = np.sort(rng.choice(a.shape[0], SAMPLE_ROWS, replace=False))
        ref = vca_gemm.Reference(a[rows], b)
    time.sleep(SETTLE_S["s"])
    return rows, ref


def timed(run, result, rows, ref, reps):
    """(device median s or None, wall median s, verified, max error). run() returns its
    device seconds (OpenCL or CUDA events) or None (host-only BLAS)."""
    run()
    check = ref.verify(np.asarray(result())[rows])
    samples, device = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        dev = run()
        samples.append(time.perf_counter() - t0)
        if dev is not None:
            device.append(dev)
    last = ref.verify(np.asarray(result())[rows])
    ok = check["passed"] and last["passed"]
    return (float(np.median(device)) if device else None, float(np.median(samples)), ok,
            max(check["max_rel_error"], last["max_rel_error"]))


def best_seconds(t):
    """The figure's time: the device's where it has events, else the wall's."""
    return t[0] if t[0] is not None else t[1]


def find_device(want):
    import pyopencl as cl

    devices = [(pi, di, d) for pi, p in enumerate(cl.get_platforms()) for di, d in enumerate(p.get_devices())]
    for pi, di, d in devices:
        if want.lower() in (d.name + " " + d.platform.name).lower():
            return pi, di, d
    sys.exit("no OpenCL device matching %r among: %s" % (want, ", ".join(d.name for _, _, d in devices)))


def tune_ours(runner, cls, budget, seed):
    """Tune for one size class: each candidate's score is its worse GFLOP/s of the class's
    two tuning products (vca_autotune.tune_shapes: n and n + 128, or the skinny shapes),
    every run verified."""
    device = runner.describe()
    shapes = vca_autotune.tune_shapes(cls, runner.is_cpu())
    problems = []
    for m, n, k in shapes:
        a, b = vca_gemm.random_operands(m, n, k, seed + m + n + k)
        rows, ref = reference_for(a, b, np.random.default_rng(seed + m + n + k))
        problems.append(((m, n, k), a, b, rows, ref))
    limits = {"max_work_group_size": device["max_work_group_size"], "local_mem_bytes": device["local_mem_bytes"]}

    def evaluate(params):
        scores = []
        for (m, n, k), a, b, rows, ref in problems:
            try:
                run, result = runner.prepare(a, b, params)
                t = timed(run, result, rows, ref, 2)
            except Exception:  # a tiling the compiler or the device refuses is no candidate
                return None
            if not t[2]:
                return None
            scores.append(vca_gemm.gflops(m, n, k, best_seconds(t)))
        return min(scores)

    tuner = vca_autotune.Tuner(evaluate, limits, min(min(s[0], s[2]) for s in shapes), budget=budget, seed=seed)
    score, params = tuner.run(start=vca_autotune.start_params(runner.is_cpu(), cls))
    return params, score, len(tuner.trials)


CLBLAST_TUNED = {}


def clblast_tuned(platform_index, device_index, n, workdir):
    """Run CLBlast's own Xgemm tuner on this device (once per size); return its best parameters (or None)."""
    if n in CLBLAST_TUNED:
        return CLBLAST_TUNED[n]
    CLBLAST_TUNED[n] = _clblast_tune(platform_index, device_index, n, workdir)
    return CLBLAST_TUNED[n]


def _clblast_tune(platform_index, device_index, n, workdir):
    tuner = "clblast_tuner_xgemm"
    cmd = [tuner, "-platform", str(platform_index), "-device", str(device_index), "-precision", "32",
           "-m", str(n), "-n", str(n), "-k", str(n), "-fraction", os.environ.get("CLBLAST_TUNE_FRACTION", "0.25")]
    try:
        subprocess.run(cmd, cwd=workdir, check=True, capture_output=True, timeout=3600)
    except (OSError, subprocess.SubprocessError) as exc:
        print("  (CLBlast tuner unavailable or failed: %s)" % exc, file=sys.stderr)
        return None
    return best_tuning(glob.glob(os.path.join(workdir, "clblast_xgemm_*_32.json")))


def best_tuning(paths):
    """The fastest parameter set in CLBlast tuner result files (or None)."""
    best = None
    for path in paths:
        data = json.load(open(path))
        for res in data.get("results", []):
            if best is None or res["time"] < best["time"]:
                best = res
    if best is None:
        return None
    params = best["parameters"]
    if isinstance(params, dict):                 # CLBlast 1.5 writes a mapping, older ones a list
        return {k: int(v) for k, v in params.items() if k != "PRECISION"}
    return {p["name"]: int(p["value"]) for p in params if p["name"] != "PRECISION"}


def run_clblast(queue, a, b, params, device):
    import pyclblast
    import pyopencl.array as cla

    if params:
        pyclblast.override_parameters(device, "Xgemm", 32, params)
    da, db = cla.to_device(queue, a), cla.to_device(queue, b)
    dc = cla.zeros(queue, (a.shape[0], b.shape[1]), np.float32)

    def run(calls=1):
        for _ in range(calls):
            pyclblast.gemm(queue, a.shape[0], b.shape[1], a.shape[1], da, db, dc, a_ld=a.shape[1],
                           b_ld=b.shape[1], c_ld=b.shape[1])
        queue.finish()

    return run, dc.get


def run_cublas(a, b):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = {"c": torch.empty((a.shape[0], b.shape[1]), dtype=torch.float32, device="cuda")}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    sleep = getattr(torch.cuda, "_sleep", None)

    def run(calls=1):
        """calls products back to back; returns their CUDA-event seconds: the kernels', as
        ours by OpenCL events. A spin kernel first keeps the GPU busy while the host queues
        the start event, the products and the end event, so the events do not count torch's
        launch latency (an idle GPU reaches the start event before the product is even launched)."""
        if sleep is not None:
            sleep(200000)      # ~0.1 ms at 1.98 GHz
        start.record()
        for _ in range(calls):
            torch.matmul(ta, tb, out=out["c"])
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3

    return run, (lambda: out["c"].cpu().numpy())


def run_numpy(a, b):
    out = {}

    def run(calls=1):
        for _ in range(calls):
            out["c"] = a @ b

    return run, (lambda: out["c"])


def sweep(runner, tiling_for, seed, reps, *, first=256, last=4096, step=128):
    """GFLOP/s (device events) of each N's tiling (tiling_for(n)) for every N in first..last:
    a size more than 25% below the mean of its two neighbours is a cliff (the shipped
    kernel fell to 27 at multiples of 384 on the P580)."""
    figures = {}

    def measure_n(n):
        a, b = vca_gemm.random_operands(n, n, n, seed + n)
        rows, ref = reference_for(a, b, np.random.default_rng(n))
        run, result = runner.prepare(a, b, tiling_for(n))
        t = timed(run, result, rows, ref, reps)
        return vca_gemm.gflops(n, n, n, best_seconds(t)) if t[2] else None

    def find_cliffs():
        sizes = sorted(figures)
        return [sizes[i] for i in range(1, len(sizes) - 1)
                if figures[sizes[i]] is None
                or figures[sizes[i]] < 0.75 * ((figures[sizes[i - 1]] or 0) + (figures[sizes[i + 1]] or 0)) / 2]

    for n in range(first, last + 1, step):
        figures[n] = measure_n(n)
        print("  N=%5d %8.1f%s  (%s)" % (n, figures[n] or 0, "" if figures[n] else " FAILED",
                                         vca_autotune.size_class(n)), flush=True)
    # A shared machine's noise can fake a dip: a cliff must show again when the size and
    # its neighbours are measured a second time (each keeps its better figure).
    suspects = find_cliffs()
    for n in sorted({m for c in suspects for m in (c - step, c, c + step)}):
        again = measure_n(n)
        print("  N=%5d %8.1f (again, was %.1f)" % (n, again or 0, figures[n] or 0), flush=True)
        figures[n] = max(f for f in (figures[n], again) if f is not None) if (figures[n] or again) else None
    cliffs = find_cliffs()
    print("cliffs (more than 25%% below the neighbours' mean, twice): %s" % (cliffs or "none"))
    return figures, cliffs


def figure(entry, key):
    return "%8.1f" % entry[key]["gflops"] if entry[key]["gflops"] else "  FAILED"


def json_arg(text):
    """JSON on the command line, or @FILE for JSON in a file."""
    return json.loads(Path(text[1:]).read_text() if text.startswith("@") else text)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="Portable Computing Language", help="OpenCL device (name substring)")
    ap.add_argument("--sizes", type=int, nargs="*",
                    help="square N (default PoCL 512..4096, GPU 512..8192; none: --shapes alone)")
    ap.add_argument("--shapes", type=vca_gemm.parse_shape, nargs="+", metavar="MxNxK", default=[],
                    help="rectangular products, e.g. 4096x64x4096 (A is MxK, B is KxN)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget", type=int, default=60, help="autotuning trials per size class")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-clblast-tune", action="store_true", help="CLBlast with its stock parameters")
    ap.add_argument("--no-clblast", action="store_true", help="leave CLBlast out (PoCL)")
    ap.add_argument("--no-shipped", action="store_true", help="leave the shipped-kernel reproduction out")
    ap.add_argument("--json", help="write every figure here too")
    ap.add_argument("--sweep", action="store_true", help="tune per class, then check N = 256..4096 for cliffs")
    ap.add_argument("--clblast-tuning", nargs="+", metavar="JSON",
                    help="result files of an earlier clblast_tuner_xgemm run on this device: its best, not a new run")
    ap.add_argument("--params", type=json_arg, help='a fixed tiling instead of tuning, e.g. \'{"TM": 128, ...}\'')
    ap.add_argument("--tilings", metavar="JSON",
                    help="an earlier run's --json output: its tuned tilings per class, not a new search")
    ap.add_argument("--variants", type=json_arg,
                    help="a JSON list (or @FILE) of fixed tilings, each run at every size and shape (no tuning or "
                         "baselines)")
    ap.add_argument("--burst", type=int, default=20, help="calls per sustained burst (0: no sustained figures)")
    ap.add_argument("--burst-min-s", type=float, default=0.25,
                    help="more calls per burst where --burst would end sooner (the energy counter's resolution)")
    ap.add_argument("--trials", type=int, default=5, help="sustained bursts per side, alternating; the median")
    ap.add_argument("--cpu-sgemm", action="store_true",
                    help="the CPU path: vca_sgemm.c (the probes role's flags) against NumPy's OpenBLAS, no OpenCL")
    ap.add_argument("--threads", type=int, help="--cpu-sgemm: threads (and cores) for both sides (default all)")
    ap.add_argument("--cpu-side", choices=["ours", "openblas"], help=argparse.SUPPRESS)
    ap.add_argument("--cpu-side-lib", help=argparse.SUPPRESS)
    return ap.parse_args()


class Tilings(object):
    """The fixed --params, or each size class's tuned winner (tuned once per class in a run)."""

    def __init__(self, args, runner):
        self.args, self.runner, self.won = args, runner, {}
        if args.tilings:
            self.won = dict(json.loads(Path(args.tilings).read_text())["tilings"])

    def __call__(self, m, n=None, k=None):
        if self.args.params:
            return self.args.params
        cls = vca_autotune.size_class(m, n, k)
        if cls not in self.won:
            t0 = time.perf_counter()
            params, score, trials = tune_ours(self.runner, cls, self.args.budget, self.args.seed)
            self.won[cls] = params
            print("tuned %s: %s, %.1f GFLOP/s (worse of the two tuning sizes) after %d trials, %.0f s"
                  % (cls, params, score or 0, trials, time.perf_counter() - t0), flush=True)
        return self.won[cls]


def clblast_params(args, pi, di, n, workdir):
    """CLBlast's tuned parameters: from earlier tuner files, a new tuner run, or None (stock)."""
    if args.clblast_tuning:
        return best_tuning(args.clblast_tuning)
    return None if args.no_clblast_tune else clblast_tuned(pi, di, min(n, 1024), workdir)


def measure_contenders(contenders, shape, check, reps):
    m, n, k = shape
    rows, ref = check
    entry = {}
    for name, (run, result) in contenders.items():
        t = timed(run, result, rows, ref, reps)
        entry[name] = {"gflops": vca_gemm.gflops(m, n, k, best_seconds(t)) if t[2] else None,
                       "clock": "device events" if t[0] is not None else "host wall",
                       "wall_gflops": vca_gemm.gflops(m, n, k, t[1]) if t[2] else None,
                       "max_rel_error": t[3]}
    return entry


def print_entry(label, entry, params):
    base = [k for k in ("clblast", "openblas", "cublas") if k in entry]
    ratios = "  ".join("ours/%s %.2f" % (k, entry["ours"]["gflops"] / entry[k]["gflops"])
                       for k in base if entry["ours"]["gflops"] and entry[k]["gflops"])
    walls = "  ".join("%s %.1f" % (k, entry[k]["wall_gflops"] or 0) for k in ["ours", *base])
    print("%s  ours %s  %s  %s  | wall: %s | params %s" % (
        label, figure(entry, "ours"),
        "  ".join("%s %s" % (k, figure(entry, k)) for k in base + (["shipped"] if "shipped" in entry else [])),
        ratios, walls, params), flush=True)


def variants(args, runner, sizes):
    """Each fixed tiling of --variants at each size and shape, event-timed: the levers side by side."""
    out = []
    for m, n, k in [(n, n, n) for n in sizes] + list(args.shapes):
        a, b = vca_gemm.random_operands(m, n, k, args.seed + m + n + k)
        rows, ref = reference_for(a, b, np.random.default_rng(m + n + k))
        if not runner.is_cpu():          # the baseline beside the levers: cuBLAS, one call, events
            t = timed(*run_cublas(a, b), rows, ref, args.reps)
            g = vca_gemm.gflops(m, n, k, best_seconds(t)) if t[2] else None
            out.append({"m": m, "n": n, "k": k, "params": "cublas", "gflops": g})
            print("%-14s %8.1f%s  cuBLAS" % ("%dx%dx%d" % (m, n, k), g or 0, "" if g else " FAILED"), flush=True)
        for params in args.variants:
            plan = None
            try:
                t = timed(*runner.prepare(a, b, params), rows, ref, args.reps)
                plan = runner.last_plan
                g = vca_gemm.gflops(m, n, k, best_seconds(t)) if t[2] else None
            except Exception as exc:  # a variant the device refuses
                g = None
                print("  (%s: %s)" % (params, str(exc).splitlines()[0] if str(exc) else exc))
            out.append({"m": m, "n": n, "k": k, "params": params, "gflops": g, "plan": plan})
            print("%-14s %8.1f%s  %s  %s" % ("%dx%dx%d" % (m, n, k), g or 0, "" if g else " FAILED", params,
                                             plan and {x: plan[x] for x in ("slices", "edge", "padded")}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": runner.describe(), "variants": out}, indent=1))


def nvml_telemetry():
    """(read, energy_j) over NVML for GPU 0 (the one GPU of the machine), or None without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:  # no NVML here: sustained figures without clocks and energy
        print("  (NVML unavailable: %s)" % exc, file=sys.stderr)
        return None
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def read():
        return {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0, "throttle": reasons(h)}

    def energy_j():
        return pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0    # mJ since the driver loaded

    try:
        read(), energy_j()
    except Exception as exc:
        print("  (NVML read failed: %s)" % exc, file=sys.stderr)
        return None
    return read, energy_j


def burst_calls(args, single_s):
    """Calls per burst: --burst, or more where that would end before --burst-min-s."""
    return int(min(max(args.burst, math.ceil(args.burst_min_s / max(single_s, 1e-9))), 20000))


def sustained(contenders, shape, calls, trials, telemetry):
    """Each side's median burst of calls back-to-back products (sides alternating, one
    unrecorded warm-up burst each), with clocks, power, throttle reasons and energy."""
    m, n, k = shape
    flops = 2.0 * m * n * k * calls
    names = list(contenders)
    for name in names:
        contenders[name][0](calls)
    per = {name: [] for name in names}
    for trial in range(trials):
        for name in (names if trial % 2 == 0 else names[::-1]):
            run = contenders[name][0]
            if telemetry:
                with vca_gemm.Telemetry(*telemetry) as t:
                    t0 = time.perf_counter()
                    dev = run(calls)
                    wall = time.perf_counter() - t0
                per[name].append(vca_gemm.burst_figures(flops, dev if dev is not None else wall, t.samples,
                                                        t.energy_delta_j))
            else:
                t0 = time.perf_counter()
                dev = run(calls)
                wall = time.perf_counter() - t0
                per[name].append(vca_gemm.burst_figures(flops, dev if dev is not None else wall))
            per[name][-1]["clock"] = "device events" if dev is not None else "host wall"
    return {name: dict(vca_gemm.median_burst(per[name]), calls=calls, trials=trials) for name in names}


def print_sustained(entry):
    s = entry["sustained"]
    parts = []
    for name, f in s.items():
        extra = []
        if "sm_mhz" in f:
            extra.append("SM %d-%d MHz" % (f["sm_mhz"]["min"], f["sm_mhz"]["max"]))
        if "power_w" in f:
            extra.append("%.0f W" % f["power_w"])
        if "gflop_per_j" in f:
            extra.append("%.1f GFLOP/J (%s)" % (f["gflop_per_j"], f["energy_source"]))
        if f.get("throttle"):
            extra.append("throttle " + "+".join(f["throttle"]))
        parts.append("%s %.1f [%s]" % (name, f["gflops"], ", ".join(extra)))
    base = [k for k in ("cublas", "openblas", "clblast") if k in s]
    ratio = "  ".join("ours/%s %.2f" % (b, s["ours"]["gflops"] / s[b]["gflops"]) for b in base)
    print("   sustained (%d calls a burst, median of %d): %s  %s" % (
        s["ours"]["calls"], s["ours"]["trials"], "  ".join(parts), ratio), flush=True)


def add_sustained(args, entry, contenders, check, telemetry):
    """The sustained figures of one product into entry (ours verified again after the bursts)."""
    m, n, k = entry["m"], entry["n"], entry["k"]
    rows, ref = check
    sides = {x: c for x, c in contenders.items() if x != "shipped"}
    single = min(2.0 * m * n * k / (entry[x]["gflops"] * 1e9) for x in sides)
    entry["sustained"] = sustained(sides, (m, n, k), burst_calls(args, single), args.trials, telemetry)
    entry["sustained_verified"] = bool(ref.verify(np.asarray(contenders["ours"][1]())[rows])["passed"])
    if not entry["sustained_verified"]:
        entry["sustained"]["ours"]["gflops"] = None
        print("   sustained: ours FAILED verification after the bursts", flush=True)
    else:
        print_sustained(entry)


# The seed's CPU figure for one VCA node (Xeon E3 on the card, the 22.04 image): a reference
# beside this machine's figures, never a target they meet or miss.
SEED_NODE_CPU_GFLOPS = 71


def probes_cflags():
    """The flags the probes role compiles vca_sgemm.c with (roles/probes/defaults/main.yml)."""
    import yaml

    return yaml.safe_load((ROOT / "roles" / "probes" / "defaults" / "main.yml").read_text())["probes_cflags"]


def cpu_side(args):
    """Child of --cpu-sgemm: one side (ours: vca_sgemm.c through ctypes; openblas: NumPy's @) at
    each size, with the threads and cores its parent gave it; one JSON line per size."""
    runner = vca_gemm.CPURunner(args.cpu_side_lib) if args.cpu_side == "ours" else None
    for n in args.sizes:
        a, b = vca_gemm.random_operands(n, n, n, args.seed + n)
        rows, ref = reference_for(a, b, np.random.default_rng(n))
        run, result = runner.prepare(a, b) if runner else run_numpy(a, b)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        t = timed(run, result, rows, ref, args.reps)
        # CPU seconds per wall second over the runs: well under the thread count means the
        # cores were shared with something else (the figure is then the machine's load's too)
        cpu_per_wall = (time.process_time() - cpu0) / (time.perf_counter() - wall0)
        print(json.dumps({"n": n, "gflops": vca_gemm.gflops(n, n, n, t[1]) if t[2] else None,
                          "max_rel_error": t[3], "cpu_per_wall": cpu_per_wall,
                          "threads": runner.threads() if runner else None}), flush=True)


def cpu_sgemm(args):
    """vca_sgemm.c, compiled as the probes role compiles it, against NumPy's OpenBLAS: each side
    in a child process confined to the same cores (sched_setaffinity) with the same thread count
    (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS), sides alternating, every result verified."""
    cores = sorted(os.sched_getaffinity(0))[: args.threads or None]
    workdir = tempfile.mkdtemp(prefix="vca-sgemm-")
    lib = os.path.join(workdir, "libvcasgemm.so")
    cmd = ["cc", *probes_cflags(), "-o", lib, str(KERNELS / "vca_sgemm.c")]
    subprocess.run(cmd, check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(len(cores)), OPENBLAS_NUM_THREADS=str(len(cores)))
    sizes = args.sizes if args.sizes else [512, 1024, 2048, 4096]
    print("platform: this machine (%s, %d cores %s of %d, nice %d, load average %.2f), not a VCA node; %s"
          % (os.uname().machine, len(cores), cores, os.cpu_count(), os.nice(0), os.getloadavg()[0],
             " ".join(cmd[:-3])))
    print("both sides: %d threads on those cores, host wall clock, median of %d after one warm-up"
          % (len(cores), args.reps))
    rows = []
    for i, n in enumerate(sizes):
        entry = {"n": n}
        for side in (("ours", "openblas") if i % 2 == 0 else ("openblas", "ours")):
            out = subprocess.run([sys.executable, __file__, "--cpu-side", side, "--cpu-side-lib", lib,
                                  "--sizes", str(n), "--reps", str(args.reps), "--seed", str(args.seed)],
                                 env=env, preexec_fn=lambda: os.sched_setaffinity(0, cores),
                                 check=True, capture_output=True, text=True).stdout
            entry[side] = json.loads(out.strip().splitlines()[-1])
        ours, blas = entry["ours"]["gflops"], entry["openblas"]["gflops"]
        entry["ratio"] = ours / blas if ours and blas else None
        # GFLOP per CPU-second: on a shared machine each side's rate over the CPU it got, the
        # steadier comparison there (spinning threads count against the side that spins)
        per_cpu = [entry[x]["gflops"] / entry[x]["cpu_per_wall"] if entry[x]["gflops"] else None
                   for x in ("ours", "openblas")]
        entry["ratio_per_cpu_s"] = per_cpu[0] / per_cpu[1] if all(per_cpu) else None
        print("N=%5d  vca_sgemm %7.1f  OpenBLAS %7.1f  ratio %s  | CPU/wall %.2f / %.2f, GFLOP per CPU-s %.1f / %.1f,"
              " ratio %.2f  (seed, one VCA node: ~%d GFLOP/s, a reference)"
              % (n, ours or 0, blas or 0, "%.2f" % entry["ratio"] if entry["ratio"] else "FAILED",
                 entry["ours"]["cpu_per_wall"], entry["openblas"]["cpu_per_wall"], per_cpu[0] or 0, per_cpu[1] or 0,
                 entry["ratio_per_cpu_s"] or 0, SEED_NODE_CPU_GFLOPS), flush=True)
        rows.append(entry)
    if args.json:
        Path(args.json).write_text(json.dumps({"cores": cores, "cflags": probes_cflags(), "results": rows,
                                               "load_average_end": os.getloadavg()[0],
                                               "seed_node_cpu_gflops": SEED_NODE_CPU_GFLOPS}, indent=1))


def main():
    args = parse_args()
    if args.cpu_side:
        cpu_side(args)
        return
    if args.cpu_sgemm:
        cpu_sgemm(args)
        return

    pi, di, device = find_device(args.device)
    runner = vca_gemm.OpenCLRunner(device, (KERNELS / "sgemm.cl").read_text(),
                                   (KERNELS / "sgemm_shipped.cl").read_text())
    is_cpu = runner.is_cpu()
    SETTLE_S["s"] = 0.5 if is_cpu else 0.0
    sizes = args.sizes if args.sizes is not None else (
        [512, 1024, 2048, 4096] if is_cpu else [512, 1024, 2048, 4096, 8192])
    print("device: %(name)s | %(platform)s | driver %(driver)s | %(compute_units)d CUs" % runner.describe())
    print("timing: ours by OpenCL profiling events; %s; 'wall' = host wall time per call" %
          ("OpenBLAS and CLBlast by the host's wall clock" if is_cpu else "cuBLAS by CUDA events"))
    tilings = Tilings(args, runner)
    if args.variants:
        variants(args, runner, sizes)
        return
    if args.sweep:
        figures, cliffs = sweep(runner, tilings, args.seed, args.reps)
        if args.json:
            Path(args.json).write_text(json.dumps({"device": runner.describe(), "tilings": tilings.won,
                                                   "params": args.params, "sweep": figures, "cliffs": cliffs},
                                                  indent=1))
        return
    rows_out = []
    workdir = tempfile.mkdtemp(prefix="clblast-tune-")
    telemetry = None if is_cpu or not args.burst else nvml_telemetry()
    problems = [(n, n, n) for n in sizes] + list(args.shapes)
    for m, n, k in problems:
        square = m == n == k
        a, b = vca_gemm.random_operands(m, n, k, args.seed + m + 3 * n + 7 * k)
        rows, ref = reference_for(a, b, np.random.default_rng(m + n + k))
        params = tilings(m, n, k)
        contenders = {"ours": runner.prepare(a, b, params)}
        plan = runner.last_plan
        if square and not args.no_shipped and n <= (2048 if is_cpu else 4096):   # PoCL: minutes at 4096
            contenders["shipped"] = runner.prepare_shipped(a, b)
        if is_cpu:
            if not args.no_clblast:
                cl_params = clblast_params(args, pi, di, max(m, n, k), workdir)
                contenders["clblast"] = run_clblast(runner.queue, a, b, cl_params, device)
            contenders["openblas"] = run_numpy(a, b)
        else:
            contenders["cublas"] = run_cublas(a, b)
        entry = {"m": m, "n": n, "k": k, "size_class": vca_autotune.size_class(m, n, k), "ours_params": params,
                 "plan": plan}
        entry.update(measure_contenders(contenders, (m, n, k), (rows, ref), args.reps))
        label = "N=%5d" % n if square else "%dx%dx%d" % (m, n, k)
        print_entry(label, entry, dict(params, **{"plan": {x: plan[x] for x in ("path", "slices", "edge")}}))
        if args.burst and all(entry[x]["gflops"] for x in contenders if x != "shipped"):
            add_sustained(args, entry, contenders, (rows, ref), telemetry)
        rows_out.append(entry)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": runner.describe(), "tilings": tilings.won,
                                               "burst": {"calls_min": args.burst, "min_s": args.burst_min_s,
                                                         "trials": args.trials},
                                               "results": rows_out}, indent=1))


if __name__ == "__main__":
    main()
