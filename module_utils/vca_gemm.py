# SPDX-License-Identifier: MIT
"""GEMM probe logic: random-data verification, timing statistics, OpenCL and CPU runners.

A figure is only ever reported for a result that matched a float64 CPU
reference on random data. An all-ones check is not enough: it passed a
kernel in the seed's tree that corrupted 40% of its output.
"""

from __future__ import annotations

import ctypes
import math
import statistics
import time

import numpy as np

FLOAT32_UNIT_ROUNDOFF = 2.0 ** -24
TOLERANCE_FACTOR = 16.0


class VerificationFailed(Exception):
    def __init__(self, verification):
        Exception.__init__(self, "%(wrong)d of %(elements)d elements wrong, max relative error %(max_rel_error).3g"
                           " (tolerance %(tolerance).3g)" % verification)
        self.verification = verification


def random_operands(m, n, k, seed):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1.0, 1.0, (m, k)).astype(np.float32)
    b = rng.uniform(-1.0, 1.0, (k, n)).astype(np.float32)
    return a, b


def tolerance(k):
    """Allowed error relative to sum_k |a_ik||b_kj|: float32 rounding grows like sqrt(K)."""
    return TOLERANCE_FACTOR * math.sqrt(k) * FLOAT32_UNIT_ROUNDOFF


class Reference(object):
    """float64 product and the per-element bound |A|.|B|, computed once per operand pair."""

    def __init__(self, a, b):
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        self.c = a64 @ b64
        self.bound = np.maximum(np.abs(a64) @ np.abs(b64), np.finfo(np.float64).tiny)
        self.k = a.shape[1]

    def verify(self, c):
        rel = np.abs(c.astype(np.float64) - self.c) / self.bound
        tol = tolerance(self.k)
        bad = ~(rel <= tol)          # NaN counts as wrong
        return {
            "method": "random uniform(-1,1) operands against a float64 CPU reference",
            "elements": int(rel.size),
            "wrong": int(bad.sum()),
            "max_rel_error": float(np.nanmax(rel)) if np.isfinite(rel).any() else float("inf"),
            "tolerance": tol,
            "passed": bool(not bad.any()),
        }


def timing(samples_s, cpu_s, wall_s, expected_threads, device_samples_s=None):
    """Median and spread of the timed runs; CPU time against wall time to flag a noisy host.

    With device_samples_s (OpenCL profiling events, start of the first kernel to the end of
    the last), the median is the device's and clock says so; the host's wall time per run
    (launch and wait included) stays beside it as wall_median_s."""
    primary = list(device_samples_s) if device_samples_s else list(samples_s)
    med = statistics.median(primary)
    ratio = cpu_s / wall_s if wall_s > 0 else 0.0
    return {
        "runs": len(primary),
        "clock": "device events" if device_samples_s else "host wall",
        "median_s": med,
        "min_s": min(primary),
        "max_s": max(primary),
        "spread": (max(primary) - min(primary)) / med if med > 0 else 0.0,
        "wall_median_s": statistics.median(samples_s),
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "cpu_per_wall": ratio,
        "expected_threads": expected_threads,
        # A CPU-bound probe that got far less CPU than its threads shared the cores with something.
        "noisy": bool(expected_threads and ratio < 0.8 * expected_threads),
    }


def gflops(m, n, k, seconds):
    return 2.0 * m * n * k / seconds / 1e9


def padded(x, rows, cols):
    if x.shape == (rows, cols):
        return np.ascontiguousarray(x)
    out = np.zeros((rows, cols), dtype=np.float32)
    out[: x.shape[0], : x.shape[1]] = x
    return out


def parse_shape(shape):
    """(M, N, K) from 'MxNxK' or a list of three; ValueError for anything else (sign not checked)."""
    try:
        dims = [int(x) for x in (shape.lower().split("x") if isinstance(shape, str) else shape)]
    except (TypeError, ValueError, AttributeError):
        dims = []
    if len(dims) != 3:
        raise ValueError("a shape is [M, N, K] or 'MxNxK', got %r" % (shape,))
    return tuple(dims)


def round_up(x, step):
    return (x + step - 1) // step * step


def event_seconds(events):
    """Device time from the first event's start to the last one's end (in-order queue)."""
    return (events[-1].profile.end - events[0].profile.start) * 1e-9


# A product this small (FLOPs) whose padding to the tiles would more than double its work
# runs the direct kernel on CPU OpenCL: one launch, nothing padded (97x33x65 on PoCL spent
# far longer padding, packing and cutting back than multiplying).
DIRECT_MAX_FLOPS = 2 ** 23
# Split K only where K is long against the output (K >= SPLIT_K_RATIO * sqrt(M*N): square
# products never split; on the H200 two slices cost 512 and 1024 a third of their speed),
# and the output has fewer tiles than SPLIT_GROUPS_PER_CU work-groups per compute unit:
# then as many slices as fill that many, one wave (H200: 4 slices of 128x128 tiles ran
# 4096x128x4096 at 34.8 TFLOP/s, 9 slices, two waves, at 30.5).
SPLIT_K_RATIO = 4
SPLIT_GROUPS_PER_CU = 2
SPLIT_MIN_SLICE = 256        # no K slice shorter than this (the reduction must stay cheap)
SPLIT_MAX = 16


def split_k(m, n, k, params, compute_units):
    """(slices, K per slice) for an M x N x K product in this tiling: several slices only when
    the output has too few tiles to give every compute unit SPLIT_GROUPS_PER_CU work-groups
    and K is long. params' SPLITK (host-side, not a macro) forces the count: 1 never splits.
    K per slice is a multiple of TK; the last slice may be shorter."""
    tk = params["TK"]
    forced = int(params.get("SPLITK", 0) or 0)
    if forced:
        slices = forced
    else:
        tiles = -(-m // params["TM"]) * -(-n // params["TN"])
        want = SPLIT_GROUPS_PER_CU * max(int(compute_units), 1)
        if tiles >= want or k < SPLIT_K_RATIO * math.sqrt(m * n):
            return 1, round_up(k, tk)
        slices = min(want // tiles, k // SPLIT_MIN_SLICE, SPLIT_MAX)
    if slices <= 1:
        return 1, round_up(k, tk)
    ks = round_up(-(-k // slices), tk)
    return -(-k // ks), ks


# Wave-aware choice (issue 42), GPUs: the busiest compute unit's work decides the time. A
# product whose work-groups leave the compute units unevenly loaded (2200^3 in 128x128 tiles:
# 324 groups on 132 CUs, so some run 3 and some 2) may run faster in half-height tiles or
# split over K. Each plan is costed in FMAs on the busiest CU, from these assumptions, fitted
# to the H100's one-call figures of issue 42 (bench/README.md):
RESIDENT_ITEMS_PER_CU = 512   # 8x8 register blocks: two 256-item work-groups fit on an H100 SM
LONE_GROUP_SPEED = 0.7        # a CU holding 256 work-items or fewer runs at this share of its rate
HALF_TILE_SPEED = 0.8         # a half-height tile's rate against the whole tile's
# A half-width tile (TN / 2, TK x 2: the same float4 loads a work-item a chunk) is considered
# only where the whole tile leaves at least this share of its columns empty: 5999x257x3001 in
# 128-column tiles computes 384 columns for 257 (128x128x8 in 4 K slices 0.66x cuBLAS, 128x64x16
# in 3 slices 0.75x, H100). Elsewhere the cost model would pick it where it measured slower
# (1000x3000x257: 0.64x against 0.85x for half-height tiles; 2200^3: 0.67x against 0.80x).
HALF_WIDTH_MIN_EMPTY = 0.25
HALF_WIDTH_SPEED = 0.9        # fitted to that one shape: the cost model's 0.79 against the measured 0.88
# ... and only in K slices enough to fill every compute unit's resident slots (4 groups of 128
# items) at least once: on 5999x257x3001, 128x64x16 in 1, 2, 3, 4 slices (235, 470, 705, 940
# groups on 132 CUs) ran at 0.70, 0.62, 0.75, 0.76x cuBLAS (H100, one call), where plan_cost
# rates 2 slices level with 4 and picked 2. The cause is not measured (fewer resident groups
# than 4, from the TK 16 prefetch's registers, would fit these figures).
REDUCE_FMA_PER_BYTE = 20      # split K's slabs: each byte written and read back costs 20 FMAs' time
WAVE_MAX_SLICES = 4


def plan_cost(shape, params, slices, compute_units, speed=1.0):
    """FMAs' worth of time on the busiest compute unit for this (M, N, K), tiling and K slice count."""
    m, n, k = shape
    items = (params["TM"] // params["WPTM"]) * (params["TN"] // params["WPTN"])
    load = -(-groups(m, n, params, slices) // max(int(compute_units), 1))
    occupancy = LONE_GROUP_SPEED if load * items <= 256 and load < RESIDENT_ITEMS_PER_CU // items else 1.0
    cost = load * params["TM"] * params["TN"] * -(-k // slices) / (speed * occupancy)
    if slices > 1:
        cost += (slices + 1) * m * n * 4 * REDUCE_FMA_PER_BYTE / max(int(compute_units), 1)
    return cost


def float4_layout_fits(p):
    """Whether an LMEM 2 tiling's sides hold its 4x4 pieces and its chunks' float4s divide
    evenly among its work-items (vca_autotune.valid's float4 rules)."""
    items = (p["TM"] // p["WPTM"]) * (p["TN"] // p["WPTN"])
    return (p["TM"] % (4 * p["WPTM"]) == 0 and p["TN"] % (4 * p["WPTN"]) == 0 and p["TK"] % 4 == 0
            and (p["TM"] * p["TK"] // 4) % items == 0 and (p["TK"] * p["TN"] // 4) % items == 0)


def groups(m, n, params, slices):
    """Work-groups of an M x N output in this tiling, over slices K slices."""
    return -(-m // params["TM"]) * -(-n // params["TN"]) * slices


def resident_slots(params, compute_units):
    """Work-groups of this tiling that all the compute units hold at once (RESIDENT_ITEMS_PER_CU)."""
    items = (params["TM"] // params["WPTM"]) * (params["TN"] // params["WPTN"])
    return max(int(compute_units), 1) * max(RESIDENT_ITEMS_PER_CU // items, 1)


def empty_columns(n, tn):
    """The share of the columns that N columns in TN-wide tiles compute for nothing."""
    padded = round_up(n, tn)
    return (padded - n) / padded


def wave_plan(m, n, k, params, compute_units):
    """(params, note): the float4 tiling as given, its half-height tile (TM / 2), or where the
    tile leaves a quarter of its columns empty its half-width tile (TN / 2, TK x 2, in K slices
    that fill the compute units' resident slots at least once), and a K
    slice count (SPLITK) of 1 to WAVE_MAX_SLICES (none shorter than SPLIT_MIN_SLICE), whichever
    plan_cost rates fastest; note says what changed (None: nothing). Only 8x8 register blocks
    (the assumptions' own; 64x64 tiles of 8x4 lost a third at 1024 split in two on the H200);
    left alone too: a forced SPLITK, and outputs that split_k already splits."""
    if (params.get("LMEM") != 2 or params["WPTM"] * params["WPTN"] != 64 or params.get("SPLITK")
            or split_k(m, n, k, params, compute_units)[0] > 1):
        return params, None
    tiles = [(params, 1.0)]
    half = dict(params, TM=params["TM"] // 2)
    if params["TM"] % (2 * params["WPTM"]) == 0 and half["TM"] >= 32:
        tiles.append((half, HALF_TILE_SPEED))
    narrow = dict(params, TN=params["TN"] // 2, TK=params["TK"] * 2)
    if (narrow["TN"] >= 32 and float4_layout_fits(narrow)
            and empty_columns(n, params["TN"]) >= HALF_WIDTH_MIN_EMPTY):
        tiles.append((narrow, HALF_WIDTH_SPEED))
    best = None
    for tiling, speed in tiles:
        for slices in range(1, WAVE_MAX_SLICES + 1):
            if slices > 1 and -(-k // slices) < SPLIT_MIN_SLICE:
                break
            if tiling is narrow and groups(m, n, tiling, slices) < resident_slots(tiling, compute_units):
                continue
            cost = plan_cost((m, n, k), tiling, slices, compute_units, speed)
            if best is None or cost < best[0]:
                best = (cost, tiling, slices)
    _, tiling, slices = best
    notes = (["half-height tiles (TM %d)" % tiling["TM"]] * (tiling is half)
             + ["half-width tiles (TN %d, TK %d)" % (tiling["TN"], tiling["TK"])] * (tiling is narrow)
             + ["%d K slices" % slices] * (slices > 1))
    return dict(tiling, SPLITK=slices), ", ".join(notes) or None


def reduce_slices(partial, slices, rows, cols, ld=None):
    """NumPy statement of reduce_splits (sgemm.cl): the slabs summed in order s = 0, 1, ...,
    cut to rows x cols. partial is the flat buffer of slices x rows_p x ld floats."""
    ld = cols if ld is None else ld
    slabs = np.asarray(partial, dtype=np.float32).reshape(slices, -1, ld)[:, :rows, :cols]
    out = np.zeros((rows, cols), dtype=np.float32)
    for s in range(slices):
        out += slabs[s]
    return out


def uses_edge(m, n, k, params):
    """Whether a float4 (LMEM 2) tiling runs this shape with EDGE (bounds-checked edges, no
    padding): any side off the tile, or rows that float4 loads cannot take aligned."""
    return params.get("LMEM") == 2 and bool(m % params["TM"] or n % params["TN"] or k % params["TK"]
                                            or k % 4 or n % 4)


def is_direct(m, n, k, params, is_cpu):
    """The direct kernel for a tiny product on CPU OpenCL, where padding would more than double it."""
    padded_work = round_up(m, params["TM"]) * round_up(n, params["TN"]) * round_up(k, params["TK"])
    return bool(is_cpu and 2 * m * n * k <= DIRECT_MAX_FLOPS and padded_work > 2 * m * n * k)


class OpenCLRunner(object):
    """Builds the tiled kernel for one parameter set and runs it on one device."""

    def __init__(self, device, source, shipped_source=None):
        import pyopencl as cl  # imported here: the CPU backend must work without OpenCL

        self.cl = cl
        self.device = device
        self.ctx = cl.Context([device])
        # profiling on: every run returns its device time from the kernels' own events
        self.queue = cl.CommandQueue(self.ctx, properties=cl.command_queue_properties.PROFILING_ENABLE)
        self.source = source
        self.shipped_source = shipped_source
        self._kernels = {}
        self.last_plan = None

    def describe(self):
        d = self.device
        return {"name": d.name.strip(), "vendor": d.vendor.strip(), "driver": d.driver_version.strip(),
                "platform": d.platform.name.strip(), "type": self.cl.device_type.to_string(d.type),
                "compute_units": d.max_compute_units, "max_work_group_size": d.max_work_group_size,
                "local_mem_bytes": d.local_mem_size}

    def is_cpu(self):
        return bool(self.device.type & self.cl.device_type.CPU)

    def _kernel(self, params, extra=(), name="sgemm"):
        """A kernel of the program built for these macros; each program is built once per runner."""
        key = (tuple(sorted(params.items())), tuple(extra))
        if key not in self._kernels:
            opts = ["-D%s=%d" % (k, v) for k, v in sorted(params.items())] + list(extra)
            self._kernels[key] = self.cl.Program(self.ctx, self.source).build(options=" ".join(opts))
        return self.cl.Kernel(self._kernels[key], name)

    def _buffer(self, floats):
        return self.cl.Buffer(self.ctx, self.cl.mem_flags.READ_WRITE, max(int(floats), 1) * 4)

    def _upload(self, a, b, c_shape):
        """Device buffers for A, B and C (C is c_shape, read back whole)."""
        cl = self.cl
        mf = cl.mem_flags
        abuf = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(a))
        bbuf = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=np.ascontiguousarray(b))
        cbuf = cl.Buffer(self.ctx, mf.READ_WRITE, c_shape[0] * c_shape[1] * 4)

        def read_back():
            out = np.empty(c_shape, dtype=np.float32)
            cl.enqueue_copy(self.queue, out, cbuf)
            return out

        return abuf, bbuf, cbuf, read_back

    def _runner(self, steps):
        """run(calls=1): queue every step calls times back to back, wait for the last; the
        device seconds from the first step's start to the last one's end."""
        cl = self.cl
        for kernel, _, _, args in steps:
            kernel.set_args(*args)          # once: a burst's calls cost the host an enqueue each, no more

        def run(calls=1):
            first = last = None
            for _ in range(max(int(calls), 1)):
                for kernel, glob, local, _ in steps:
                    last = cl.enqueue_nd_range_kernel(self.queue, kernel, glob, local)
                    first = first or last
            last.wait()
            return event_seconds([first, last])

        return run

    def prepare(self, a, b, params, extra=(), direct=None):
        """Upload the operands as they are and return (run, result): run(calls=1) runs the
        product calls times and returns device seconds; result() is C (M x N).

        Every step on the way is on the device and inside the timed run: padding to the tiles
        (pad2d, only for tilings without EDGE and shapes off the tiles), packing, the product
        (split over K when the output has too few tiles for the device), and the reduction of
        the K slices or the cut back of a padded C (reduce_splits). The plan is in last_plan."""
        m, k = a.shape
        n = b.shape[1]
        wave = None
        if not self.is_cpu():
            params, wave = wave_plan(m, n, k, params, self.describe()["compute_units"])
        params = dict(params)
        forced_split = params.pop("SPLITK", 0)
        abuf, bbuf, cbuf, read_back = self._upload(a, b, (m, n))
        i32 = np.int32
        if direct is None:
            direct = is_direct(m, n, k, params, self.is_cpu())
        if direct:
            kernel = self._kernel(params, extra, "sgemm_direct")
            self.last_plan = {"path": "direct", "slices": 1, "edge": True, "padded": False}
            return (self._runner([(kernel, (n, m), None, (i32(m), i32(n), i32(k), abuf, bbuf, cbuf))]),
                    read_back)
        edge = uses_edge(m, n, k, params)
        if edge:
            params["EDGE"] = 1
            # rows that do not start 16-byte aligned are read (and C written) with vload4/vstore4
            params.update({key: 0 for key, side in (("AV4", k), ("BV4", n)) if side % 4})
            mp, np_, kp = m, n, k
        else:
            mp, np_, kp = round_up(m, params["TM"]), round_up(n, params["TN"]), round_up(k, params["TK"])
        steps = []
        if (mp, kp) != (m, k):
            apad = self._buffer(mp * kp)
            steps.append((self._kernel(params, extra, "pad2d"), (kp, mp), None,
                          (i32(m), i32(k), i32(kp), abuf, apad)))
            abuf = apad
        if (kp, np_) != (k, n):
            bpad = self._buffer(kp * np_)
            steps.append((self._kernel(params, extra, "pad2d"), (np_, kp), None,
                          (i32(k), i32(n), i32(np_), bbuf, bpad)))
            bbuf = bpad
        if params.get("PACK") and not params["LMEM"]:
            apbuf, bpbuf = self._buffer(mp * kp), self._buffer(kp * np_)
            steps.append((self._kernel(params, extra, "pack_a"), (kp, mp // params["WPTM"]), None,
                          (i32(mp), i32(kp), abuf, apbuf)))
            steps.append((self._kernel(params, extra, "pack_b"), (kp, np_ // params["WPTN"]), None,
                          (i32(kp), i32(np_), bbuf, bpbuf)))
            abuf, bbuf = apbuf, bpbuf
        slices, ks = split_k(m, n, kp, dict(params, SPLITK=forced_split), self.describe()["compute_units"])
        padded_c = (mp, np_) != (m, n)
        out = self._buffer(slices * mp * np_) if slices > 1 or padded_c else cbuf
        local = (params["TN"] // params["WPTN"], params["TM"] // params["WPTM"], 1)
        glob = (-(-np_ // params["TN"]) * local[0], -(-mp // params["TM"]) * local[1], slices)
        steps.append((self._kernel(params, extra), glob, local, (i32(mp), i32(np_), i32(kp), i32(ks), abuf, bbuf, out)))
        if out is not cbuf:
            # GPUs: 64 x 4 work-groups over a rounded-up range (the kernel bounds-checks)
            rlocal = None if self.is_cpu() else (64, 4)
            rglob = (n, m) if rlocal is None else (round_up(n, 64), round_up(m, 4))
            steps.append((self._kernel(params, extra, "reduce_splits"), rglob, rlocal,
                          (i32(m), i32(n), i32(np_), i32(slices), i32(mp * np_), out, cbuf)))
        self.last_plan = {"path": "tiled", "slices": slices, "k_per_slice": ks, "edge": edge,
                          "padded": bool((mp, np_, kp) != (m, n, k)), "launches": len(steps),
                          "tile": "%dx%dx%d" % (params["TM"], params["TN"], params["TK"]), "wave": wave}
        return self._runner(steps), read_back

    def prepare_shipped(self, a, b):
        """The shipped kernel's way: one element per work-item, local size left to the runtime."""
        m, k = a.shape
        n = b.shape[1]
        abuf, bbuf, cbuf, read_back = self._upload(a, b, (m, n))
        kernel = self.cl.Kernel(self.cl.Program(self.ctx, self.shipped_source).build(), "sgemm_shipped")
        return self._runner([(kernel, (n, m), None, (np.int32(m), np.int32(n), np.int32(k), abuf, bbuf, cbuf))]), \
            read_back


class CPURunner(object):
    """The C AVX2/FMA + OpenMP SGEMM, compiled on the node, through ctypes."""

    def __init__(self, library):
        self.library = library
        self.lib = ctypes.CDLL(library)
        self.lib.vca_sgemm.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p] * 3
        self.lib.vca_sgemm.restype = ctypes.c_int
        self.lib.vca_sgemm_threads.restype = ctypes.c_int

    def describe(self):
        return {"name": "vca_sgemm (AVX2/FMA, OpenMP)", "library": self.library, "threads": self.threads()}

    def threads(self):
        return int(self.lib.vca_sgemm_threads())

    def prepare(self, a, b):
        a = np.ascontiguousarray(a)
        b = np.ascontiguousarray(b)
        c = np.empty((a.shape[0], b.shape[1]), dtype=np.float32)

        def run():
            rc = self.lib.vca_sgemm(a.shape[0], b.shape[1], a.shape[1], a.ctypes.data, b.ctypes.data, c.ctypes.data)
            if rc != 0:
                raise RuntimeError("vca_sgemm returned %d" % rc)

        return run, (lambda: c)


def measure(run, result, reference, repetitions, *, warmup=1, guard=None, expected_threads=0, sustain_s=0.0):
    """Warm up, verify the warm-up result, then time; raises VerificationFailed or ThermalAbort."""
    for _ in range(max(warmup, 1)):
        run()
    verification = reference.verify(result())
    if not verification["passed"]:
        raise VerificationFailed(verification)
    samples, device = [], []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    deadline = wall0 + sustain_s
    while len(samples) < repetitions or time.perf_counter() < deadline:
        if guard is not None:
            guard.check()
        t0 = time.perf_counter()
        dev = run()          # an OpenCL run returns its device seconds; the CPU SGEMM None
        samples.append(time.perf_counter() - t0)
        if dev is not None:
            device.append(dev)
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    # The last timed result must be right too: a kernel may go wrong under load.
    last = reference.verify(result())
    if not last["passed"]:
        raise VerificationFailed(last)
    return verification, timing(samples, cpu_s, wall_s, expected_threads,
                                device if len(device) == len(samples) else None)


# NVML's clock-event (throttle) reason bits, as nvidia-smi names them.
THROTTLE_REASONS = ((0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"),
                    (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"),
                    (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown"),
                    (0x100, "display_clock_setting"))


def throttle_names(mask):
    return [name for bit, name in THROTTLE_REASONS if int(mask) & bit]


class Telemetry(object):
    """Samples read() -> {"sm_mhz", "power_w", "throttle" (bit mask)} every interval_s in a
    thread while a burst runs (with ... as t), and reads the energy counter energy_j()
    (joules, monotonic; None where the device has none) before and after. Both readers are
    injected: NVML on a GPU, a fake in the tests."""

    def __init__(self, read, energy_j=None, interval_s=0.02):
        import threading

        self.read, self.energy_j, self.interval_s = read, energy_j, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.samples, self.energy_delta_j, self.wall_s = [], None, 0.0

    def _loop(self):
        while not self._stop.is_set():
            self.samples.append(self.read())
            self._stop.wait(self.interval_s)

    def __enter__(self):
        self._e0 = self.energy_j() if self.energy_j else None
        self._t0 = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.samples.append(self.read())
        self.wall_s = time.perf_counter() - self._t0
        if self._e0 is not None:
            self.energy_delta_j = self.energy_j() - self._e0
        return False


def burst_figures(flops, seconds, samples=(), energy_delta_j=None):
    """One burst's figures: GFLOP/s over its device seconds; clocks, power and throttle
    reasons from the samples; energy from the counter's delta where there is one (> 0),
    else mean sampled power x seconds; GFLOP per joule from that energy."""
    out = {"gflops": flops / seconds / 1e9, "seconds": seconds}
    clocks = [s["sm_mhz"] for s in samples if s.get("sm_mhz") is not None]
    power = [s["power_w"] for s in samples if s.get("power_w") is not None]
    mask = 0
    for s in samples:
        mask |= int(s.get("throttle") or 0)
    if clocks:
        out["sm_mhz"] = {"min": min(clocks), "median": statistics.median(clocks), "max": max(clocks)}
    if power:
        out["power_w"] = statistics.fmean(power)
    out["throttle"] = throttle_names(mask)
    if energy_delta_j is not None and energy_delta_j > 0:
        out["energy_j"], out["energy_source"] = energy_delta_j, "counter"
    elif power:
        out["energy_j"], out["energy_source"] = out["power_w"] * seconds, "mean power x time"
    if out.get("energy_j"):
        out["gflop_per_j"] = flops / 1e9 / out["energy_j"]
    if power:                        # beside the counter's: NVML's power reading lags (a 1 s mean)
        out["gflop_per_j_mean_power"] = flops / 1e9 / (out["power_w"] * seconds)
    return out


def median_burst(trials):
    """The trial whose GFLOP/s is the median (the lower middle one of an even count), with
    every trial's GFLOP/s beside it: the figure, its clocks and its energy stay one run's."""
    ranked = sorted(trials, key=lambda t: t["gflops"])
    mid = dict(ranked[(len(ranked) - 1) // 2])
    mid["trials_gflops"] = [t["gflops"] for t in trials]
    return mid
