# SPDX-License-Identifier: MIT
"""The user ABI of /dev/vca_dma<N> (modules_c/vca_dma/include/uapi/vca_dma_ioctl.h) in Python.

Layouts are the header's, little-endian with natural alignment (x86-64); every
struct starts with its own size, which the caller sets (the header's versioning
rule). The ioctl numbers are computed with the kernel's _IOC encoding, not pasted;
tests/test_vca_dma_abi.py checks both against the header compiled by gcc.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections import namedtuple

ABI_VERSION = 2
WAIT_MAX_MS = 60000     # VCA_DMA_WAIT_MAX_MS: a longer WAIT is -EINVAL
MAGIC = ord("V")

# asm-generic/ioctl.h
_IOC_NRBITS, _IOC_TYPEBITS, _IOC_SIZEBITS = 8, 8, 14
_IOC_NRSHIFT = 0
_IOC_TYPESHIFT = _IOC_NRSHIFT + _IOC_NRBITS
_IOC_SIZESHIFT = _IOC_TYPESHIFT + _IOC_TYPEBITS
_IOC_DIRSHIFT = _IOC_SIZESHIFT + _IOC_SIZEBITS
_IOC_WRITE, _IOC_READ = 1, 2


def _IOC(direction, typ, nr, size):
    if not 0 <= size < (1 << _IOC_SIZEBITS):
        raise ValueError("ioctl size %d does not fit in %d bits" % (size, _IOC_SIZEBITS))
    return (direction << _IOC_DIRSHIFT) | (typ << _IOC_TYPESHIFT) | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT)


def _IOW(typ, nr, size):
    return _IOC(_IOC_WRITE, typ, nr, size)


def _IOWR(typ, nr, size):
    return _IOC(_IOC_READ | _IOC_WRITE, typ, nr, size)


class Struct(object):
    """One header struct: field names, a struct format, and pack/unpack with `size` filled in.
    sizes: the header's VCA_DMA_*_SIZE_V<n>, oldest first; the last is the whole struct."""

    def __init__(self, name, fields, *sizes):
        self.name = name
        self.fields = tuple(f for f, _ in fields)
        self.codes = tuple(code for _, code in fields)
        self.fmt = struct.Struct("<" + "".join(code for _, code in fields))
        self.size = self.fmt.size
        self.sizes = sizes
        self.size_v1 = sizes[0]
        self.tuple = namedtuple(name, self.fields)
        if self.size != sizes[-1]:
            raise AssertionError("%s: layout is %d bytes, the header says %d" % (name, self.size, sizes[-1]))

    def offsets(self):
        """{field: byte offset}, as offsetof() gives it (the format has explicit padding, no implicit)."""
        out, pos = {}, 0
        for field, code in zip(self.fields, self.codes, strict=True):
            out[field] = pos
            pos += struct.calcsize("<" + code)
        return out

    def pack(self, **values):
        unknown = set(values) - set(self.fields)
        if unknown:
            raise ValueError("%s has no field %s" % (self.name, ", ".join(sorted(unknown))))
        values.setdefault("size", self.size)
        row = []
        for field in self.fields:
            v = values.get(field, b"" if field == "bdf" else 0)
            row.append(v.encode() if isinstance(v, str) else v)
        return bytearray(self.fmt.pack(*row))

    def unpack(self, buf):
        if len(buf) < self.size:
            raise ValueError("%s: %d bytes, need %d" % (self.name, len(buf), self.size))
        t = self.tuple(*self.fmt.unpack_from(bytes(buf[: self.size])))
        if "bdf" in self.fields:
            t = t._replace(bdf=t.bdf.split(b"\0", 1)[0].decode("ascii", "replace"))
        return t


# "I" __u32, "i" __s32, "Q" __u64; each format matches the header field by field.
INFO = Struct("vca_dma_info", [("size", "I"), ("abi_version", "I"), ("engine", "I"), ("ring_len", "I"),
                               ("max_copy_bytes", "Q"), ("n_windows", "I"), ("flags", "I"), ("bdf", "16s")], 48)
WINDOW = Struct("vca_dma_window", [("size", "I"), ("index", "I"), ("peer", "i"), ("flags", "I"),
                                   ("bus_addr", "Q"), ("length", "Q")], 32)
COPY = Struct("vca_dma_copy", [("size", "I"), ("flags", "I"), ("user_addr", "Q"), ("length", "Q"),
                               ("target_kind", "I"), ("target_index", "I"), ("target_offset", "Q"),
                               ("cookie", "Q")], 48)
# WAIT v2 appends the driver's CLOCK_REALTIME start and completion of the copy (0 from a v1 driver).
WAIT = Struct("vca_dma_wait", [("size", "I"), ("timeout_ms", "I"), ("cookie", "Q"), ("status", "i"),
                               ("reserved", "I"), ("bytes_done", "Q"), ("elapsed_ns", "Q"),
                               ("start_real_ns", "Q"), ("done_real_ns", "Q")], 40, 56)
COUNTERS = Struct("vca_dma_counters", [("size", "I"), ("reserved", "I"), ("submitted", "Q"), ("completed", "Q"),
                                       ("bytes", "Q"), ("errors", "Q"), ("timeouts", "Q"), ("doorbells", "Q")], 56)
DOORBELL = Struct("vca_dma_doorbell", [("size", "I"), ("device", "i"), ("value", "I"), ("reserved", "I")], 16)

STRUCTS = {"info": INFO, "window": WINDOW, "copy": COPY, "wait": WAIT, "counters": COUNTERS, "doorbell": DOORBELL}

IOC_INFO = _IOWR(MAGIC, 1, INFO.size)
IOC_WINDOW = _IOWR(MAGIC, 2, WINDOW.size)
IOC_SUBMIT = _IOWR(MAGIC, 3, COPY.size)
IOC_WAIT = _IOWR(MAGIC, 4, WAIT.size)
IOC_COUNTERS = _IOWR(MAGIC, 5, COUNTERS.size)
IOC_DOORBELL = _IOW(MAGIC, 6, DOORBELL.size)
IOCTLS = {"VCA_DMA_IOC_INFO": IOC_INFO, "VCA_DMA_IOC_WINDOW": IOC_WINDOW, "VCA_DMA_IOC_SUBMIT": IOC_SUBMIT,
          "VCA_DMA_IOC_WAIT": IOC_WAIT, "VCA_DMA_IOC_COUNTERS": IOC_COUNTERS, "VCA_DMA_IOC_DOORBELL": IOC_DOORBELL}

INFO_FAULT_ARMED = 1 << 0
PEER_HOST = -1
DIR_TO_TARGET = 1 << 0
DIR_FROM_TARGET = 1 << 1
TARGET_USER = 1
TARGET_WINDOW = 2


class Device(object):
    """An open /dev/vca_dma<N>. `ioctl` is fcntl.ioctl unless a test double is given; every call
    passes a mutable buffer so the driver's answer comes back in it."""

    def __init__(self, path, ioctl=None, fd=None):
        self.path = path
        self._ioctl = ioctl or fcntl.ioctl
        self.fd = os.open(path, os.O_RDWR | os.O_CLOEXEC) if fd is None else fd

    def close(self):
        if self.fd is not None and self.fd >= 0:
            os.close(self.fd)
        self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _call(self, cmd, layout, **fields):
        buf = layout.pack(**fields)
        self._ioctl(self.fd, cmd, buf, True)
        return layout.unpack(buf)

    def info(self):
        return self._call(IOC_INFO, INFO)

    def window(self, index):
        return self._call(IOC_WINDOW, WINDOW, index=index)

    def submit(self, user_addr, length, *, direction, target_kind, target_index=0, target_offset=0):
        if length <= 0 or length % 4:
            raise ValueError("length must be a positive multiple of 4, got %d" % length)
        if direction not in (DIR_TO_TARGET, DIR_FROM_TARGET):
            raise ValueError("direction must be DIR_TO_TARGET or DIR_FROM_TARGET, got %r" % direction)
        if target_kind not in (TARGET_USER, TARGET_WINDOW):
            raise ValueError("target_kind must be TARGET_USER or TARGET_WINDOW, got %r" % target_kind)
        return self._call(IOC_SUBMIT, COPY, flags=direction, user_addr=user_addr, length=length,
                          target_kind=target_kind, target_index=target_index, target_offset=target_offset)

    def wait(self, cookie, timeout_ms):
        return self._call(IOC_WAIT, WAIT, cookie=cookie, timeout_ms=timeout_ms)

    def counters(self):
        return self._call(IOC_COUNTERS, COUNTERS)

    def doorbell(self, device, value):
        return self._call(IOC_DOORBELL, DOORBELL, device=device, value=value)
