# SPDX-License-Identifier: MIT
"""Autotuner for the tiled SGEMM: search the tiling macros for one device.

Good settings are rare (on PoCL about 1 in 500 reaches 80% of the best), so
the search samples the pruned space at random, then refines the best
neighbour by neighbour, within a trial budget. A candidate whose result does
not match the reference never wins. The winner is cached per device name,
driver version and size class, so the next run skips the search.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import time

# Non-powers of two belong here: on PoCL (AVX-512) 40x48 tiles of 8x48 per
# work-item and 24x64 tiles of 6x64 were among the fastest measured.
SPACE = {
    "TM": [8, 16, 24, 32, 40, 48, 64, 96, 128],
    "TN": [16, 32, 48, 64, 96, 128, 256],
    "TK": [8, 16, 32, 64, 128, 256],
    "WPTM": [1, 2, 4, 6, 8, 16],
    "WPTN": [1, 2, 4, 8, 12, 16, 32, 48, 64],
    "VW": [1, 2, 4, 8, 16],
    "LMEM": [0, 1, 2],
    "KBARRIER": [0, 1],
    "PF": [0, 1],
    "PACK": [0, 1],
    "DB": [0, 1],
    "APAD": [4, 0],
}
MAX_OUTPUTS_PER_ITEM = 256
# Where the search starts, and what runs when tuning is off and nothing is cached:
# CPU OpenCL wants wide vectors, no local memory, packed panels and no K-chunk
# barrier (160-190 GFLOP/s at N=2048 on 2 AVX-512 cores with the register block
# unrolled; 20 unpacked); GPUs the 128x128 tile with
# 8x8 per work-item and the next K chunk prefetched into registers (34.4 TFLOP/s,
# 0.68x cuBLAS at N=8192 on the H200). GPU_CLASS_START below (LMEM=2) replaced it.
START_PARAMS = {
    "cpu": dict(TM=48, TN=64, TK=32, WPTM=6, WPTN=32, VW=16, LMEM=0, KBARRIER=0, PF=0, PACK=1),
    "gpu": dict(TM=128, TN=128, TK=8, WPTM=8, WPTN=8, VW=1, LMEM=1, KBARRIER=0, PF=1, PACK=0),
}
# Per size class on GPUs (LMEM=2: float4 loads, double-buffered local memory, split
# register block): smaller tiles for small products, so that more work-groups than
# compute units exist (N=512 in 128x128 tiles is 16 work-groups for the H200's 132 SMs).
GPU_CLASS_START = {   # measured winners (bench/README.md), DB=0 APAD=4 by default
    # small: worse of 512 and 640 on the H100, 17.0 TFLOP/s against 14.3 for 32x32x16
    "small": dict(TM=32, TN=64, TK=32, WPTM=4, WPTN=4, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
    "medium": dict(TM=64, TN=64, TK=16, WPTM=8, WPTN=4, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
    "large": dict(TM=128, TN=128, TK=8, WPTM=8, WPTN=8, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
    # tall-skinny outputs with a long K (4096x64x4096): large tiles, K split over the device
    # (vca_gemm.split_k) rather than the small tiles that a 4096x64 output would otherwise get
    # (H200: 4 slices of 128x128 tiles ran 4096x128x4096 at 34.8 TFLOP/s and 8192x128x8192 at 44.6)
    "skinny": dict(TM=128, TN=128, TK=8, WPTM=8, WPTN=8, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
    # narrow: skinny with the short side at most 64 (4096x64x4096): 128x64x16 tiles, 8 K slices,
    # 28.3 TFLOP/s on the H100 where 128x128 tiles (half of each wasted) ran 15.4; the best of
    # the worse figure over 4096x32x4096 and 4096x64x4096 (64x64x16 ran 29.7 at N=64, 7.7 at 32)
    "narrow64": dict(TM=128, TN=64, TK=16, WPTM=8, WPTN=8, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
    # narrow N (16-127, issue 42): the tile as wide as the next of 32, 64, 96, 128 at or above N,
    # so that a group is off C's right edge by less than 32 columns, or not at all (H100, one
    # call against cuBLAS: 4096x32x4096 256x32x16 0.86, 128x32x16 0.75; 6000x96x6000 128x96x16
    # 1.06, 128x128x8 0.70; 6001x117x4999 128x128x8 0.78, 128x96x16 0.38)
    "narrow32": dict(TM=256, TN=32, TK=16, WPTM=16, WPTN=4, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
    "narrow96": dict(TM=128, TN=96, TK=16, WPTM=8, WPTN=12, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
    "narrow128": dict(TM=128, TN=128, TK=8, WPTM=8, WPTN=8, VW=1, LMEM=2, KBARRIER=0, PF=0, PACK=0),
}
NARROW_WIDTHS = (32, 64, 96, 128)
# Size classes by the output's side, sqrt(M*N) (a 4096x64 output is "small": few tiles),
# and the side each class is tuned at (CPU OpenCL tunes "large" at 2048: PoCL is slow).
# "medium" ends at 1152 (1536 before issue 42): on the H100 the large class's 128x128 tiles, with
# the wave-aware plan (vca_gemm.wave_plan), beat the medium 64x64 on odd products between:
# 333x5555x2221 0.82x cuBLAS (2 K slices) against 0.67x, 1531^3 0.75x (3) against 0.72x,
# 999x1999x511 0.71x against 0.67x; 5999x257x3001 lost (0.63x, 3 slices, against 0.67x).
SIZE_CLASSES = (("small", 768), ("medium", 1152), ("large", None))
TUNE_N = {"small": 512, "medium": 1024, "large": 4096}
CPU_TUNE_N = {"small": 512, "medium": 1024, "large": 2048}


# Tuning scores a candidate by its worse figure at the class's size and this much above it,
# so that a tiling suiting one size only does not win (the bench; the module tunes at the
# products it will run).
TUNE_NEIGHBOUR = 128
# "narrow" (issue 42): N from NARROW_MIN to NARROW_MAX beside at least NARROW_TALL rows, any K;
# one class per tile width (narrow32 ... narrow128), each tuned and cached on its own.
# "skinny": one side of the output at most SKINNY_SIDE, the other and K at least SKINNY_LONG
# (4096x128x4096, 8192x128x8192, 64x4096x4096): few output tiles, much K.
NARROW_MIN, NARROW_MAX, NARROW_TALL = 16, 127, 1024
SKINNY_SIDE, SKINNY_LONG = 256, 2048
SKINNY_TUNE_SHAPES = {"skinny": ((4096, 128, 4096), (4096, 256, 4096))}
CPU_SKINNY_TUNE_SHAPES = {"skinny": ((2048, 128, 2048), (2048, 256, 2048))}


def narrow_width(n):
    """The narrow class's tile width for N columns: the first of NARROW_WIDTHS at or above N."""
    return next(w for w in NARROW_WIDTHS if n <= w)


def size_class(m, n=None, k=None):
    """small, medium or large, by sqrt(M*N) (N = M when only one side is given); "narrowW"
    (W the tile width) for N in 16..127 beside at least 1024 rows; "skinny" when K is given
    and the output is tall-skinny over a long K."""
    if n is not None and NARROW_MIN <= n <= NARROW_MAX and m >= NARROW_TALL:
        return "narrow%d" % narrow_width(n)
    if n is not None and k is not None and min(m, n) <= SKINNY_SIDE and min(max(m, n), k) >= SKINNY_LONG:
        return "skinny"
    side = (m * (m if n is None else n)) ** 0.5
    for name, upper in SIZE_CLASSES:
        if upper is None or side <= upper:
            return name
    raise AssertionError("unreachable")


def tune_shapes(cls, is_cpu, n=None):
    """The (M, N, K) products a class's candidates are scored on in the bench (each by its
    worse figure): the class's tuning size n (default TUNE_N or CPU_TUNE_N) and n + TUNE_NEIGHBOUR,
    the two skinny shapes, or for narrowW N = W and W - 16 over 4096 rows and K (2048 on CPU)."""
    if cls in SKINNY_TUNE_SHAPES:
        return (CPU_SKINNY_TUNE_SHAPES if is_cpu else SKINNY_TUNE_SHAPES)[cls]
    if cls.startswith("narrow"):
        side, w = (2048 if is_cpu else 4096), int(cls[len("narrow"):])
        return ((side, w, side), (side, w - 16, side))
    n = n or (CPU_TUNE_N if is_cpu else TUNE_N)[cls]
    return ((n, n, n), (n + TUNE_NEIGHBOUR,) * 3)


def start_params(is_cpu, cls="large"):
    """Where the search starts, and what runs untuned, for a CPU or GPU device and a class."""
    return dict(START_PARAMS["cpu"]) if is_cpu else dict(GPU_CLASS_START[cls])


def valid(p, limits, n):
    """Whether a parameter set can run on this device for this size (no build needed to know)."""
    items = (p["TM"] // p["WPTM"]) * (p["TN"] // p["WPTN"])
    rules = [
        p["TM"] % p["WPTM"] == 0 and p["TN"] % p["WPTN"] == 0 and p["WPTN"] % p["VW"] == 0,
        max(p["TM"], p["TN"], p["TK"]) <= n,
        1 <= items <= limits["max_work_group_size"],
        p["WPTM"] * p["WPTN"] <= MAX_OUTPUTS_PER_ITEM,
    ]
    if p["LMEM"] == 2:
        nt = max(items, 1)      # 0 only where a rule above already fails
        rules += [
            p["WPTM"] % 4 == 0 and p["WPTN"] % 4 == 0 and p["TK"] % 4 == 0 and p["TN"] % 4 == 0,
            p["VW"] == 1 and not p["KBARRIER"] and not p.get("PACK", 0) and not p.get("PF", 0),
            (p["TM"] * p["TK"] // 4) % nt == 0 and (p["TK"] * p["TN"] // 4) % nt == 0,
            # double-buffered chunks, A's rows padded by 4 floats
            8 * p["TK"] * (p["TM"] + 4 + p["TN"]) <= limits["local_mem_bytes"],
        ]
    elif p["LMEM"]:
        # the local-memory path always synchronises; both chunks (A's padded) must fit
        rules.append(not p["KBARRIER"])
        rules.append(4 * p["TK"] * (p["TM"] + 1 + p["TN"]) <= limits["local_mem_bytes"])
        rules.append(not p.get("PACK", 0))  # packed panels only exist on the direct path
    else:
        rules.append(not p.get("PF", 0))   # register prefetch only exists on the local-memory path
    if p["LMEM"] != 2:                     # DB and APAD only exist on LMEM 2: one point, not four
        rules.append(not p.get("DB", 0) and p.get("APAD", 4) == 4)
    return all(rules)


def class_key(device, cls):
    return "%s|%s|%s" % (device["name"], device["driver"], cls)


def cache_key(device, n, m=None, k=None):
    """Winners are cached per device, driver and size class (of an M x N output; square if m is None)."""
    return class_key(device, size_class(n, m, k))


def shape_text(shape):
    return "%dx%dx%d" % tuple(shape)


def tuned_key(device, cls, shapes):
    """The cache key of a class's winner tuned on these products (the module's)."""
    return "%s|%s" % (class_key(device, cls), ",".join(shape_text(s) for s in shapes))


def cached_for(cache, device, cls, products):
    """(key, entry) of a cached winner for this device and class that was tuned on every one of
    these products, or (None, None): a winner tuned at other sizes is not reused for these."""
    want = {shape_text(p) for p in products}
    for key, entry in sorted(cache.items()):
        if key.split("|")[:3] == class_key(device, cls).split("|") and want <= set(entry.get("tune_shapes", ())):
            return key, entry
    return None, None


def products_to_tune(products):
    """The products a class is tuned on in the module: those it will run, the largest and the
    smallest by FLOPs (one if they are the same)."""
    ranked = sorted(set(tuple(p) for p in products), key=lambda p: (p[0] * p[1] * p[2], p))
    return tuple(dict.fromkeys([ranked[-1], ranked[0]]))


class Tuner(object):
    def __init__(self, evaluate, limits, n, *, budget=60, seed=0, space=None):
        """evaluate(params) -> GFLOP/s of a verified run, or None (did not build, or wrong)."""
        self.evaluate = evaluate
        self.limits = limits
        self.n = n
        self.budget = budget
        self.rng = random.Random(seed)
        self.space = space or SPACE
        self.trials = []

    def _try(self, p):
        key = tuple(sorted(p.items()))
        for done, _ in self.trials:
            if done == key:
                return None
        if len(self.trials) >= self.budget:
            return None
        score = self.evaluate(dict(p)) if valid(p, self.limits, self.n) else None
        self.trials.append((key, score))
        return score

    def _random(self):
        for _ in range(10000):
            p = dict((k, self.rng.choice(v)) for k, v in self.space.items())
            if valid(p, self.limits, self.n):
                return p
        raise ValueError("no valid tiling for this device and size")

    def _neighbours(self, p):
        """For each macro, the nearest valid value on either side: with tiles like 40 and 48
        in the space, the next value up is often invalid (WPTM 6 does not divide TM 64)."""
        for key, values in self.space.items():
            i = values.index(p[key])
            for step in (-1, 1):
                j = i + step
                while 0 <= j < len(values):
                    q = dict(p)
                    q[key] = values[j]
                    if valid(q, self.limits, self.n):
                        yield q
                        break
                    j += step

    def best(self):
        scored = [(s, dict(k)) for k, s in self.trials if s is not None]
        return max(scored, key=lambda t: t[0]) if scored else (None, None)

    def run(self, start=None):
        sample = max(1, int(self.budget * 0.6))
        if start is not None:
            # a start (or a cached winner) from before a macro existed: that macro's first value, its default
            self._try(dict((k, start.get(k, v[0])) for k, v in self.space.items()))
        while len(self.trials) < sample:
            self._try(self._random())
        improved = True
        while improved and len(self.trials) < self.budget:
            improved = False
            score, p = self.best()
            if p is None:
                break
            for q in self._neighbours(p):
                s = self._try(q)
                if s is not None and s > score:
                    improved = True
                    break
        return self.best()


def load_cache(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def store_cache(path, key, entry):
    """Add one winner to the JSON cache; written atomically so a crash keeps the old file."""
    cache = load_cache(path)
    entry = dict(entry, tuned_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    cache[key] = entry
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        os.makedirs(directory)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tune-")
    with os.fdopen(fd, "w") as fh:
        json.dump(cache, fh, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return entry
