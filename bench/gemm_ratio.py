#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The autotuned vcafleet SGEMM against the best BLAS on the same device, in one run.

  CPU OpenCL (PoCL):  against CLBlast after its own tuner on that device, and NumPy's OpenBLAS
  NVIDIA GPU:         through NVIDIA's OpenCL, against cuBLAS SGEMM (torch float32, TF32 off)

Prints GFLOP/s per N with the ratios, and the shipped-kernel reproduction for
the before/after figure. Every figure is verified against a float64 reference
(on a sample of rows for large N); a figure that fails is printed as FAILED.

  bench/gemm_ratio.py                        # PoCL, N = 512 1024 2048 4096
  bench/gemm_ratio.py --device NVIDIA --sizes 1024 2048 4096 8192 --json out.json
  bench/gemm_ratio.py --sweep                # the cliff check: N = 256..4096 step 128
"""

from __future__ import annotations

import argparse
import glob
import json
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


def reference_for(a, b, rng):
    """Full float64 reference up to N = 2048; a row sample beyond (the check stays random-data)."""
    if a.shape[0] <= 2048:
        return np.arange(a.shape[0]), vca_gemm.Reference(a, b)
    rows = np.sort(rng.choice(a.shape[0], SAMPLE_ROWS, replace=False))
    return rows, vca_gemm.Reference(a[rows], b)


def timed(run, result, rows, ref, reps):
    run()
    check = ref.verify(np.asarray(result())[rows])
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        samples.append(time.perf_counter() - t0)
    last = ref.verify(np.asarray(result())[rows])
    ok = check["passed"] and last["passed"]
    return float(np.median(samples)), ok, max(check["max_rel_error"], last["max_rel_error"])


def find_device(want):
    import pyopencl as cl

    devices = [(pi, di, d) for pi, p in enumerate(cl.get_platforms()) for di, d in enumerate(p.get_devices())]
    for pi, di, d in devices:
        if want.lower() in (d.name + " " + d.platform.name).lower():
            return pi, di, d
    sys.exit("no OpenCL device matching %r among: %s" % (want, ", ".join(d.name for _, _, d in devices)))


def tune_ours(runner, n, budget, seed):
    device = runner.describe()
    a, b = vca_gemm.random_operands(n, n, n, seed)
    rows, ref = reference_for(a, b, np.random.default_rng(seed))
    limits = {"max_work_group_size": device["max_work_group_size"], "local_mem_bytes": device["local_mem_bytes"]}

    def evaluate(params):
        try:
            run, result = runner.prepare(a, b, params)
            t, ok, _ = timed(run, result, rows, ref, 2)
        except Exception:  # a tiling the compiler or the device refuses is no candidate
            return None
        return vca_gemm.gflops(n, n, n, t) if ok else None

    tuner = vca_autotune.Tuner(evaluate, limits, n, budget=budget, seed=seed)
    score, params = tuner.run(start=vca_autotune.START_PARAMS["cpu" if runner.is_cpu() else "gpu"])
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

    def run():
        pyclblast.gemm(queue, a.shape[0], b.shape[1], a.shape[1], da, db, dc, a_ld=a.shape[1], b_ld=b.shape[1],
                       c_ld=b.shape[1])
        queue.finish()

    return run, dc.get


def run_cublas(a, b):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ta, tb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
    out = {}

    def run():
        out["c"] = ta @ tb
        torch.cuda.synchronize()

    return run, (lambda: out["c"].cpu().numpy())


def run_numpy(a, b):
    out = {}

    def run():
        out["c"] = a @ b

    return run, (lambda: out["c"])


def sweep(runner, params, seed, reps, *, first=256, last=4096, step=128):
    """GFLOP/s of one tiling for every N in first..last: a size more than 25% below
    the mean of its two neighbours is a cliff (the shipped kernel fell to 27 at
    multiples of 384 on the P580)."""
    figures = {}

    def measure_n(n):
        a, b = vca_gemm.random_operands(n, n, n, seed + n)
        rows, ref = reference_for(a, b, np.random.default_rng(n))
        run, result = runner.prepare(a, b, params)
        t, ok, _ = timed(run, result, rows, ref, reps)
        return vca_gemm.gflops(n, n, n, t) if ok else None

    def find_cliffs():
        sizes = sorted(figures)
        return [sizes[i] for i in range(1, len(sizes) - 1)
                if figures[sizes[i]] is None
                or figures[sizes[i]] < 0.75 * ((figures[sizes[i - 1]] or 0) + (figures[sizes[i + 1]] or 0)) / 2]

    for n in range(first, last + 1, step):
        figures[n] = measure_n(n)
        print("  N=%5d %8.1f%s" % (n, figures[n] or 0, "" if figures[n] else " FAILED"), flush=True)
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


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="Portable Computing Language", help="OpenCL device (name substring)")
    ap.add_argument("--sizes", type=int, nargs="+")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--budget", type=int, default=60, help="autotuning trials per N")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-clblast-tune", action="store_true", help="CLBlast with its stock parameters")
    ap.add_argument("--json", help="write every figure here too")
    ap.add_argument("--sweep", action="store_true", help="tune once at 4096, then check N = 256..4096 for cliffs")
    ap.add_argument("--clblast-tuning", nargs="+", metavar="JSON",
                    help="result files of an earlier clblast_tuner_xgemm run on this device: its best, not a new run")
    ap.add_argument("--params", type=json.loads, help='a fixed tiling instead of tuning, e.g. \'{"TM": 128, ...}\'')
    return ap.parse_args()


def ours_tiling(args, runner, n):
    """The fixed --params, or the tuner's winner at n: (params, trials)."""
    if args.params:
        return args.params, 0
    params, _, trials = tune_ours(runner, n, args.budget, args.seed)
    return params, trials


def clblast_params(args, pi, di, n, workdir):
    """CLBlast's tuned parameters: from earlier tuner files, a new tuner run, or None (stock)."""
    if args.clblast_tuning:
        return best_tuning(args.clblast_tuning)
    return None if args.no_clblast_tune else clblast_tuned(pi, di, min(n, 1024), workdir)


def main():
    args = parse_args()

    pi, di, device = find_device(args.device)
    runner = vca_gemm.OpenCLRunner(device, (KERNELS / "sgemm.cl").read_text(),
                                   (KERNELS / "sgemm_shipped.cl").read_text())
    is_cpu = runner.is_cpu()
    sizes = args.sizes or ([512, 1024, 2048, 4096] if is_cpu else [1024, 2048, 4096, 8192])
    print("device: %(name)s | %(platform)s | driver %(driver)s | %(compute_units)d CUs" % runner.describe())
    if args.sweep:
        params, trials = ours_tiling(args, runner, 2048 if is_cpu else 4096)
        print("tiling after %d trials: %s" % (trials, params))
        figures, cliffs = sweep(runner, params, args.seed, args.reps)
        if args.json:
            Path(args.json).write_text(json.dumps({"device": runner.describe(), "params": params,
                                                   "sweep": figures, "cliffs": cliffs}, indent=1))
        return
    rows_out = []
    workdir = tempfile.mkdtemp(prefix="clblast-tune-")
    for n in sizes:
        a, b = vca_gemm.random_operands(n, n, n, args.seed + n)
        rows, ref = reference_for(a, b, np.random.default_rng(n))
        entry = {"n": n}
        params, trials = ours_tiling(args, runner, min(n, 2048 if is_cpu else 4096))
        entry["ours_params"], entry["ours_trials"] = params, trials
        contenders = {"ours": runner.prepare(a, b, params)}
        if n <= (2048 if is_cpu else 4096):   # on PoCL one shipped run at 4096 takes minutes
            contenders["shipped"] = runner.prepare_shipped(a, b)
        if is_cpu:
            cl_params = clblast_params(args, pi, di, n, workdir)
            entry["clblast_params"] = cl_params
            contenders["clblast"] = run_clblast(runner.queue, a, b, cl_params, device)
            contenders["openblas"] = run_numpy(a, b)
        else:
            contenders["cublas"] = run_cublas(a, b)
        for name, (run, result) in contenders.items():
            t, ok, err = timed(run, result, rows, ref, args.reps)
            entry[name] = {"gflops": vca_gemm.gflops(n, n, n, t) if ok else None, "max_rel_error": err}
        rows_out.append(entry)
        base = [k for k in ("clblast", "openblas", "cublas") if k in entry]
        ratios = "  ".join("ours/%s %.2f" % (k, entry["ours"]["gflops"] / entry[k]["gflops"])
                           for k in base if entry["ours"]["gflops"] and entry[k]["gflops"])
        print("N=%5d  ours %s  %s  %s  %s" % (n, figure(entry, "ours"),
              "  ".join("%s %s" % (k, figure(entry, k)) for k in base + (["shipped"] if "shipped" in entry else [])),
              ratios, "params %s" % params), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": runner.describe(), "results": rows_out}, indent=1))


if __name__ == "__main__":
    main()
