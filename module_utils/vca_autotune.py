# SPDX-License-Identifier: MIT
"""Autotuner for the tiled SGEMM: search the tiling macros for one device.

Good settings are rare (on PoCL about 1 in 500 reaches 80% of the best), so
the search samples the pruned space at random, then refines the best
neighbour by neighbour, within a trial budget. A candidate whose result does
not match the reference never wins. The winner is cached per device name,
driver version and N class, so the next run skips the search.
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
    "WPTN": [1, 2, 4, 8, 16, 32, 48, 64],
    "VW": [1, 2, 4, 8, 16],
    "LMEM": [0, 1],
    "KBARRIER": [0, 1],
    "PF": [0, 1],
    "PACK": [0, 1],
}
MAX_OUTPUTS_PER_ITEM = 256
# Where the search starts, and what runs when tuning is off and nothing is cached:
# CPU OpenCL wants wide vectors, no local memory, packed panels and no K-chunk
# barrier (160-190 GFLOP/s at N=2048 on 2 AVX-512 cores with the register block
# unrolled; 20 unpacked); GPUs the 128x128 tile with
# 8x8 per work-item and the next K chunk prefetched into registers, which
# measured best on the H200 (34.4 TFLOP/s, 0.68x cuBLAS at N=8192; 0.55x without PF).
START_PARAMS = {
    "cpu": dict(TM=48, TN=64, TK=32, WPTM=6, WPTN=32, VW=16, LMEM=0, KBARRIER=0, PF=0, PACK=1),
    "gpu": dict(TM=128, TN=128, TK=8, WPTM=8, WPTN=8, VW=1, LMEM=1, KBARRIER=0, PF=1, PACK=0),
}   # register pressure: beyond this every device spills


def valid(p, limits, n):
    """Whether a parameter set can run on this device for this size (no build needed to know)."""
    items = (p["TM"] // p["WPTM"]) * (p["TN"] // p["WPTN"])
    rules = [
        p["TM"] % p["WPTM"] == 0 and p["TN"] % p["WPTN"] == 0 and p["WPTN"] % p["VW"] == 0,
        max(p["TM"], p["TN"], p["TK"]) <= n,
        1 <= items <= limits["max_work_group_size"],
        p["WPTM"] * p["WPTN"] <= MAX_OUTPUTS_PER_ITEM,
    ]
    if p["LMEM"]:
        # the local-memory path always synchronises; both chunks (A's padded) must fit
        rules.append(not p["KBARRIER"])
        rules.append(4 * p["TK"] * (p["TM"] + 1 + p["TN"]) <= limits["local_mem_bytes"])
        rules.append(not p.get("PACK", 0))  # packed panels only exist on the direct path
    else:
        rules.append(not p.get("PF", 0))   # register prefetch only exists on the local-memory path
    return all(rules)


def n_class(n):
    c = 256
    while c < n:
        c *= 2
    return "n%d" % c


def cache_key(device, n):
    return "%s|%s|%s" % (device["name"], device["driver"], n_class(n))


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
