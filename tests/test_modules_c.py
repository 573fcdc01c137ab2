"""modules_c: each DKMS package stands alone in /usr/src, so vca_dma carries its own copy of
vca_mbox's plx_mbox.h; the copy must not drift from the original."""

from __future__ import annotations

from pathlib import Path

MODULES = Path(__file__).resolve().parent.parent / "modules_c"


def test_vca_dma_carries_vca_mbox_plx_mbox_header_unchanged():
    original = (MODULES / "vca_mbox" / "include" / "plx_mbox.h").read_bytes()
    assert (MODULES / "vca_dma" / "include" / "plx_mbox.h").read_bytes() == original
