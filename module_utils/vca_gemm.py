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

    def _upload(self, a, b, c_shape):
        """Device buffers for A, B and C, and a read-back of C cut to (rows, cols)."""
        cl = self.cl
        mf = cl.mem_flags
        abuf = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=a)
        bbuf = cl.Buffer(self.ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=b)
        cbuf = cl.Buffer(self.ctx, mf.WRITE_ONLY, c_shape[0] * c_shape[1] * 4)

        def read_back(rows, cols):
            out = np.empty(c_shape, dtype=np.float32)
            cl.enqueue_copy(self.queue, out, cbuf)
            return out[:rows, :cols]

        return abuf, bbuf, cbuf, read_back

    def prepare(self, a, b, params, extra=()):
        """Pad to the tiles, upload, and return a callable that runs once and waits."""
        m, k = a.shape
        n = b.shape[1]
        mp, np_, kp = round_up(m, params["TM"]), round_up(n, params["TN"]), round_up(k, params["TK"])
        abuf, bbuf, cbuf, read_back = self._upload(padded(a, mp, kp), padded(b, kp, np_), (mp, np_))
        kernel = self._kernel(params, extra)
        local = (params["TN"] // params["WPTN"], params["TM"] // params["WPTM"])
        glob = (np_ // params["TN"] * local[0], mp // params["TM"] * local[1])
        steps = []
        if params.get("PACK") and not params["LMEM"]:
            mf = self.cl.mem_flags
            apbuf = self.cl.Buffer(self.ctx, mf.READ_WRITE, mp * kp * 4)
            bpbuf = self.cl.Buffer(self.ctx, mf.READ_WRITE, kp * np_ * 4)
            steps.append((self._kernel(params, extra, "pack_a"), (kp, mp // params["WPTM"]),
                          (np.int32(mp), np.int32(kp), abuf, apbuf)))
            steps.append((self._kernel(params, extra, "pack_b"), (kp, np_ // params["WPTN"]),
                          (np.int32(kp), np.int32(np_), bbuf, bpbuf)))
            abuf, bbuf = apbuf, bpbuf
        args = (np.int32(mp), np.int32(np_), np.int32(kp), abuf, bbuf, cbuf)

        def run():
            """One product, waited for; returns its device seconds (packing included)."""
            events = [pack(self.queue, size, None, *pack_args)     # packing is part of every timed run
                      for pack, size, pack_args in steps]
            events.append(kernel(self.queue, glob, local, *args))
            events[-1].wait()
            return event_seconds(events)

        return run, (lambda: read_back(m, n))

    def prepare_shipped(self, a, b):
        """The shipped kernel's way: one element per work-item, local size left to the runtime."""
        m, k = a.shape
        n = b.shape[1]
        abuf, bbuf, cbuf, read_back = self._upload(np.ascontiguousarray(a), np.ascontiguousarray(b), (m, n))
        kernel = self.cl.Kernel(self.cl.Program(self.ctx, self.shipped_source).build(), "sgemm_shipped")

        def run():
            event = kernel(self.queue, (n, m), None, np.int32(m), np.int32(n), np.int32(k), abuf, bbuf, cbuf)
            event.wait()
            return event_seconds([event])

        return run, (lambda: read_back(m, n))


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
