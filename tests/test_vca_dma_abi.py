"""The Python ABI of /dev/vca_dma<N> against the real header, compiled by gcc."""

from __future__ import annotations

import subprocess

import pytest
from ansible.module_utils import vca_dma_abi as abi

from conftest import ROOT

HEADER_DIR = ROOT / "modules_c" / "vca_dma" / "include" / "uapi"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """{'sizeof struct.name': n, 'offsetof struct.field': n, 'ioctl NAME': n} from the header."""
    lines = ['#include <stdio.h>', '#include <stddef.h>', '#include "vca_dma_ioctl.h"', 'int main(void) {']
    for layout in abi.STRUCTS.values():
        lines.append('printf("sizeof %s %%zu\\n", sizeof(struct %s));' % (layout.name, layout.name))
        for field in layout.fields:
            lines.append('printf("offsetof %s.%s %%zu\\n", offsetof(struct %s, %s));'
                         % (layout.name, field, layout.name, field))
    for name, layout in abi.STRUCTS.items():
        for n in range(1, len(layout.sizes) + 1):
            lines.append('printf("size %s.v%d %%d\\n", VCA_DMA_%s_SIZE_V%d);' % (layout.name, n, name.upper(), n))
    lines.append('printf("const WAIT_MAX_MS %d\\n", VCA_DMA_WAIT_MAX_MS);')
    lines.append('printf("const ABI_VERSION %d\\n", VCA_DMA_ABI_VERSION);')
    for name in abi.IOCTLS:
        lines.append('printf("ioctl %s %%lu\\n", (unsigned long)%s);' % (name, name))
    lines += ['return 0;', '}']
    d = tmp_path_factory.mktemp("abi")
    (d / "abi.c").write_text("\n".join(lines) + "\n")
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", str(HEADER_DIR), "-o", str(d / "abi"), str(d / "abi.c")],
                   check=True)
    out = subprocess.run([str(d / "abi")], check=True, capture_output=True, text=True).stdout
    return {" ".join(line.split()[:2]): int(line.split()[2]) for line in out.splitlines()}


@pytest.mark.parametrize("key", sorted(abi.STRUCTS))
def test_struct_size_and_every_offset_match_the_header(compiled, key):
    layout = abi.STRUCTS[key]
    assert layout.size == compiled["sizeof " + layout.name] == layout.sizes[-1]
    assert list(layout.sizes) == [compiled["size %s.v%d" % (layout.name, n)] for n in range(1, len(layout.sizes) + 1)]
    for field, offset in layout.offsets().items():
        assert offset == compiled["offsetof %s.%s" % (layout.name, field)], field


def test_ioctl_numbers_match_the_header(compiled):
    for name, number in abi.IOCTLS.items():
        assert number == compiled["ioctl " + name], name
    # The brief's figures, as a second source.
    assert abi.IOC_INFO == 0xC0305601 and abi.IOC_DOORBELL == 0x40105606


def test_constants_match_the_header(compiled):
    assert abi.WAIT_MAX_MS == compiled["const WAIT_MAX_MS"]
    assert abi.ABI_VERSION == compiled["const ABI_VERSION"]


def test_pack_sets_size_and_round_trips():
    buf = abi.COPY.pack(flags=abi.DIR_TO_TARGET, user_addr=0x7F0000001000, length=4096,
                        target_kind=abi.TARGET_WINDOW, target_index=2, target_offset=64)
    assert len(buf) == 48
    t = abi.COPY.unpack(buf)
    assert t.size == 48 and t.user_addr == 0x7F0000001000 and t.target_index == 2 and t.cookie == 0
    info = abi.INFO.unpack(abi.INFO.pack(engine=1, bdf="0000:03:00.1"))
    assert info.bdf == "0000:03:00.1" and info.size == 48


def test_unknown_field_and_short_buffer_are_clear_errors():
    with pytest.raises(ValueError, match="no field bogus"):
        abi.WAIT.pack(bogus=1)
    with pytest.raises(ValueError, match="need 56"):
        abi.WAIT.unpack(b"\0" * 55)


def test_device_passes_a_mutable_buffer_and_reads_the_answer_back():
    calls = []

    def fake_ioctl(fd, cmd, buf, mutate):
        calls.append((fd, cmd, len(buf), mutate, isinstance(buf, bytearray)))
        req = abi.WAIT.unpack(buf)
        buf[:] = abi.WAIT.pack(cookie=req.cookie, status=0, bytes_done=4096, elapsed_ns=1000)

    dev = abi.Device("/dev/vca_dma0", ioctl=fake_ioctl, fd=99)
    answer = dev.wait(cookie=7, timeout_ms=100)
    assert answer.bytes_done == 4096 and answer.cookie == 7
    assert calls == [(99, abi.IOC_WAIT, 56, True, True)]
    with pytest.raises(ValueError, match="multiple of 4"):
        dev.submit(0x1000, 6, direction=abi.DIR_TO_TARGET, target_kind=abi.TARGET_USER)
