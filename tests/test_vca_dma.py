"""The DMA probe's control flow against a fake engine at the ioctl byte level: every request is
unpacked with vca_dma_abi, memory really moves (ctypes.memmove between user buffers, a bytearray
per A-LUT window), and the answers are packed back as the driver would."""

from __future__ import annotations

import ctypes
import errno
import json
import os
from collections import Counter

import pytest
from ansible.module_utils import vca_dma as dma
from ansible.module_utils import vca_dma_abi as abi
from ansible.module_utils.vca_sensors import LAB_MARKER
from ansible.module_utils.vca_thermal import ThermalAbort

from conftest import run_module

SEED = {0: {"send": 3997, "recv": 3949}, 1: {"send": 2058, "recv": 4849}, 2: {"send": 5642, "recv": 3129}}
KIB = 1024


class FakeEngine(object):
    """fault(n, req) -> None | 'short' | 'timeout' | 'eio' | 'flip' | 'lie' (reports the full length,
    moves nothing) for the n-th SUBMIT (1-based);
    gone_after: every ioctl after that many SUBMITs raises OSError(ENODEV)."""

    def __init__(self, windows=((-1, 64 * KIB),), max_copy=16 * KIB, fault=None, gone_after=None, mibps=4000.0):
        self.windows = [(peer, bytearray(length)) for peer, length in windows]
        self.max_copy = max_copy
        self.fault = fault
        self.gone_after = gone_after
        self.ns_per_byte = 1e9 / (mibps * (1 << 20))
        self.calls = Counter()
        self.pending = {}
        self.cookie = 0
        self.counters = Counter()

    def device(self):
        return abi.Device("/dev/vca_dma0", ioctl=self.ioctl, fd=-1)

    def ioctl(self, fd, cmd, buf, mutate=True):
        assert mutate and isinstance(buf, bytearray)
        if self.gone_after is not None and self.calls[abi.IOC_SUBMIT] >= self.gone_after:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        self.calls[cmd] += 1
        if cmd == abi.IOC_INFO:
            assert abi.INFO.unpack(buf).size == abi.INFO.size
            buf[:] = abi.INFO.pack(abi_version=1, engine=0, ring_len=1024, max_copy_bytes=self.max_copy,
                                   n_windows=len(self.windows), bdf="0000:03:00.1")
        elif cmd == abi.IOC_WINDOW:
            i = abi.WINDOW.unpack(buf).index
            peer, mem = self.windows[i]
            buf[:] = abi.WINDOW.pack(index=i, peer=peer, bus_addr=0x3800000000 + i * 0x100000, length=len(mem))
        elif cmd == abi.IOC_SUBMIT:
            buf[:] = self.submit(abi.COPY.unpack(buf))
        elif cmd == abi.IOC_WAIT:
            req = abi.WAIT.unpack(buf)
            status, done = self.pending.pop(req.cookie)
            self.counters["completed" if status == 0 else ("timeouts" if status == -errno.EINPROGRESS
                                                           else "errors")] += 1
            self.counters["bytes"] += done if status == 0 else 0
            buf[:] = abi.WAIT.pack(cookie=req.cookie, status=status, bytes_done=done,
                                   elapsed_ns=int(done * self.ns_per_byte))
        elif cmd == abi.IOC_COUNTERS:
            buf[:] = abi.COUNTERS.pack(submitted=self.calls[abi.IOC_SUBMIT], **self.counters)
        else:
            raise OSError(errno.ENOTTY, "unknown ioctl")

    def submit(self, req):
        assert req.length % 4 == 0 and 0 < req.length <= self.max_copy
        assert not self.pending, "one copy in flight per engine"
        what = self.fault(self.calls[abi.IOC_SUBMIT], req) if self.fault else None
        n = req.length
        status, done = 0, n
        if what == "timeout":
            status, done = -errno.EINPROGRESS, 0
        elif what == "eio":
            status, done = -errno.EIO, 0
        elif what == "short":
            done = n // 2
        if done and what != "lie":
            to_target = req.flags == abi.DIR_TO_TARGET
            if req.target_kind == abi.TARGET_USER:
                assert to_target
                ctypes.memmove(req.target_offset, req.user_addr, done)
                dst_addr = req.target_offset
            else:
                mem = self.windows[req.target_index][1]
                off = req.target_offset
                assert off + n <= len(mem)
                if to_target:
                    mem[off:off + done] = ctypes.string_at(req.user_addr, done)
                    dst_addr = None
                else:
                    ctypes.memmove(req.user_addr, bytes(mem[off:off + done]), done)
                    dst_addr = req.user_addr
            if what == "flip":
                if dst_addr is not None:
                    ctypes.c_uint32.from_address(dst_addr).value ^= 0x1
                else:
                    mem[off] ^= 0x1
        self.cookie += 1
        self.pending[self.cookie] = (status, done)
        return abi.COPY.pack(**dict(req._asdict(), cookie=self.cookie))


def probe(engine, mode="selftest", **kw):
    kw.setdefault("nbytes", 64 * KIB)
    kw.setdefault("repeats", 3)
    return dma.probe(engine.device(), mode, **kw)


# ------------------------------------------------------------------------------ figures and reasons

def test_full_copy_is_verified_and_gets_a_figure():
    eng = FakeEngine()
    rec = probe(eng)
    (leg,) = rec["legs"]
    assert leg["reason"] is None and leg["status"] == 0
    assert leg["landed_words"] == 16 * KIB and leg["mismatched_words"] == 0
    assert leg["mibps"] == pytest.approx(4000, rel=0.01) and leg["wall_s"] > 0
    assert eng.calls[abi.IOC_SUBMIT] == 3 * 4            # 64 KiB in 16 KiB pieces, three repeats
    assert rec["counters_before"]["submitted"] == 0 and rec["counters_after"]["completed"] == 12


def test_short_copy_gives_no_figure():
    rec = probe(FakeEngine(fault=lambda n, req: "short" if n == 2 else None))
    (leg,) = rec["legs"]
    assert leg["mibps"] is None and leg["reason"].startswith("short copy")


@pytest.mark.parametrize("what,reason", [("timeout", "timeout: status -EINPROGRESS"),
                                         ("eio", "engine error: status -EIO")])
def test_timeout_and_engine_error_give_no_figure(what, reason):
    rec = probe(FakeEngine(fault=lambda n, req: what if n == 1 else None))
    (leg,) = rec["legs"]
    assert leg["mibps"] is None and leg["reason"] == reason and leg["status"] < 0


def test_one_flipped_word_is_counted_and_gives_no_figure():
    rec = probe(FakeEngine(fault=lambda n, req: "flip" if n == 3 else None))
    (leg,) = rec["legs"]
    assert leg["mismatched_words"] == 1 and leg["landed_words"] == 16 * KIB - 1
    assert leg["mibps"] is None and leg["reason"] == "1 mismatched words"


def test_a_copy_that_reports_success_but_moved_nothing_is_caught():
    rec = probe(FakeEngine(fault=lambda n, req: "lie" if n == 1 else None))
    (leg,) = rec["legs"]
    assert leg["status"] == 0 and leg["mibps"] is None
    assert leg["landed_words"] == 12 * KIB and leg["mismatched_words"] == 4 * KIB   # the first 16 KiB piece


def test_a_flipped_word_in_a_window_is_caught_by_the_readback():
    rec = probe(FakeEngine(fault=lambda n, req: "flip" if n == 1 else None), "matrix")
    send, recv = rec["legs"]
    assert (send["from"], send["to"]) == ("local", "host") and send["mismatched_words"] == 1
    assert send["mibps"] is None and recv["mibps"] is not None and recv["mismatched_words"] == 0


# ------------------------------------------------------------------------------------------ matrix

WINDOWS3 = ((-1, 64 * KIB), (1, 64 * KIB), (2, 32 * KIB))


def test_matrix_covers_host_then_node_windows_with_predictions():
    rec = probe(FakeEngine(windows=WINDOWS3), "matrix", node=0, node_rates=SEED)
    pairs = [(leg["from"], leg["to"]) for leg in rec["legs"]]
    assert pairs == [("node0", "host"), ("host", "node0"), ("node0", "node1"), ("node1", "node0"),
                     ("node0", "node2"), ("node2", "node0")]
    assert all(leg["mibps"] is not None for leg in rec["legs"])
    assert rec["legs"][5]["bytes"] == 32 * KIB                 # cut to the window
    assert "predicted_mibps" not in rec["legs"][0]
    assert rec["legs"][2]["predicted_mibps"] == pytest.approx(min(3997, 4849) * 0.96, abs=0.1)


def test_engine_that_disappears_mid_matrix_skips_the_rest_and_keeps_earlier_figures():
    # Host legs: send 2 repeats x (4 TO + 4 readback) + recv 2 x (4 setup + 4 FROM) = 32 SUBMITs.
    eng = FakeEngine(windows=WINDOWS3, gone_after=36)
    rec = probe(eng, "matrix", repeats=2)
    legs = rec["legs"]
    assert [leg["mibps"] is not None for leg in legs[:2]] == [True, True]
    assert legs[2]["mibps"] is None and legs[2]["reason"].startswith("engine gone")
    assert [leg["reason"] for leg in legs[3:]] == [dma.SKIPPED_GONE] * 3
    assert rec["engine_gone"] is True and rec["counters_after"] is None


def test_ring_follows_the_planners_order_and_relays_between_other_nodes():
    eng = FakeEngine(windows=(*WINDOWS3[1:], (2, 64 * KIB)))
    rec = probe(eng, "ring", node=0, node_rates=SEED, repeats=1)
    assert rec["order"] == [0, 2, 1] and rec["plan"]["method"] == "exhaustive"
    assert [(leg["from"], leg["to"], leg["kind"]) for leg in rec["legs"]] == [
        ("node0", "node2", "send"), ("node2", "node1", "relay"), ("node1", "node0", "recv")]
    assert all(leg["mibps"] is not None and leg["predicted_mibps"] for leg in rec["legs"])


def test_thermal_abort_between_legs_leaves_no_figure():
    class Guard(object):
        n = 0

        def check(self):
            self.n += 1
            if self.n == 2:
                raise ThermalAbort(91.0, 90.0)

    with pytest.raises(ThermalAbort) as exc:
        probe(FakeEngine(windows=WINDOWS3), "matrix", guard=Guard())
    rec = exc.value.record
    assert rec["aborted"] == "thermal" and len(rec["legs"]) == 6
    assert all(leg["mibps"] is None for leg in rec["legs"])
    assert rec["legs"][0]["reason"] == "thermal abort: no figure"
    assert rec["legs"][1]["reason"] == "skipped: thermal abort"


def test_check_mode_submits_nothing():
    eng = FakeEngine(windows=WINDOWS3)
    rec = probe(eng, "ring", node=0, node_rates=SEED, check_mode=True)
    assert eng.calls[abi.IOC_SUBMIT] == 0 and eng.calls[abi.IOC_WAIT] == 0
    assert [(leg["from"], leg["to"]) for leg in rec["planned_legs"]] == [("node0", "node2"), ("node2", "node1"),
                                                                         ("node1", "node0")]
    assert "legs" not in rec


# ------------------------------------------------------------------------------- discovery, module

def pci_tree(root, plx_driver="plx87xx_dma"):
    (root / LAB_MARKER).parent.mkdir(parents=True, exist_ok=True)
    (root / LAB_MARKER).write_text("test tree\n")
    drivers = root / "bus" / "pci" / "drivers" / plx_driver
    drivers.mkdir(parents=True)
    for bdf, vendor, device in (("0000:03:00.1", "0x10b5", "0x87d0"), ("0000:00:1f.0", "0x8086", "0xa1c1")):
        d = root / "bus" / "pci" / "devices" / bdf
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(device + "\n")
        if vendor == "0x10b5":
            os.symlink("../../../bus/pci/drivers/%s" % plx_driver, d / "driver")
    return root


def test_nothing_found_is_unsupported_and_names_what_holds_the_plx_function(tmp_path):
    (tmp_path / "dev").mkdir()
    sys_root = pci_tree(tmp_path / "sys")
    found = dma.find_engines(str(tmp_path / "dev"), str(sys_root))
    assert found["unsupported"] == dma.UNSUPPORTED and found["engines"] == []
    assert found["looked_for"][0] == "%s/vca_dma[0-9]*: none" % (tmp_path / "dev")
    assert "vendor == 0x10b5: 1 function(s)" in found["looked_for"][1]
    assert "plx87xx_dma owns 0000:03:00.1: bind vca_dma per docs/DMA.md" in found["looked_for"]
    assert found["plx_functions"] == [{"bdf": "0000:03:00.1", "id": "10b5:87d0", "driver": "plx87xx_dma"}]


def test_module_in_the_lab_is_unsupported_not_failed(tmp_path, capsys):
    (tmp_path / "dev").mkdir()
    sys_root = pci_tree(tmp_path / "sys")
    result = run_module("vca_dma", {"mode": "matrix", "dev_root": str(tmp_path / "dev"),
                                    "sysfs_root": str(sys_root)}, capsys)
    assert result.get("failed") is not True and result["changed"] is False
    assert result["unsupported"] is True and result["msg"] == "unsupported: no PLX DMA engine found"
    assert any("plx87xx_dma owns 0000:03:00.1" in line for line in result["looked_for"])
    assert "record" not in result


def test_without_numpy_no_engine_is_still_unsupported_and_an_engine_says_what_is_missing(tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.setattr(dma, "np", None)      # the lab host: no NumPy (role probes runs on nodes only)
    (tmp_path / "dev").mkdir()
    args = {"mode": "matrix", "dev_root": str(tmp_path / "dev"), "sysfs_root": str(pci_tree(tmp_path / "sys"))}
    result = run_module("vca_dma", args, capsys)
    assert result.get("failed") is not True and result["unsupported"] is True
    (tmp_path / "dev" / "vca_dma0").write_text("")
    result = run_module("vca_dma", args, capsys)
    assert result["failed"] is True and "needs NumPy (python3-numpy)" in result["msg"], result


@pytest.fixture
def fake_node(tmp_path, monkeypatch):
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "vca_dma0").write_text("")
    sys_root = pci_tree(tmp_path / "sys", plx_driver="vca_dma")
    eng = FakeEngine(windows=WINDOWS3)
    monkeypatch.setattr(dma, "open_device", lambda path: eng.device())
    args = {"dev_root": str(tmp_path / "dev"), "sysfs_root": str(sys_root), "bytes": 64 * KIB,
            "record_dir": str(tmp_path / "records")}
    return eng, args


def test_module_check_mode_plans_without_a_submit(fake_node, capsys, tmp_path):
    eng, args = fake_node
    result = run_module("vca_dma", dict(args, mode="ring", node=0, node_rates=SEED, _ansible_check_mode=True), capsys)
    assert result.get("failed") is not True, result.get("msg")
    assert eng.calls[abi.IOC_SUBMIT] == 0 and eng.calls[abi.IOC_INFO] == 1
    (engine,) = result["record"]["engines"]
    assert engine["order"] == [0, 2, 1] and engine["planned_legs"][0]["predicted_mibps"] > 0
    assert not (tmp_path / "records").exists()


def test_module_matrix_writes_its_record(fake_node, capsys):
    _, args = fake_node
    result = run_module("vca_dma", dict(args, mode="matrix", node=0, node_rates=SEED), capsys)
    assert result.get("failed") is not True, result.get("msg")
    record = result["record"]
    assert record["platform"] == "lab" and record["thermal"]["sensor"] == "absent"
    (engine,) = record["engines"]
    assert engine["engine"]["bdf"] == "0000:03:00.1" and engine["counters_after"]["submitted"] > 0
    assert all(leg["mibps"] is not None for leg in engine["legs"])
    with open(result["record_path"]) as fh:
        assert json.load(fh) == record


def test_module_refuses_a_length_that_is_not_words(fake_node, capsys):
    _, args = fake_node
    result = run_module("vca_dma", dict(args, bytes=6), capsys)
    assert result["failed"] and "multiple of 4" in result["msg"]
