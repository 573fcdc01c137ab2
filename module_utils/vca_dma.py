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

Ring mode has two forms. The driver allows one copy in flight per engine, so a pipelined ring
is every node's engine sending its own hop at the same time:
- pipelined (`node` set): this engine runs only the hop its node SENDS (node -> its successor in
  the ring, through the window onto the successor), after waiting until `start_at` (epoch seconds,
  one value the playbook gives every node). Each leg carries the epoch start and end of every
  timed copy as this process saw it (`copies`, `started_at`, `ended_at`) and, from the driver's
  WAIT (ABI 2), when the engine was started on each piece (one SUBMIT, at most max_copy_bytes) and
  when the driver first saw it complete (`pieces`), so ring_overlap() can tell afterwards, from
  every node's record, whether all hops' engines really ran at once; a ring whose hops did not
  overlap is reported as NOT pipelined and gets no ring figure.
- sequential (`node` unset): every hop in the ring's order, one at a time on this engine, each a
  relay through a local buffer (FROM a's window, then TO b's, times added). It measures each hop
  as this engine drives it, not a pipelined ring, nor contention between hops.
Dead nodes are left out of the order, given or planned.
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
MAX_WAIT_S = 600          # the furthest start_at a pipelined ring hop waits for

# Epoch clock and sleep of the pipelined ring's start and of every timed copy's span; tests
# replace them (no real sleeping in tests).
clock = time.time
sleep = time.sleep


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


def _piece_span(w):
    """The driver's epoch span of one piece, engine started to completion seen; None where the
    driver reported none (ABI 1) or the piece did not complete."""
    if not w.start_real_ns or not w.done_real_ns:
        return None
    return [round(w.start_real_ns / 1e9, 6), round(w.done_real_ns / 1e9, 6)]


def _spans_into(leg, spans, pieces=()):
    """The epoch span of every timed copy of the leg, its first start and its last end; the
    driver's span of every piece (`pieces`, None if any piece has none)."""
    if spans:
        leg["copies"] = [[round(a, 6), round(b, 6)] for a, b in spans]
        leg["started_at"] = leg["copies"][0][0]
        leg["ended_at"] = leg["copies"][-1][1]
        leg["pieces"] = list(pieces) if pieces and None not in pieces else None


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
        self.clock = clock
        self.spans = []
        self.pieces = []        # per timed copy: the driver's [start, done] of each piece, or None
        self._pieces = None

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

    def timed_copy(self, *args, **kw):
        """copy() whose epoch span (start, end) is kept for the leg's `copies`, and the driver's
        span of each of its pieces for the leg's `pieces`."""
        t0 = self.clock()
        self._pieces = []
        try:
            return self.copy(*args, **kw)
        finally:
            self.spans.append((t0, self.clock()))
            self.pieces.extend(self._pieces)
            self._pieces = None

    def copy(self, buf, length, direction, kind, index=0, *, offset=0):
        """One logical copy, split into max_copy_bytes pieces: (status, bytes_done, elapsed_ns)."""
        done = elapsed = 0
        pos = 0
        while pos < length:
            n = min(self.max_copy, length - pos)
            c = self._ioctl(self.dev.submit, buf.addr + pos, n, direction=direction, target_kind=kind,
                            target_index=index, target_offset=offset + pos)
            w = self._ioctl(self.dev.wait, c.cookie, self.timeout_ms)
            if self._pieces is not None:
                self._pieces.append(_piece_span(w))
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
        self.spans, self.pieces = [], []
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
            _spans_into(out, self.spans, self.pieces)
        out["mibps"] = round(statistics.median(rates), 1)
        out["wall_s"] = round(statistics.median(walls), 6)
        out["mibps_all"] = [round(r, 1) for r in rates]
        return out

    # legs ------------------------------------------------------------------------------------------

    def selftest_leg(self):
        def timed(src):
            dst = self._fresh(src)
            # TARGET_USER: target_offset is the second buffer's address (the header's rule).
            status, done, elapsed = self.timed_copy(src, src.length, abi.DIR_TO_TARGET, abi.TARGET_USER,
                                                    offset=dst.addr)
            return status, done, elapsed, dst
        return self.leg("local", "local", self.nbytes, timed)

    def _readback(self, src, index):
        dst = self._fresh(src)
        status, done, _ = self.copy(dst, src.length, abi.DIR_FROM_TARGET, abi.TARGET_WINDOW, index)
        return status, done, dst

    def send_timed(self, index):
        def timed(src):
            status, done, elapsed = self.timed_copy(src, src.length, abi.DIR_TO_TARGET, abi.TARGET_WINDOW, index)
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
            status, done, elapsed = self.timed_copy(dst, src.length, abi.DIR_FROM_TARGET, abi.TARGET_WINDOW, index)
            return status, done, elapsed, dst
        return timed

    def relay_timed(self, a_index, b_index):
        def timed(src):
            status, done, _ = self.copy(src, src.length, abi.DIR_TO_TARGET, abi.TARGET_WINDOW, a_index)
            if status != 0 or done != src.length:
                return status, done, 0, None
            mid = self._fresh(src)
            try:
                status, done, e1 = self.timed_copy(mid, src.length, abi.DIR_FROM_TARGET, abi.TARGET_WINDOW, a_index)
                if status != 0 or done != src.length:
                    return status, done, e1, None
                status, done, e2 = self.timed_copy(mid, src.length, abi.DIR_TO_TARGET, abi.TARGET_WINDOW, b_index)
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
        if node is None:
            # Sequential: every hop from this side, relayed through a local buffer.
            legs.append(("node%d" % a, "node%d" % b, "relay", (first.get(a), first.get(b))))
        elif a == node:
            # Pipelined: only the hop this node sends, into its successor's window (none when
            # this node is not in the ring).
            legs.append(("node%d" % a, "node%d" % b, "send", (first.get(b),)))
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
    """The given order less its dead nodes, else the planner's (which skips them); (order, plan or None)."""
    if order:
        given = [int(n) for n in order]
        if len(set(given)) != len(given):
            raise vca_ring_plan.PlanError("ring order %s names a node twice" % given)
        dead = set(int(d) for d in dead)
        live = [n for n in given if n not in dead]
        if len(live) < 2:
            raise vca_ring_plan.PlanError("a ring needs at least two live nodes, got %s" % live)
        return live, None
    if not node_rates:
        raise vca_ring_plan.PlanError("ring mode needs an order or node_rates")
    plan = vca_ring_plan.plan_ring(node_rates, dead, efficiency)
    return plan["order"], plan


def check_start_at(start_at, *, max_wait_s=MAX_WAIT_S):
    """The epoch `clock` now; ValueError when start_at is more than max_wait_s ahead of it."""
    now = clock()
    if start_at - now > max_wait_s:
        raise ValueError("start_at is %.1f s away, more than %d s" % (start_at - now, max_wait_s))
    return now


def wait_until(start_at, *, max_wait_s=MAX_WAIT_S):
    """Sleep (module attribute `sleep`) until the epoch `clock` reaches start_at; never sleeps
    longer than max_wait_s in all (a start further away raises ValueError before any sleep).
    {start_at, waited_s, late_s}: late_s > 0 when start_at had already passed."""
    now = check_start_at(start_at, max_wait_s=max_wait_s)
    t0 = now
    while now < start_at:
        sleep(start_at - now)
        now = clock()
    return {"start_at": start_at, "waited_s": round(now - t0, 6), "late_s": round(now - start_at, 6)}


def _union(spans):
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _intersect(xs, ys):
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if a < b:
            out.append([a, b])
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _hop_name(a, b):
    return "%s->%s" % (a, b)


def ring_hops(results):
    """The pipelined ring's hops from every machine's module result ({host: result}):
    (hops, orders, notes), notes saying why a machine has no pipelined ring record."""
    hops, orders, notes = [], [], []
    for host in sorted(results):
        result = results[host] or {}
        engines = [e for e in (result.get("record") or {}).get("engines") or [] if e.get("ring") == "pipelined"]
        if not engines:
            why = ("aborted (%s)" % result["aborted"]) if result.get("aborted") else result.get("msg")
            notes.append("%s: %s" % (host, why or "no pipelined ring record"))
        for eng in engines:
            orders.append(tuple(eng.get("order") or ()))
            if eng.get("ring_note"):
                notes.append("%s: %s" % (host, eng["ring_note"]))
            for leg in eng.get("legs") or []:
                hops.append(dict(leg, host=host))
    return hops, orders, notes


def ring_overlap(results):
    """Did every hop of one pipelined ring run at once, and the ring's figure if so.

    results: {host: vca_dma result} of a ring run with `node` set on every node. The ring is
    pipelined only if every hop of the order ran and was verified (a figure), the hops' spans
    (first timed copy's start to last one's end) share a common interval, and, by the drivers' own
    per-piece spans (engine started to completion seen), there was an instant when every hop's
    engine had a piece in flight (all_in_flight_s > 0). Only then is
    ring_mibps given: the bytes of the slowest hop (the least, if hops differ) over the longest hop's
    copy time (bytes / its median MiB/s), i.e. the ring runs at its slowest hop. The times are each
    machine's epoch clock: the check is only as good as their synchronisation (docs/DMA.md).
    """
    hops, orders, notes = ring_hops(results)
    out = {"order": None, "hops": [], "missing": [], "common_span_s": None, "all_in_flight_s": 0.0,
           "overlapped": False, "pipelined": False, "ring_mibps": None, "slowest_hop": None, "reason": None,
           "notes": notes}
    if not orders:
        out["reason"] = "no pipelined ring ran"
        return out
    if len(set(orders)) != 1:
        out["reason"] = "the machines disagree on the ring order: %s" % sorted(set(orders))
        return out
    order = list(orders[0])
    out["order"] = order
    expected = [_hop_name("node%d" % a, "node%d" % b) for a, b in zip(order, order[1:] + order[:1], strict=True)]
    by_name = {}
    for h in hops:
        by_name.setdefault(_hop_name(h["from"], h["to"]), []).append(h)
    for name in expected:
        for h in by_name.get(name, []):
            out["hops"].append({"hop": name, "host": h["host"], "bytes": h.get("bytes"), "mibps": h.get("mibps"),
                                "predicted_mibps": h.get("predicted_mibps"), "reason": h.get("reason"),
                                "started_at": h.get("started_at"), "ended_at": h.get("ended_at"),
                                "pieces": len(h.get("pieces") or ())})
    out["missing"] = [name for name in expected if name not in by_name]
    twice = sorted(name for name in expected if len(by_name.get(name, [])) > 1)
    spans = [h for h in hops if h.get("started_at") is not None and _hop_name(h["from"], h["to"]) in expected]
    if spans and len(spans) == len(out["hops"]):
        out.update(_overlap(spans))
    _verdict(out, twice)
    return out


def _overlap(spans):
    """The legs' spans' common interval, and how long every leg's engine had a piece in flight at
    once, from the driver's per-piece spans (no_pieces names the legs without any: an ABI 1 driver)."""
    common = min(h["ended_at"] for h in spans) - max(h["started_at"] for h in spans)
    out = {"common_span_s": round(common, 6), "overlapped": common > 0, "all_in_flight_s": 0.0}
    if any(not h.get("pieces") for h in spans):
        out["no_pieces"] = sorted(_hop_name(h["from"], h["to"]) for h in spans if not h.get("pieces"))
        return out
    inflight = _union(spans[0]["pieces"])
    for h in spans[1:]:
        inflight = _intersect(inflight, _union(h["pieces"]))
    out["all_in_flight_s"] = round(sum(b - a for a, b in inflight), 6)
    return out


def _verdict(out, twice):
    """pipelined, ring_mibps and slowest_hop, or the reason there are none."""
    failed = [h for h in out["hops"] if h["mibps"] is None]
    if out["missing"]:
        out["reason"] = "hop(s) %s did not run" % ", ".join(out["missing"])
    elif twice:
        out["reason"] = "hop(s) %s ran more than once" % ", ".join(twice)
    elif failed:
        out["reason"] = "; ".join("%s gave no figure (%s)" % (h["hop"], h["reason"]) for h in failed)
    elif not out["overlapped"]:
        out["reason"] = "the hops did not overlap (common span %s s)" % out["common_span_s"]
    elif out.get("no_pieces"):
        out["reason"] = ("hop(s) %s have no per-piece spans from the driver (it needs ABI 2): no instant with"
                         " every engine busy can be shown" % ", ".join(out.get("no_pieces") or ()))
    elif out["all_in_flight_s"] <= 0:
        out["reason"] = "the hops' spans overlap but no instant had every hop's engine on a piece"
    else:
        slowest = max(out["hops"], key=lambda h: h["bytes"] / h["mibps"])
        nbytes = min(h["bytes"] for h in out["hops"])
        out["slowest_hop"] = slowest["hop"]
        out["ring_mibps"] = round(nbytes / (slowest["bytes"] / slowest["mibps"]), 1)
        out["pipelined"] = True


def probe(dev, mode, *, nbytes=DEFAULT_BYTES, repeats=DEFAULT_REPEATS, timeout_ms=DEFAULT_TIMEOUT_MS, guard=None,
          node=None, order=None, node_rates=None, dead=(), efficiency=vca_ring_plan.DEFAULT_EFFICIENCY,
          check_mode=False, seed=None, start_at=None, max_wait_s=MAX_WAIT_S):
    """One run on one engine: {engine, windows, counters_before/after, plan, planned_legs, legs}.
    check_mode: INFO, WINDOW and COUNTERS only, never SUBMIT. A ThermalAbort propagates with .record
    (aborted=thermal, no figure in it). Ring mode with `node` set runs that node's hop of a
    pipelined ring, first waiting until `start_at` (epoch seconds) when given: rec['start']."""
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
        rec["ring"] = "sequential" if node is None else "pipelined"
        rec["skipped_dead"] = sorted(int(d) for d in dead)
        if node is not None and node not in ring:
            rec["ring_note"] = "node%d is not in the ring %s: no hop to send" % (node, ring)
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
    if rec.get("ring") == "pipelined":
        rec["start"] = wait_until(start_at, max_wait_s=max_wait_s) if start_at is not None else {
            "start_at": None, "waited_s": 0.0, "late_s": None}
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
