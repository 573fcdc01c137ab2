"""The C driver itself: modules_c/vca_dma/vca_dma.c, compiled unchanged by gcc in user space against
tests/vca_dma_harness (kernel APIs as pthreads, memcpy and recording fakes, an engine thread that
completes descriptors), and driven through its own file_operations with ctypes. Every ioctl buffer
is packed by vca_dma_abi, so the Python ABI is exercised against the compiled driver too.

Not covered here: real page pinning and IOMMU mapping (fake pages are user addresses), the engine's
real timing and errors, misc_open()'s locking, module refcounts, sysfs, sparse/checkpatch."""

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
    h.h_load.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    h.h_set.argtypes = [ctypes.c_char_p, ctypes.c_int]
    h.h_get.argtypes = [ctypes.c_char_p]
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

    def load(self, windows=None, fault=None):
        enc = [None if v is None else ctypes.create_string_buffer(v.encode()) for v in (windows, fault)]
        self.buffers += enc      # the driver keeps the parameter strings
        return self.lib.h_load(*enc)

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

    def submit_user(self, f, n=4096):
        src, dst = self.user_buffer(n), self.user_buffer(n)
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

def test_probe_failing_after_misc_register_sets_gone_before_freeing(drv):
    drv.set("open_on_register", 1)                # a file opens the moment the device appears
    assert drv.load(fault="sysfs") == 0
    assert drv.lib.h_probe() == -errno.EIO
    assert drv.get("gone_at_deregister") == 1
    early = drv.lib.h_early_file()
    assert early
    assert drv.submit_user(early)[0] == -errno.ENODEV
    assert drv.wait(early, 1)[0] == -errno.ENODEV
    assert drv.doorbell(early, 1, 0x1234) == -errno.ENODEV
    assert drv.get("regs_after_release") == 0 and drv.get("ndesc") == 0
    assert drv.lib.h_release(early) == 0


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
    bound.set("error", 1)
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
