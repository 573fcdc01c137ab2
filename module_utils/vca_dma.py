# SPDX-License-Identifier: MIT
"""DMA probe control flow over /dev/vca_dma<N> (vca_dma_abi.Device, or anything with its methods).

Every figure is verified by content: the source is random 32-bit words, the destination starts
as their complement (so a word that never landed cannot match by luck), and after the copy the
words equal to the source are counted ("landed") and the others ("mismatched"). A figure
(MiB/s from the driver's elapsed_ns, plus wall time) is given only when every repeat had
status 0, bytes_done == length and no mismatched word; otherwise the figure is None and
`reason` says why.

A window copy cannot be read directly by this process, so it is verified by reading it back:
after a TO_TARGET copy into a window, the window is copied FROM_TARGET into a fresh buffer
(filled with the complement) and that is compared with what was sent. A FROM_TARGET (recv)
leg first writes the source into the window (untimed) and compares what comes back. Either
way a wrong word in either direction shows up as a mismatch; it cannot tell which direction
lost it.

Ring mode on one engine is a sequence of window copies in the ring's order, one at a time
(the driver allows one copy in flight per engine): hop a->b is a send into b's window when a is
this side, a recv from a's window when b is this side, else a relay through a local buffer
(FROM a, then TO b, times added). It measures each hop as this engine drives it; it does NOT
measure a pipelined ring with every node's engine copying at once, nor contention between hops.
"""

from __future__ import annotations

import ctypes
import errno
import glob
import mmap
import os
import statistics
import time

try:
    import numpy as np
except ImportError:   # finding engines needs no NumPy: a machine without one answers unsupported
    np = None

from . import vca_dma_abi as abi
from . import vca_ring_plan
from .vca_sysfs import Sysfs
from .vca_thermal import ThermalAbort

PLX_VENDOR = 0x10B5
PCI_DEVICES = "bus/pci/devices"
DEV_GLOB = "vca_dma[0-9]*"
UNSUPPORTED = "unsupported: no PLX DMA engine found"
DEFAULT_BYTES = 64 << 20
DEFAULT_REPEATS = 5
DEFAULT_TIMEOUT_MS = 5000
GONE_ERRNOS = (errno.ENODEV, errno.ENOENT)
SKIPPED_GONE = "skipped: engine gone"


class EngineGone(Exception):
    pass


class MissingNumPy(RuntimeError):
    pass


# ---------------------------------------------------------------------------------------- discovery

def _driver_of(sysfs, bdf):
    link = sysfs.check("%s/%s/driver" % (PCI_DEVICES, bdf))
    try:
        return os.path.basename(os.readlink(link))
    except OSError:
        return None


def find_engines(dev_root="/dev", sysfs_root="/sys"):
    """{engines: [paths], plx_functions: [{bdf, id, driver}], looked_for: [...], unsupported?}."""
    pattern = os.path.join(dev_root, DEV_GLOB)
    engines = sorted(glob.glob(pattern))
    sysfs = Sysfs(sysfs_root)
    plx = []
    for bdf in sysfs.listdir(PCI_DEVICES):
        try:
            vendor = int(sysfs.read("%s/%s/vendor" % (PCI_DEVICES, bdf)), 16)
        except (OSError, ValueError):
            continue
        if vendor != PLX_VENDOR:
            continue
        device = sysfs.read_optional("%s/%s/device" % (PCI_DEVICES, bdf)) or "?"
        plx.append({"bdf": bdf, "id": "%04x:%s" % (PLX_VENDOR, device.replace("0x", "")),
                    "driver": _driver_of(sysfs, bdf)})
    looked_for = ["%s: %s" % (pattern, ", ".join(engines) if engines else "none"),
                  "%s/*/vendor == 0x%04x: %d function(s)" % (os.path.join(sysfs.root, PCI_DEVICES), PLX_VENDOR,
                                                             len(plx))]
    for f in plx:
        if f["driver"] == "plx87xx_dma":
            looked_for.append("plx87xx_dma owns %s: bind vca_dma per docs/DMA.md" % f["bdf"])
        elif f["driver"] is None:
            looked_for.append("%s (%s) has no driver" % (f["bdf"], f["id"]))
        else:
            looked_for.append("%s owns %s (%s)" % (f["driver"], f["bdf"], f["id"]))
    out = {"engines": engines, "plx_functions": plx, "looked_for": looked_for}
    if not engines:
        out["unsupported"] = UNSUPPORTED
    return out


def open_device(path):
    """The real engine; tests replace this attribute with a fake."""
    return abi.Device(path)


# ------------------------------------------------------------------------------------------ buffers

class Buffer(object):
    """Page-aligned anonymous memory (mmap), viewed as uint32 words, with its address."""

    def __init__(self, length):
        self.length = length
        self.mm = mmap.mmap(-1, max(length, mmap.PAGESIZE))
        self._c = ctypes.c_char.from_buffer(self.mm)
        self.addr = ctypes.addressof(self._c)
        self.words = np.frombuffer(self.mm, dtype=np.uint32, count=length // 4)

    def close(self):
        self.words = None
        self._c = None
        try:
            self.mm.close()
        except BufferError:
            pass


def verify(src, dst):
    landed = int(np.count_nonzero(dst.words == src.words))
    return landed, int(src.words.size) - landed


def _reason(status, bytes_done, length, mismatched):
    if status == -errno.EINPROGRESS:
        return "timeout: status -EINPROGRESS"
    if status == -errno.EIO:
        return "engine error: status -EIO"
    if status != 0:
        return "status %d" % status
    if bytes_done != length:
        return "short copy: %d of %d bytes" % (bytes_done, length)
    if mismatched:
        return "%d mismatched words" % mismatched
    return None


# ----------------------------------------------------------------------------------------- the probe

class Probe(object):
    def __init__(self, dev, *, nbytes=DEFAULT_BYTES, repeats=DEFAULT_REPEATS, timeout_ms=DEFAULT_TIMEOUT_MS,
                 guard=None, seed=None):
        self.dev = dev
        self.info = dev.info()
        self.max_copy = int(self.info.max_copy_bytes)
        self.nbytes = nbytes - nbytes % 4
        self.repeats = repeats
        self.timeout_ms = timeout_ms
        self.guard = guard
        if np is None:
            raise MissingNumPy("the DMA probe needs NumPy on %s's machine (python3-numpy) to fill and"
                               " check its buffers" % dev.path)
        self.rng = np.random.default_rng(seed)
        self.gone = False
        self.windows = []

    def _ioctl(self, fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except OSError as exc:
            if exc.errno in GONE_ERRNOS:
                self.gone = True
                raise EngineGone("engine gone: %s" % os.strerror(exc.errno)) from None
            raise

    def read_windows(self):
        self.windows = []
        for i in range(int(self.info.n_windows)):
            w = self._ioctl(self.dev.window, i)
            self.windows.append({"index": i, "peer": w.peer, "bus_addr": w.bus_addr, "length": w.length})
        return self.windows

    def counters(self):
        return dict(self._ioctl(self.dev.counters)._asdict())

    def copy(self, buf, length, direction, kind, index=0, *, offset=0):
        """One logical copy, split into max_copy_bytes pieces: (status, bytes_done, elapsed_ns)."""
        done = elapsed = 0
        pos = 0
        while pos < length:
            n = min(self.max_copy, length - pos)
            c = self._ioctl(self.dev.submit, buf.addr + pos, n, direction=direction, target_kind=kind,
                            target_index=index, target_offset=offset + pos)
            w = self._ioctl(self.dev.wait, c.cookie, self.timeout_ms)
            done += w.bytes_done
            elapsed += w.elapsed_ns
            if w.status != 0 or w.bytes_done != n:
                return w.status, done, elapsed
            pos += n
        return 0, done, elapsed

    def _fresh(self, src):
        dst = Buffer(src.length)
        dst.words[:] = ~src.words
        return dst

    def leg(self, frm, to, length, timed):
        """Run `timed(src) -> (status, bytes_done, elapsed_ns, dst or None)` repeats times; a dict."""
        out = {"from": frm, "to": to, "bytes": length, "repeats": self.repeats, "mibps": None, "reason": None,
               "landed_words": None, "mismatched_words": None, "status": None, "wall_s": None}
        if self.gone:
            out["reason"] = SKIPPED_GONE
            return out
        if length < 4:
            out["reason"] = "window too small"
            return out
        src = Buffer(length)
        src.words[:] = self.rng.integers(0, 1 << 32, size=src.words.size, dtype=np.uint32)
        rates, walls = [], []
        try:
            for _ in range(self.repeats):
                t0 = time.monotonic()
                status, done, elapsed, dst = timed(src)
                walls.append(time.monotonic() - t0)
                out["status"] = status
                if dst is not None:
                    out["landed_words"], out["mismatched_words"] = verify(src, dst)
                    dst.close()
                reason = _reason(status, done, length, out["mismatched_words"])
                if reason is None and dst is None:
                    reason = "not verified"
                if reason is None and elapsed <= 0:
                    reason = "driver reported elapsed_ns %d" % elapsed
                if reason:
                    out["reason"] = reason
                    return out
                rates.append(length / (elapsed / 1e9) / (1 << 20))
        except EngineGone as exc:
            out["reason"] = str(exc)
            return out
        except OSError as exc:
            out["reason"] = "ioctl error: %s" % exc
            return out
        finally:
            src.close()
        out["mibps"] = round(statistics.median(rates), 1)
        out["wall_s"] = round(statistics.median(walls), 6)
        out["mibps_all"] = [round(r, 1) for r in rates]
        return out

    # legs ------------------------------------------------------------------------------------------

    def selftest_leg(self):
        def timed(src):
            dst = self._fresh(src)
            # TARGET_USER: target_offset is the second buffer's address (the header's rule).
            status, done, elapsed = self.copy(src, src.length, abi.DIR_TO_TARGET, abi.TARGET_USER, offset=dst.addr)
            return status, done, elapsed, dst
        return self.leg("local", "local", self.nbytes, timed)

    def _readback(self, src, index):
        dst = self._fresh(src)
        status, done, _ = self.copy(dst, src.length, abi.DIR_FROM_TARGET, abi.TARGET_WINDOW, index)
        return status, done, dst

    def send_timed(self, index):
        def timed(src):
            status, done, elapsed = self.copy(src, src.length, abi.DIR_TO_TARGET, abi.TARGET_WINDOW, index)
            if status != 0 or done != src.length:
                return status, done, elapsed, None
            rb_status, rb_done, dst = self._readback(src, index)
            if rb_status != 0 or rb_done != src.length:
                dst.close()
                return rb_status, rb_done, elapsed, None
            return status, done, elapsed, dst
        return timed

    def recv_timed(self, index):
        def timed(src):
            status, done, _ = self.copy(src, src.length, abi.DIR_TO_TARGET, abi.TARGET_WINDOW, index)
            if status != 0 or done != src.length:
                return status, done, 0, None
            dst = self._fresh(src)
            status, done, elapsed = self.copy(dst, src.length, abi.DIR_FROM_TARGET, abi.TARGET_WINDOW, index)
            return status, done, elapsed, dst
        return timed

    def relay_timed(self, a_index, b_index):
        def timed(src):
            status, done, _ = self.copy(src, src.length, abi.DIR_TO_TARGET, abi.TARGET_WINDOW, a_index)
            if status != 0 or done != src.length:
                return status, done, 0, None
            mid = self._fresh(src)
            try:
                status, done, e1 = self.copy(mid, src.length, abi.DIR_FROM_TARGET, abi.TARGET_WINDOW, a_index)
                if status != 0 or done != src.length:
                    return status, done, e1, None
                status, done, e2 = self.copy(mid, src.length, abi.DIR_TO_TARGET, abi.TARGET_WINDOW, b_index)
            finally:
                mid.close()
            if status != 0 or done != src.length:
                return status, done, e1 + e2, None
            rb_status, rb_done, dst = self._readback(src, b_index)
            if rb_status != 0 or rb_done != src.length:
                dst.close()
                return rb_status, rb_done, e1 + e2, None
            return status, done, e1 + e2, dst
        return timed

    def window_length(self, w):
        return min(self.nbytes, int(w["length"])) // 4 * 4


def peer_name(peer):
    return "host" if peer == abi.PEER_HOST else "node%d" % peer


def _node_of(name):
    return int(name[4:]) if isinstance(name, str) and name.startswith("node") else None


def plan_legs(mode, windows, *, node=None, order=None):
    """[(from, to, kind, window indices)] the mode would run; kind: selftest|send|recv|relay."""
    local = "local" if node is None else "node%d" % node
    if mode == "selftest":
        return [(local, local, "selftest", ())]
    first = {}
    for w in windows:
        first.setdefault(w["peer"], w["index"])
    legs = []
    if mode == "matrix":
        hosts = [w for w in windows if w["peer"] == abi.PEER_HOST]
        nodes = [w for w in windows if w["peer"] != abi.PEER_HOST]
        for w in hosts + nodes:
            legs.append((local, peer_name(w["peer"]), "send", (w["index"],)))
            legs.append((peer_name(w["peer"]), local, "recv", (w["index"],)))
        return legs
    order = list(order or [])
    for a, b in zip(order, order[1:] + order[:1], strict=True):
        if a == node:
            kind, idx = "send", (first.get(b),)
        elif b == node:
            kind, idx = "recv", (first.get(a),)
        else:
            kind, idx = "relay", (first.get(a), first.get(b))
        legs.append(("node%d" % a, "node%d" % b, kind, idx))
    return legs


def predictions(node_rates, dead=(), efficiency=vca_ring_plan.DEFAULT_EFFICIENCY):
    if not node_rates:
        return {}
    return {("node%d" % d["src"], "node%d" % d["dst"]): d["predicted_mib_s"]
            for d in vca_ring_plan.predict(node_rates, dead, efficiency)}


def run_legs(probe, legs, predicted=None):
    """Each planned leg measured; one failing never stops the others; after the engine vanished
    the rest are skipped. probe.guard.check() runs between legs (ThermalAbort propagates)."""
    results = []
    by_index = {w["index"]: w for w in probe.windows}
    for n, (frm, to, kind, idx) in enumerate(legs):
        if probe.guard is not None:
            try:
                probe.guard.check()
            except ThermalAbort as exc:
                # As vca_gemm: a run the guard stopped gives no figure at all.
                for r in results:
                    if r["mibps"] is not None:
                        r["mibps"], r["mibps_all"] = None, None
                        r["reason"] = "thermal abort: no figure"
                results += [{"from": f, "to": t, "kind": k, "mibps": None, "reason": "skipped: thermal abort"}
                            for f, t, k, _ in legs[n:]]
                exc.legs = results
                raise
        if kind == "selftest":
            r = probe.selftest_leg()
        elif None in idx and not probe.gone:
            r = {"from": frm, "to": to, "bytes": 0, "repeats": probe.repeats, "mibps": None,
                 "reason": "no window onto %s" % (to if kind == "send" else frm), "landed_words": None,
                 "mismatched_words": None, "status": None}
        else:
            length = min(probe.window_length(by_index[i]) for i in idx)
            if kind == "send":
                timed = probe.send_timed(idx[0])
            elif kind == "recv":
                timed = probe.recv_timed(idx[0])
            else:
                timed = probe.relay_timed(idx[0], idx[1])
            r = probe.leg(frm, to, length, timed)
        r["kind"] = kind
        r["windows"] = list(idx)
        if predicted and (frm, to) in predicted:
            r["predicted_mibps"] = predicted[(frm, to)]
        results.append(r)
    return results


def ring_order(order=None, node_rates=None, dead=(), efficiency=vca_ring_plan.DEFAULT_EFFICIENCY):
    """The given order, else the planner's; (order, plan or None)."""
    if order:
        return [int(n) for n in order], None
    if not node_rates:
        raise vca_ring_plan.PlanError("ring mode needs an order or node_rates")
    plan = vca_ring_plan.plan_ring(node_rates, dead, efficiency)
    return plan["order"], plan


def probe(dev, mode, *, nbytes=DEFAULT_BYTES, repeats=DEFAULT_REPEATS, timeout_ms=DEFAULT_TIMEOUT_MS, guard=None,
          node=None, order=None, node_rates=None, dead=(), efficiency=vca_ring_plan.DEFAULT_EFFICIENCY,
          check_mode=False, seed=None):
    """One run on one engine: {engine, windows, counters_before/after, plan, planned_legs, legs}.
    check_mode: INFO, WINDOW and COUNTERS only, never SUBMIT. A ThermalAbort propagates with .record
    (aborted=thermal, no figure in it)."""
    p = Probe(dev, nbytes=nbytes, repeats=repeats, timeout_ms=timeout_ms, guard=guard, seed=seed)
    info = dict(p.info._asdict())
    rec = {"engine": info, "mode": mode, "bytes_requested": nbytes, "bytes_per_copy_max": p.max_copy,
           "repeats": repeats, "timeout_ms": timeout_ms, "check_mode": check_mode}
    if info["abi_version"] != abi.ABI_VERSION:
        rec["warning"] = "driver ABI %d, this probe speaks %d" % (info["abi_version"], abi.ABI_VERSION)
    if info["flags"] & abi.INFO_FAULT_ARMED:
        rec["fault_armed"] = True
    rec["windows"] = p.read_windows()
    plan = None
    if mode == "ring":
        ring, plan = ring_order(order, node_rates, dead, efficiency)
        rec["order"] = ring
    else:
        ring = None
    if plan:
        rec["plan"] = plan
    predicted = predictions(node_rates, dead, efficiency) if node_rates else {}
    legs = plan_legs(mode, rec["windows"], node=node, order=ring)
    rec["planned_legs"] = [{"from": f, "to": t, "kind": k, "windows": list(i),
                            "predicted_mibps": predicted.get((f, t))} for f, t, k, i in legs]
    rec["counters_before"] = p.counters()
    if check_mode:
        return rec
    try:
        rec["legs"] = run_legs(p, legs, predicted)
    except ThermalAbort as exc:
        rec["legs"] = exc.legs
        rec["aborted"] = "thermal"
        rec["abort_reason"] = str(exc)
        exc.record = rec
        raise
    try:
        rec["counters_after"] = p.counters()
    except EngineGone as exc:
        rec["counters_after"] = None
        rec["counters_after_reason"] = str(exc)
    rec["engine_gone"] = p.gone
    return rec
