"""The C driver itself: modules_c/vca_dma/vca_dma.c, compiled unchanged by gcc in user space against
tests/vca_dma_harness (kernel APIs as pthreads, memcpy and recording fakes), and driven through its
own file_operations with ctypes. Every ioctl buffer is packed by vca_dma_abi, so the Python ABI is
exercised against the compiled driver too.

The engine is a strict model of the PEX87xx channel as the two public drivers of it program it
(harness.c says what it enforces): write-back only when enabled, latched write-1-to-clear status,
configuration bits 29:13 that a write must keep, an error for any address that is not a live DMA
mapping, no memory traffic once bus mastering is off, and an abort that can be made never to finish.

Not covered here: real page pinning and IOMMU mapping (fake pages are user addresses), the engine's
real timing, misc_open()'s locking, module refcounts, sysfs; tests/test_vca_dma_qemu.py runs the
module in a real kernel."""

from __future__ import annotations

import ctypes
import errno
import shutil
import subprocess
import threading
import time

import pytest
from ansible.module_utils import vca_dma_abi as abi

from conftest import ROOT

HARNESS = ROOT / "tests" / "vca_dma_harness"
DRIVER = ROOT / "modules_c" / "vca_dma"
PROMPT_S = 5.0           # generous: a loaded machine must never fail these
NT_BAR2 = 0x3800000000   # the fake PLX NT function's BAR 2 (harness.c)
IOVA_BASE = 0x500000000000
U64P = ctypes.POINTER(ctypes.c_uint64)
CTRL, INTR = 0x38, 0x3C                 # channel registers (vca_dma_regs.h)
CTRL_CFG = 0x0C0A6000                   # bits 29:13 as the harness's firmware left them
CTRL_CFG_MASK = 0x3FFFE000
INTR_STATUS = 0x003F0000


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is missing: the driver harness compiles vca_dma.c")
    out = tmp_path_factory.mktemp("harness") / "libvcadma.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-pthread", "-O1", "-g", "-Wall", "-Werror",
                    "-Wno-address-of-packed-member", "-I", str(HARNESS / "include"), "-I", str(HARNESS),
                    "-I", str(DRIVER), "-I", str(DRIVER / "include"), "-I", str(DRIVER / "include" / "uapi"),
                    "-o", str(out), str(HARNESS / "harness.c")], check=True)
    h = ctypes.CDLL(str(out))
    h.h_open.restype = h.h_early_file.restype = ctypes.c_void_p
    h.h_open.argtypes = [ctypes.POINTER(ctypes.c_int)]
    h.h_ioctl.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p]
    h.h_ioctl.restype = ctypes.c_long
    h.h_release.argtypes = [ctypes.c_void_p]
    h.h_get.restype = ctypes.c_longlong
    h.h_load.argtypes = [ctypes.c_char_p]
    h.h_set.argtypes = [ctypes.c_char_p, ctypes.c_int]
    h.h_get.argtypes = [ctypes.c_char_p]
    h.h_reg.argtypes = [ctypes.c_uint32]
    h.h_reg.restype = ctypes.c_uint32
    h.h_parse_window.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_int32), U64P, U64P]
    h.h_win_phys.argtypes = [ctypes.c_uint64, ctypes.c_uint64, U64P]
    h.h_split.argtypes = [U64P, ctypes.c_int, U64P, ctypes.c_int, U64P, ctypes.c_int]
    return h


class Driver(object):
    """One load of the module with one engine bound (unless probe fails), and its files."""

    def __init__(self, lib):
        self.lib = lib
        self.buffers = []

    def set(self, what, value):
        self.lib.h_set(what.encode(), value)

    def get(self, what):
        return self.lib.h_get(what.encode())

    def load(self, windows=None):
        enc = None if windows is None else ctypes.create_string_buffer(windows.encode())
        self.buffers.append(enc)     # the driver keeps the parameter string
        return self.lib.h_load(enc)

    def open(self):
        err = ctypes.c_int(0)
        f = self.lib.h_open(ctypes.byref(err))
        return f if f else err.value

    def ioctl(self, f, cmd, layout, **fields):
        """(return value, the struct the driver wrote back)."""
        buf = layout.pack(**fields)
        cbuf = (ctypes.c_char * len(buf)).from_buffer(buf)
        ret = self.lib.h_ioctl(f, cmd, ctypes.addressof(cbuf))
        del cbuf
        return ret, layout.unpack(buf)

    def user_buffer(self, n):
        """Page-aligned: one descriptor per page on the user side."""
        b = ctypes.create_string_buffer(n + 4096)
        self.buffers.append(b)
        return (ctypes.addressof(b) + 4095) & ~4095

    def submit_user(self, f, n=4096, src=None, dst=None):
        src = self.user_buffer(n) if src is None else src
        dst = self.user_buffer(n) if dst is None else dst
        return self.ioctl(f, abi.IOC_SUBMIT, abi.COPY, flags=abi.DIR_TO_TARGET, user_addr=src, length=n,
                          target_kind=abi.TARGET_USER, target_offset=dst)

    def submit_window(self, f, offset=0x100, n=4096, index=0):
        return self.ioctl(f, abi.IOC_SUBMIT, abi.COPY, flags=abi.DIR_TO_TARGET, user_addr=self.user_buffer(n),
                          length=n, target_kind=abi.TARGET_WINDOW, target_index=index, target_offset=offset)

    def wait(self, f, cookie, timeout_ms=PROMPT_S * 1000, **kw):
        return self.ioctl(f, abi.IOC_WAIT, abi.WAIT, cookie=cookie, timeout_ms=int(timeout_ms), **kw)

    def doorbell(self, f, device, value, **kw):
        return self.ioctl(f, abi.IOC_DOORBELL, abi.DOORBELL, device=device, value=value, **kw)[0]

    def _rows(self, count, read, *types):
        """Each row of a harness record (count: its length's name), read through read(i, &cell...)."""
        out = []
        for i in range(self.get(count)):
            cells = [t() for t in types]
            read(i, *map(ctypes.byref, cells))
            out.append(tuple(c.value for c in cells))
        return out

    def descriptors(self):
        """(source, destination, length) of each descriptor the driver wrote."""
        return self._rows("ndesc", self.lib.h_desc, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32)

    def maps(self):
        """(physical address, length, DMA address) of each dma_map_resource() call."""
        return self._rows("nmap", self.lib.h_map, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64)


@pytest.fixture
def drv(lib):
    lib.h_reset()
    d = Driver(lib)
    yield d
    d.set("hold", 0)
    lib.h_reset()


@pytest.fixture
def bound(drv):
    assert drv.load("host@0x3800100000+0x100000") == 0
    assert drv.lib.h_probe() == 0
    return drv


def filled(drv, n, seed):
    """A page-aligned user buffer of n bytes of a known pattern, and its address."""
    addr = drv.user_buffer(n)
    data = bytes((seed + 7 * i) & 0xFF for i in range(n))
    ctypes.memmove(addr, data, n)
    return addr, data


def in_thread(fn, *args):
    box = {}

    def run():
        box["t0"] = time.monotonic()
        box["ret"] = fn(*args)
        box["t1"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def held_wait(drv):
    """File A submits a copy the engine holds, and WAITs for it (60 s) in a thread, which has started."""
    drv.set("hold", 1)
    a = drv.open()
    ret, c = drv.submit_user(a)
    assert ret == 0
    t, box = in_thread(drv.wait, a, c.cookie, abi.WAIT_MAX_MS)
    time.sleep(0.2)
    assert t.is_alive(), "WAIT returned although the engine holds the copy: %r" % box
    return a, c, t, box


# ------------------------------------------------------------- (a) WAIT sleeps without the engine lock

def test_submit_from_another_file_is_ebusy_while_a_wait_sleeps(bound):
    _, _, t, box = held_wait(bound)
    b = bound.open()
    t0 = time.monotonic()
    ret, _ = bound.submit_user(b)
    assert ret == -errno.EBUSY and time.monotonic() - t0 < PROMPT_S
    t0 = time.monotonic()
    assert bound.lib.h_release(b) == 0 and time.monotonic() - t0 < PROMPT_S
    bound.set("hold", 0)
    t.join(PROMPT_S)
    ret, w = box["ret"]
    assert ret == 0 and w.status == 0 and w.bytes_done == 4096


def test_remove_ends_a_sleeping_wait_promptly_with_enodev(bound):
    _, _, t, box = held_wait(bound)
    t0 = time.monotonic()
    bound.lib.h_unload()                        # module exit: remove() under the hood
    assert time.monotonic() - t0 < PROMPT_S
    t.join(PROMPT_S)
    assert not t.is_alive() and box["ret"][0] == -errno.ENODEV
    assert bound.get("regs_after_release") == 0


def test_a_signal_ends_a_sleeping_wait_with_eintr_and_the_copy_stays(bound):
    a, c, t, box = held_wait(bound)
    bound.set("signal", 1)
    t.join(PROMPT_S)
    assert not t.is_alive() and box["ret"][0] == -errno.EINTR
    bound.set("signal", 0)
    bound.set("hold", 0)
    ret, w = bound.wait(a, c.cookie)
    assert ret == 0 and w.status == 0


def test_a_wait_longer_than_the_maximum_is_refused(bound):
    a = bound.open()
    ret, c = bound.submit_user(a)
    assert bound.wait(a, c.cookie, abi.WAIT_MAX_MS + 1)[0] == -errno.EINVAL
    assert bound.wait(a, c.cookie, 0xFFFFFFFF)[0] == -errno.EINVAL
    ret, w = bound.wait(a, c.cookie)
    assert ret == 0 and w.status == 0


# ----------------------------------------------------------- (b) windows: inside a BAR, mapped, used

def test_a_window_inside_a_plx_bar_is_mapped_and_the_mapped_address_is_in_the_descriptor(bound):
    phys = NT_BAR2 + 0x100000
    assert bound.maps() == [(phys, 0x100000, phys + IOVA_BASE)]
    f = bound.open()
    ret, c = bound.submit_window(f, offset=0x100)
    assert ret == 0 and bound.wait(f, c.cookie)[1].status == 0
    (_, dst, n), = bound.descriptors()
    assert dst == phys + IOVA_BASE + 0x100 and n == 4096
    ret, w = bound.ioctl(f, abi.IOC_WINDOW, abi.WINDOW, index=0)
    assert ret == 0 and w.bus_addr == phys        # WINDOW reports what was configured
    bound.lib.h_unload()
    assert bound.get("nunmap") == 1


@pytest.mark.parametrize("windows", ["host@0x100000+0x1000",            # host RAM
                                     "host@0x4000000000+0x1000",         # a BAR, but not a PLX function's
                                     "host@0xf0000000+0x1000",           # the engine's own registers
                                     "0@0x380ffff000+0x2000"])           # runs past the end of the BAR
def test_a_window_outside_every_plx_bar_refuses_the_probe_and_maps_nothing(drv, windows):
    assert drv.load(windows) == 0
    assert drv.lib.h_probe() == -errno.EINVAL
    assert drv.get("nmap") == 0


def test_a_failed_window_mapping_fails_the_probe_and_unmaps_the_ones_before(drv):
    assert drv.load("host@0x3800000000+0x1000,1@0x3800001000+0x1000") == 0
    drv.set("map_fail", 2)
    assert drv.lib.h_probe() == -errno.ENOMEM
    assert drv.get("nmap") == 1 and drv.get("nunmap") == 1


# ------------------------------------------------------------------------------- (c) CAP_SYS_RAWIO

def test_open_needs_cap_sys_rawio(bound):
    bound.set("cap", 0)
    assert bound.open() == -errno.EPERM


def test_a_descriptor_passed_to_a_process_without_cap_sys_rawio_moves_nothing(bound):
    f = bound.open()
    bound.set("cap", 0)
    assert bound.submit_user(f)[0] == -errno.EPERM
    assert bound.submit_window(f)[0] == -errno.EPERM
    assert bound.doorbell(f, 1, 0x1234) == -errno.EPERM
    assert bound.ioctl(f, abi.IOC_INFO, abi.INFO)[0] == 0          # reading is still allowed
    assert bound.get("ndesc") == 0 and bound.get("rings") == 0


# ---------------------------------------------------------------- (d) probe unwind, DOORBELL checks

@pytest.mark.parametrize("knob", ["ring_alloc_fail", "misc_fail"])
def test_a_failed_probe_frees_what_it_took_and_leaves_bus_mastering_off(drv, knob):
    assert drv.load() == 0
    drv.set(knob, 1)
    assert drv.lib.h_probe() < 0
    assert drv.get("coherent_live") == 0 and drv.get("bus_master") == 0
    assert drv.get("regs_after_release") == 0


@pytest.mark.parametrize("device,value,reserved", [(-1, 1, 0), (16, 1, 0), (1 << 20, 1, 0), (1, 0, 0), (1, 1, 7)])
def test_doorbell_with_a_bad_index_or_value_is_refused(bound, device, value, reserved):
    f = bound.open()
    assert bound.doorbell(f, device, value, reserved=reserved) == -errno.EINVAL
    assert bound.get("rings") == 0


def test_doorbell_rings_in_range_and_not_after_the_engine_is_gone(bound):
    f = bound.open()
    assert bound.doorbell(f, 15, 0xCAFE) == 0
    assert (bound.get("rings"), bound.get("ring_device"), bound.get("ring_value")) == (1, 15, 0xCAFE)
    bound.lib.h_unload()
    assert bound.doorbell(f, 15, 0xCAFE) == -errno.ENODEV
    assert bound.get("rings") == 1


# ------------------------------------------------------------------------------- (e) per-copy spans

def test_wait_reports_when_the_driver_started_and_saw_the_copy_complete(bound):
    bound.set("delay_us", 30000)                  # each descriptor takes 30 ms
    f = bound.open()
    before = time.time_ns()
    ret, c = bound.submit_window(f, n=8192)
    ret, w = bound.wait(f, c.cookie)
    after = time.time_ns()
    assert ret == 0 and w.status == 0 and len(bound.descriptors()) == 2
    assert before <= w.start_real_ns < w.done_real_ns <= after
    assert w.done_real_ns - w.start_real_ns >= 2 * 30e6 * 0.9
    assert abs((w.done_real_ns - w.start_real_ns) - w.elapsed_ns) < 5e6


def test_an_engine_error_ends_the_wait_with_eio_and_no_completion_time(bound):
    bound.set("hole", 2)                          # the target's only page is not mapped
    f = bound.open()
    ret, c = bound.submit_user(f)
    ret, w = bound.wait(f, c.cookie)
    assert ret == 0 and w.status == -errno.EIO and w.start_real_ns > 0 and w.done_real_ns == 0
    assert bound.ioctl(f, abi.IOC_COUNTERS, abi.COUNTERS)[1].errors == 1


def test_a_version_1_wait_still_works_and_gets_no_spans(bound):
    f = bound.open()
    ret, c = bound.submit_user(f)
    ret, w = bound.wait(f, c.cookie, size=abi.WAIT.size_v1)
    assert ret == 0 and w.status == 0 and w.start_real_ns == 0 and w.done_real_ns == 0


def test_an_unfinished_copy_has_a_start_but_no_completion(bound):
    bound.set("hold", 1)
    f = bound.open()
    ret, c = bound.submit_user(f)
    ret, w = bound.wait(f, c.cookie, 0)
    assert ret == 0 and w.status == -errno.EINPROGRESS and w.start_real_ns > 0 and w.done_real_ns == 0


# ------------------------------------------- (f) the engine as the reference drivers program it

def test_a_copy_completes_only_by_write_back_and_the_data_lands(bound):
    f = bound.open()
    src, data = filled(bound, 8192, 3)
    dst = bound.user_buffer(8192)
    ret, c = bound.submit_user(f, 8192, src=src, dst=dst)
    assert ret == 0
    ret, w = bound.wait(f, c.cookie)
    assert ret == 0 and w.status == 0 and w.bytes_done == 8192
    assert ctypes.string_at(dst, 8192) == data
    assert bound.get("starts") == 1 and bound.get("bad_mode") == 0


def test_no_register_write_changes_the_firmwares_ctrl_bits_29_to_13(bound):
    f = bound.open()
    _, c = bound.submit_user(f)
    assert bound.wait(f, c.cookie)[1].status == 0
    bound.set("hold", 1)                          # and a copy that is aborted
    _ret, c = bound.submit_user(f)
    assert bound.wait(f, c.cookie, 50)[1].status == -errno.EINPROGRESS
    assert bound.get("aborts") == 1
    bound.lib.h_unload()
    assert bound.get("cfg_clobbered") == 0
    assert bound.lib.h_reg(CTRL) & CTRL_CFG_MASK == CTRL_CFG


def test_status_a_previous_owner_left_latched_is_acknowledged_and_copies_work(drv):
    drv.lib.h_latch()                             # INTR ERROR|INVALID, CTRL header log
    assert drv.load() == 0 and drv.lib.h_probe() == 0
    assert drv.lib.h_reg(INTR) & INTR_STATUS == 0
    f = drv.open()
    for _ in range(2):
        ret, c = drv.submit_user(f)
        ret, w = drv.wait(f, c.cookie)
        assert ret == 0 and w.status == 0 and w.bytes_done == 4096


def test_bytes_done_is_what_the_engine_wrote_back(bound):
    bound.set("wb_short", 4)                      # the engine says each descriptor moved 4 bytes less
    f = bound.open()
    ret, c = bound.submit_user(f, 8192)
    ret, w = bound.wait(f, c.cookie)
    assert ret == 0 and w.bytes_done == 8192 - 2 * 4


def test_a_bad_address_fails_the_copy_with_the_bytes_before_it_and_the_next_copy_works(bound):
    bound.set("hole", 4)                          # the target's second page is not mapped
    f = bound.open()
    ret, c = bound.submit_user(f, 8192)
    ret, w = bound.wait(f, c.cookie)
    assert ret == 0 and w.status == -errno.EIO and w.bytes_done == 4096
    assert bound.get("bad_addr") == 1 and bound.get("aborts") == 0     # it stopped: nothing to abort
    assert bound.ioctl(f, abi.IOC_COUNTERS, abi.COUNTERS)[1].errors == 1
    ret, c = bound.submit_user(f, 8192)
    ret, w = bound.wait(f, c.cookie)
    assert ret == 0 and w.status == 0 and w.bytes_done == 8192


def test_a_window_whose_bar_does_not_answer_fails_the_copy(drv):
    drv.set("window_dead", 1)
    assert drv.load("host@0x3800100000+0x100000") == 0 and drv.lib.h_probe() == 0
    f = drv.open()
    ret, c = drv.submit_window(f)
    ret, w = drv.wait(f, c.cookie)
    assert ret == 0 and w.status == -errno.EIO and w.bytes_done == 0


def test_the_self_test_copies_through_the_engine_and_compares(bound):
    assert bound.lib.h_selftest() == 0
    assert bound.get("ndesc") == 1 and bound.get("coherent_live") == 1     # the ring only


def test_registers_that_read_all_ones_are_no_status_and_no_abort_done(bound):
    f = bound.open()
    bound.set("dead", 1)                          # the function stopped answering
    ret, c = bound.submit_user(f)
    assert ret == 0
    ret, w = bound.wait(f, c.cookie, 0)
    assert w.status == -errno.EINPROGRESS         # not -EIO: all ones is no status
    ret, w = bound.wait(f, c.cookie, 50)
    assert w.status == -errno.EINPROGRESS
    assert bound.submit_user(f)[0] == -errno.ENODEV   # the abort was not trusted: engine disabled


# ---------------------------------------------------------------------- (g) lifetimes under unbind

def test_remove_with_a_wedged_engine_clears_bus_mastering_first_and_keeps_what_it_may_write(bound):
    bound.set("abort_never", 1)
    _a, _c, t, box = held_wait(bound)
    bound.lib.h_unload()
    t.join(PROMPT_S)
    assert not t.is_alive() and box["ret"][0] == -errno.ENODEV
    assert bound.get("bus_master") == 0 and bound.get("master_at_free") == 0
    assert bound.get("coherent_live") == 1 and bound.get("sg_live") == 2    # ring and buffers kept
    bound.set("abort_never", 0)                   # the engine finally finishes what it held
    bound.set("hold", 0)
    deadline = time.monotonic() + PROMPT_S
    while bound.get("dma_dropped") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bound.get("dma_dropped") >= 1          # bus mastering off: nothing reached memory
    assert bound.get("late_writes") == 0 and bound.get("write_after_free") == 0


def test_remove_with_an_idle_engine_frees_everything_after_bus_mastering_is_off(bound):
    f = bound.open()
    _ret, c = bound.submit_user(f)
    assert bound.wait(f, c.cookie)[1].status == 0
    bound.lib.h_unload()
    assert bound.get("coherent_live") == 0 and bound.get("sg_live") == 0
    assert bound.get("master_at_free") == 0 and bound.get("nunmap") == 1


def test_submit_pins_without_the_engine_lock_and_rechecks_after(bound):
    bound.set("pin_block", 1)                     # the user buffer's fault blocks (userfaultfd, FUSE)
    a, b = bound.open(), bound.open()
    try:
        t, box = in_thread(bound.submit_user, a)
        deadline = time.monotonic() + PROMPT_S
        while not bound.get("pinning") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bound.get("pinning")
        u, _ = in_thread(bound.lib.h_release, b)      # another file's release goes through
        u.join(PROMPT_S)
        assert not u.is_alive()
        u, _ubox = in_thread(bound.lib.h_unload)           # and so does remove()
        u.join(PROMPT_S)
        assert not u.is_alive()
    finally:
        bound.set("pin_block", 0)
    t.join(PROMPT_S)
    assert box["ret"][0] == -errno.ENODEV                  # the engine went while it pinned
    assert bound.get("sg_live") == 0 and bound.get("ndesc") == 0


def test_a_pin_whose_life_user_space_controls_is_longterm(bound):
    f = bound.open()
    ret, _c = bound.submit_user(f)
    assert ret == 0 and bound.get("pins") == 2 and bound.get("pin_longterm") == 2


@pytest.mark.parametrize("knob", ["pin_fail", "sg_map_fail"])
def test_a_failed_pin_or_map_leaves_nothing_mapped_and_the_engine_free(bound, knob):
    f = bound.open()
    bound.set(knob, 1)
    assert bound.submit_user(f)[0] < 0
    bound.set(knob, 0)
    assert bound.get("sg_live") == 0
    ret, c = bound.submit_user(f)
    assert ret == 0 and bound.wait(f, c.cookie)[1].status == 0


def test_doorbell_drops_every_mailbox_reference_it_takes(bound):
    f = bound.open()
    assert bound.doorbell(f, 3, 0x77) == 0
    assert bound.doorbell(f, 4, 0x78) == 0
    assert bound.get("puts") == 2


def test_doorbell_to_a_mailbox_whose_driver_went_away_is_enodev(bound):
    f = bound.open()
    bound.set("mbox_gone", 1)
    assert bound.doorbell(f, 3, 0x77) == -errno.ENODEV
    assert bound.get("rings") == 0 and bound.get("puts") == 1


# ------------------------------------------------------------------------------ (h) pure helpers

@pytest.mark.parametrize("text,want", [
    ("host@0x3800000000+0x1000", (abi.PEER_HOST, 0x3800000000, 0x1000)),
    ("15@4096+8", (15, 4096, 8)),
    ("0@0x0+0x4", (0, 0, 4)),
])
def test_window_parsing_accepts(lib, text, want):
    peer, bus, n = ctypes.c_int32(), ctypes.c_uint64(), ctypes.c_uint64()
    assert lib.h_parse_window(text.encode(), ctypes.byref(peer), ctypes.byref(bus), ctypes.byref(n)) == 0
    assert (peer.value, bus.value, n.value) == want


@pytest.mark.parametrize("text", ["host0x1000+0x1000", "host@0x1000", "16@0x1000+0x1000", "-1@0x1000+4",
                                  "node@0x1000+4", "host@0x1002+0x1000", "host@0x1000+0x1001",
                                  "host@0x1000+0", "host@0xffffffffffff+0x1000", "host@0x1000+x",
                                  "host@0xfffffffffffffffc+0x8"])
def test_window_parsing_refuses(lib, text):
    peer, bus, n = ctypes.c_int32(), ctypes.c_uint64(), ctypes.c_uint64()
    assert lib.h_parse_window(text.encode(), ctypes.byref(peer), ctypes.byref(bus),
                              ctypes.byref(n)) == -errno.EINVAL


@pytest.mark.parametrize("bus_addr,length,phys", [
    (0x3800000000, 0x1000, 0x3800000000),          # the NT function's BAR 2, below our switch
    (0x380ffff000, 0x1000, 0x380ffff000),          # its last page
    (0x1000, 0x1000, None),                        # inside BAR 4, which was never assigned
    (0x3900000000, 0x1000, None),                  # a PLX function of another switch
    (0xf0000000, 0x1000, None),                    # the engine's own registers
    (0x4000000000, 0x1000, None),                  # a NIC
    (0x380ffff000, 0x2000, None),                  # runs past BAR 2's end
])
def test_the_bar_check_takes_only_assigned_bars_of_our_switch(drv, bus_addr, length, phys):
    got = ctypes.c_uint64()
    ret = drv.lib.h_win_phys(bus_addr, length, ctypes.byref(got))
    assert (ret, got.value if ret == 0 else None) == ((0, phys) if phys is not None else (-errno.EINVAL, None))


def _split(lib, src, dst, cap=4096):
    def flat(segs):
        return (ctypes.c_uint64 * (2 * len(segs)))(*[v for seg in segs for v in seg])
    out = (ctypes.c_uint64 * (3 * cap))()
    n = lib.h_split(flat(src), len(src), flat(dst), len(dst), out, cap)
    return [tuple(out[3 * i:3 * i + 3]) for i in range(n)]


def test_a_copy_splits_where_either_side_is_discontiguous(lib):
    src = [(0x10000, 0x800), (0x30000, 0x1800)]
    dst = [(0x90000, 0x1000), (0xA0000, 0x1000)]
    assert _split(lib, src, dst) == [(0x10000, 0x90000, 0x800), (0x30000, 0x90800, 0x800),
                                     (0x30800, 0xA0000, 0x1000)]


def test_a_piece_longer_than_one_descriptor_is_cut_at_the_size_field_rounded_to_4(lib):
    big = (1 << 27) + 64                           # the size field is 27 bits
    pieces = _split(lib, [(0x100000000, big)], [(0x200000000, big)])
    most = (1 << 27) - 4
    assert pieces == [(0x100000000, 0x200000000, most), (0x100000000 + most, 0x200000000 + most, 68)]


def _last_copy(lib):
    buf = ctypes.create_string_buffer(4096)
    n = lib.h_last_copy(buf)
    return buf.raw[:n].decode()


def test_last_copy_shows_the_engines_write_back_words_of_the_self_test(bound):
    assert _last_copy(bound.lib) == "none\n"
    assert bound.lib.h_selftest() == 0
    fields = dict(kv.split("=") for kv in _last_copy(bound.lib).split())
    n = 1 << 20                                    # selftest_bytes' default: one descriptor
    assert (fields["status"], fields["bytes"], fields["descriptors"]) == ("0", str(n), "1")
    assert int(fields["last_wb"], 16) == (1 << 30) | n      # VALID clear, success, the bytes moved
    assert int(fields["intr"], 16) & 0x30000 == 0               # no ERROR, no INVALID (DESC_DONE may be)


def test_last_copy_of_a_failed_copy_shows_the_failure_bit(bound):
    bound.set("hole", 2)
    f = bound.open()
    _, c = bound.submit_user(f)
    assert bound.wait(f, c.cookie)[1].status == -errno.EIO
    fields = dict(kv.split("=") for kv in _last_copy(bound.lib).split())
    assert fields["status"] == str(-errno.EIO)
    assert int(fields["last_wb"], 16) == 1 << 28              # the write failed, nothing moved
    assert int(fields["intr"], 16) & 0x10000                   # INTR ERROR latched, as the engine left it


# ------------------------------------------------------------------- (i) the MSI, and without one

def test_with_an_msi_the_last_descriptor_interrupts_and_the_handler_acks_it(bound):
    assert bound.get("irq_live") == 1
    f = bound.open()
    ret, c = bound.submit_user(f, 8192)
    ret, w = bound.wait(f, c.cookie)
    assert ret == 0 and w.status == 0 and w.bytes_done == 8192
    assert bound.get("irqs") == 1 and bound.get("irqs_handled") == 1     # one per copy, not per descriptor
    assert bound.lib.h_reg(INTR) & INTR_STATUS == 0
    bound.lib.h_unload()
    assert bound.get("irq_live") == 0


@pytest.mark.parametrize("knob", ["no_msi", "irq_lost"])
def test_without_an_msi_or_with_one_lost_the_copy_still_completes(drv, knob):
    drv.set(knob, 1)
    assert drv.load() == 0 and drv.lib.h_probe() == 0
    f = drv.open()
    ret, c = drv.submit_user(f)
    ret, w = drv.wait(f, c.cookie)
    assert ret == 0 and w.status == 0 and w.bytes_done == 4096
    assert drv.get("irqs_handled") == 0
