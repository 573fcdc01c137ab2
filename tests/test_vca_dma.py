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
    gone_after: every ioctl after that many SUBMITs raises OSError(ENODEV);
    spans: WAIT reports each piece's start (at SUBMIT) and completion (at WAIT) on dma.clock, as an
    ABI 2 driver does; False answers as ABI 1 (no spans)."""

    def __init__(self, windows=((-1, 64 * KIB),), max_copy=16 * KIB, fault=None, gone_after=None, mibps=4000.0,
                 *, spans=True):
        self.windows = [(peer, bytearray(length)) for peer, length in windows]
        self.max_copy = max_copy
        self.fault = fault
        self.gone_after = gone_after
        self.ns_per_byte = 1e9 / (mibps * (1 << 20))
        self.calls = Counter()
        self.pending = {}
        self.cookie = 0
        self.counters = Counter()
        self.spans = spans
        self.started = {}

    def device(self):
        return abi.Device("/dev/vca_dma0", ioctl=self.ioctl, fd=-1)

    def ioctl(self, fd, cmd, buf, mutate=True):
        assert mutate and isinstance(buf, bytearray)
        if self.gone_after is not None and self.calls[abi.IOC_SUBMIT] >= self.gone_after:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV))
        self.calls[cmd] += 1
        if cmd == abi.IOC_INFO:
            assert abi.INFO.unpack(buf).size == abi.INFO.size
            version = abi.ABI_VERSION if self.spans else 1
            buf[:] = abi.INFO.pack(abi_version=version, engine=0, ring_len=1024, max_copy_bytes=self.max_copy,
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
            start = self.started.pop(req.cookie)
            end = int(dma.clock() * 1e9) if self.spans and status == 0 else 0
            buf[:] = abi.WAIT.pack(cookie=req.cookie, status=status, bytes_done=done,
                                   elapsed_ns=int(done * self.ns_per_byte), start_real_ns=start, done_real_ns=end)
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
        self.started[self.cookie] = int(dma.clock() * 1e9) if self.spans else 0
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


NODE_WINDOWS = ((-1, 64 * KIB), (0, 64 * KIB), (1, 64 * KIB), (2, 64 * KIB))


def test_sequential_ring_without_node_relays_every_hop_in_the_planners_order():
    eng = FakeEngine(windows=NODE_WINDOWS)
    rec = probe(eng, "ring", node_rates=SEED, repeats=1)
    assert rec["order"] == [0, 2, 1] and rec["plan"]["method"] == "exhaustive" and rec["ring"] == "sequential"
    assert [(leg["from"], leg["to"], leg["kind"], leg["windows"]) for leg in rec["legs"]] == [
        ("node0", "node2", "relay", [1, 3]), ("node2", "node1", "relay", [3, 2]),
        ("node1", "node0", "relay", [2, 1])]
    assert all(leg["mibps"] is not None and leg["predicted_mibps"] for leg in rec["legs"])
    assert "start" not in rec


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


def test_check_mode_submits_nothing_and_never_waits(fake_clock):
    eng = FakeEngine(windows=NODE_WINDOWS)
    rec = probe(eng, "ring", node_rates=SEED, check_mode=True)
    assert [(leg["from"], leg["to"]) for leg in rec["planned_legs"]] == [("node0", "node2"), ("node2", "node1"),
                                                                         ("node1", "node0")]
    rec = probe(eng, "ring", node=0, node_rates=SEED, check_mode=True, start_at=fake_clock.t + 30)
    assert [(leg["from"], leg["to"]) for leg in rec["planned_legs"]] == [("node0", "node2")]
    assert eng.calls[abi.IOC_SUBMIT] == 0 and eng.calls[abi.IOC_WAIT] == 0
    assert "legs" not in rec and "start" not in rec and fake_clock.slept == []


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


# ----------------------------------------------------------------------------------- pipelined ring

T0 = 1_800_000_000.0


class FakeClock(object):
    """Epoch clock for dma.clock / dma.sleep: every reading advances it by `tick`; sleep moves it."""

    def __init__(self, t=T0, tick=0.001):
        self.t, self.tick, self.slept = t, tick, []

    def __call__(self):
        self.t += self.tick
        return self.t

    def sleep(self, seconds):
        assert seconds > 0
        self.slept.append(seconds)
        self.t += seconds


@pytest.fixture
def fake_clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(dma, "clock", c)
    monkeypatch.setattr(dma, "sleep", c.sleep)
    return c


def ring_run(monkeypatch, nodes=(0, 1, 2), starts=None, start_at=T0 + 10, faults=None, **kw):
    """Every node's pipelined ring hop, each on its own fake engine with its own fake clock (one
    node after another here, so `starts` sets where each node's clock begins); {host: result}."""
    results = {}
    for n in nodes:
        c = FakeClock((starts or {}).get(n, T0))
        monkeypatch.setattr(dma, "clock", c)
        monkeypatch.setattr(dma, "sleep", c.sleep)
        eng = FakeEngine(windows=NODE_WINDOWS, fault=(faults or {}).get(n))
        kw.setdefault("node_rates", SEED)
        rec = probe(eng, "ring", node=n, start_at=start_at, **kw)
        results["vca-node%d" % n] = {"changed": False, "record": {"engines": [dict(rec, path="/dev/vca_dma0")]}}
    return results


@pytest.mark.parametrize("node,hop,window", [(0, ("node0", "node2"), 3), (2, ("node2", "node1"), 2),
                                             (1, ("node1", "node0"), 1)])
def test_pipelined_ring_runs_only_the_hop_this_node_sends_in_the_planned_order(fake_clock, node, hop, window):
    eng = FakeEngine(windows=NODE_WINDOWS)
    rec = probe(eng, "ring", node=node, node_rates=SEED, repeats=2)
    assert rec["ring"] == "pipelined" and rec["order"] == [0, 2, 1]
    (leg,) = rec["legs"]
    assert (leg["from"], leg["to"], leg["kind"], leg["windows"]) == (*hop, "send", [window])
    assert leg["mibps"] is not None and leg["mismatched_words"] == 0 and leg["predicted_mibps"] > 0
    assert rec["start"] == {"start_at": None, "waited_s": 0.0, "late_s": None} and fake_clock.slept == []


def test_pipelined_ring_in_a_given_order_skips_the_dead_node(fake_clock):
    rec = probe(FakeEngine(windows=NODE_WINDOWS), "ring", node=2, order=[1, 0, 2], dead=[0], repeats=1)
    assert rec["order"] == [1, 2] and rec["skipped_dead"] == [0] and "plan" not in rec
    assert [(leg["from"], leg["to"]) for leg in rec["legs"]] == [("node2", "node1")]
    # The dead node's own engine (were it asked) has no hop to send.
    eng = FakeEngine(windows=NODE_WINDOWS)
    rec = probe(eng, "ring", node=0, order=[1, 0, 2], dead=[0])
    assert rec["legs"] == [] and "not in the ring" in rec["ring_note"] and eng.calls[abi.IOC_SUBMIT] == 0


def test_planned_ring_skips_the_dead_node():
    results = {}
    for n in (0, 1, 2):
        rec = probe(FakeEngine(windows=NODE_WINDOWS), "ring", node=n, node_rates=SEED, dead=[1], repeats=1)
        assert rec["order"] == [0, 2] and rec["plan"]["skipped_dead"] == [1]
        results[n] = [(leg["from"], leg["to"]) for leg in rec["legs"]]
    assert results == {0: [("node0", "node2")], 1: [], 2: [("node2", "node0")]}


def test_a_given_order_naming_a_node_twice_is_refused():
    with pytest.raises(dma.vca_ring_plan.PlanError, match="twice"):
        dma.ring_order([0, 1, 0])
    with pytest.raises(dma.vca_ring_plan.PlanError, match="two live nodes"):
        dma.ring_order([0, 1], dead=[1])


def test_wait_until_sleeps_to_start_at_and_reports_a_late_start(fake_clock):
    got = dma.wait_until(T0 + 5)
    assert fake_clock.t >= T0 + 5 and sum(fake_clock.slept) == pytest.approx(5, abs=0.01)
    assert got["start_at"] == T0 + 5 and 0 <= got["late_s"] < 0.01 and got["waited_s"] == pytest.approx(5, abs=0.01)
    fake_clock.slept.clear()
    got = dma.wait_until(T0)                                   # already past: no sleep
    assert fake_clock.slept == [] and got["late_s"] == pytest.approx(5, abs=0.01) and got["waited_s"] == 0
    with pytest.raises(ValueError, match="more than 600 s"):
        dma.wait_until(fake_clock.t + 601)
    assert fake_clock.slept == []


def test_pipelined_hop_starts_at_start_at_and_its_record_has_every_copys_span(fake_clock):
    eng = FakeEngine(windows=NODE_WINDOWS)
    rec = probe(eng, "ring", node=0, node_rates=SEED, repeats=3, start_at=T0 + 20)
    assert rec["start"]["start_at"] == T0 + 20 and 0 <= rec["start"]["late_s"] < 0.01
    (leg,) = rec["legs"]
    assert len(leg["copies"]) == 3                      # one span per timed copy, not the readbacks
    assert leg["started_at"] == leg["copies"][0][0] >= T0 + 20
    assert leg["ended_at"] == leg["copies"][-1][1] > leg["started_at"]
    assert all(a < b for a, b in leg["copies"])
    json.dumps(rec)                                     # the record stays plain JSON


def test_ring_overlap_of_hops_that_ran_together_gives_the_slowest_hops_figure(monkeypatch):
    results = ring_run(monkeypatch, starts={0: T0, 1: T0 + 0.0005, 2: T0 + 0.001})
    ring = dma.ring_overlap(results)
    assert ring["order"] == [0, 2, 1] and [h["hop"] for h in ring["hops"]] == [
        "node0->node2", "node2->node1", "node1->node0"]
    assert ring["missing"] == [] and ring["overlapped"] and ring["all_in_flight_s"] > 0
    assert ring["pipelined"] is True and ring["reason"] is None
    slowest = min(ring["hops"], key=lambda h: h["mibps"])
    assert ring["slowest_hop"] == slowest["hop"] and ring["ring_mibps"] == pytest.approx(slowest["mibps"], rel=1e-3)


def test_ring_overlap_of_hops_one_after_another_is_not_pipelined_and_has_no_figure(monkeypatch):
    results = ring_run(monkeypatch, starts={0: T0, 1: T0 + 100, 2: T0 + 200}, start_at=None)
    ring = dma.ring_overlap(results)
    assert ring["pipelined"] is False and ring["overlapped"] is False and ring["ring_mibps"] is None
    assert ring["common_span_s"] < 0 and ring["reason"].startswith("the hops did not overlap")
    assert all(h["mibps"] is not None for h in ring["hops"])     # each hop still has its own figure


def test_ring_overlap_needs_every_hop_and_every_hop_verified(monkeypatch):
    results = ring_run(monkeypatch, nodes=(0, 2))
    results["vca-node1"] = {"changed": False, "aborted": "thermal", "msg": "91.0 C"}
    ring = dma.ring_overlap(results)
    assert ring["missing"] == ["node1->node0"] and ring["reason"] == "hop(s) node1->node0 did not run"
    assert ring["pipelined"] is False and ring["ring_mibps"] is None
    assert ring["notes"] == ["vca-node1: aborted (thermal)"]
    ring = dma.ring_overlap(ring_run(monkeypatch, faults={2: lambda n, req: "flip" if n == 1 else None}))
    assert ring["pipelined"] is False and ring["ring_mibps"] is None
    assert ring["reason"] == "node2->node1 gave no figure (1 mismatched words)"


def _set_spans(results, copies, pieces):
    for host in copies:
        leg = results[host]["record"]["engines"][0]["legs"][0]
        leg["copies"] = [[T0 + a, T0 + b] for a, b in copies[host]]
        leg["pieces"] = [[T0 + a, T0 + b] for a, b in pieces[host]]
        leg["started_at"], leg["ended_at"] = leg["copies"][0][0], leg["copies"][-1][1]


def test_ring_overlap_spans_that_overlap_without_a_moment_all_in_flight_is_not_pipelined(monkeypatch):
    results = ring_run(monkeypatch, repeats=2)
    # Interleave by hand: hop A's copies at [0,1] and [4,5], hop B's at [2,3] and [6,7], C's at [0,7].
    spans = {"vca-node0": [[0, 1], [4, 5]], "vca-node1": [[2, 3], [6, 7]], "vca-node2": [[0, 7]]}
    _set_spans(results, spans, spans)
    ring = dma.ring_overlap(results)
    assert ring["overlapped"] is True and ring["common_span_s"] == pytest.approx(3)
    assert ring["all_in_flight_s"] == 0 and ring["pipelined"] is False and ring["ring_mibps"] is None
    assert "no instant" in ring["reason"]


def test_ring_overlap_reads_the_drivers_piece_spans_not_the_copies_wall_spans(monkeypatch):
    """Every hop's timed copy spans [0, 8] as user space saw it, but inside it the engines ran their
    pieces in turn (the gaps are the submit/wait turnarounds): never all at once, so no ring figure."""
    results = ring_run(monkeypatch, repeats=1)
    copies = {h: [[0, 8]] for h in ("vca-node0", "vca-node1", "vca-node2")}
    pieces = {"vca-node0": [[0, 1], [3, 4], [6, 7]], "vca-node1": [[1, 2], [4, 5], [7, 8]],
              "vca-node2": [[0.5, 1.5], [3.5, 4.5], [6.5, 7.5]]}
    _set_spans(results, copies, pieces)
    ring = dma.ring_overlap(results)
    assert ring["overlapped"] is True and ring["all_in_flight_s"] == 0
    assert ring["pipelined"] is False and ring["ring_mibps"] is None and "no instant" in ring["reason"]
    pieces["vca-node1"] = [[0.6, 1.4], [3.6, 4.4], [6.6, 7.4]]      # now every engine is busy 3 x 0.4 s
    _set_spans(results, copies, pieces)
    ring = dma.ring_overlap(results)
    assert ring["all_in_flight_s"] == pytest.approx(1.2) and ring["pipelined"] is True


def test_pipelined_hop_records_the_drivers_span_of_every_piece(fake_clock):
    rec = probe(FakeEngine(windows=NODE_WINDOWS), "ring", node=0, node_rates=SEED, repeats=2, nbytes=64 * KIB)
    (leg,) = rec["legs"]
    assert len(leg["pieces"]) == 2 * 4                 # 64 KiB in 16 KiB pieces, two timed copies
    (c0, c1) = leg["copies"]
    assert all(c0[0] <= a < b <= c0[1] for a, b in leg["pieces"][:4])
    assert all(c1[0] <= a < b <= c1[1] for a, b in leg["pieces"][4:])


def test_ring_overlap_without_the_drivers_piece_spans_gives_no_figure(monkeypatch):
    results = ring_run(monkeypatch)
    leg = results["vca-node2"]["record"]["engines"][0]["legs"][0]
    leg["pieces"] = None                               # an ABI 1 driver
    ring = dma.ring_overlap(results)
    assert ring["overlapped"] is True and ring["pipelined"] is False and ring["ring_mibps"] is None
    assert ring["no_pieces"] == ["node2->node1"] and "no per-piece spans" in ring["reason"]


def test_ring_overlap_without_a_pipelined_run_or_with_disagreeing_orders(monkeypatch):
    assert dma.ring_overlap({"vca-node0": {"unsupported": True, "msg": dma.UNSUPPORTED}})["reason"] == \
        "no pipelined ring ran"
    results = ring_run(monkeypatch)
    results["vca-node1"]["record"]["engines"][0]["order"] = [0, 1, 2]
    ring = dma.ring_overlap(results)
    assert ring["pipelined"] is False and "disagree on the ring order" in ring["reason"]


def test_module_start_at_is_checked_before_any_engine(fake_node, capsys, fake_clock):
    eng, args = fake_node
    result = run_module("vca_dma", dict(args, mode="matrix", start_at=T0 + 1), capsys)
    assert result["failed"] and "ring mode with node set" in result["msg"]
    result = run_module("vca_dma", dict(args, mode="ring", node=0, node_rates=SEED, start_at=fake_clock.t + 700),
                        capsys)
    assert result["failed"] and "more than 600 s" in result["msg"] and eng.calls[abi.IOC_INFO] == 0


def test_module_runs_a_pipelined_hop_and_ring_overlap_reads_the_results(fake_node, capsys, fake_clock):
    _, args = fake_node                                  # windows: host, node1, node2
    result = run_module("vca_dma", dict(args, mode="ring", node=0, order=[0, 1], start_at=fake_clock.t + 3,
                                        repeats=2), capsys)
    assert result.get("failed") is not True, result.get("msg")
    (engine,) = result["record"]["engines"]
    assert engine["ring"] == "pipelined" and engine["start"]["late_s"] >= 0
    (leg,) = engine["legs"]
    assert (leg["from"], leg["to"], leg["windows"]) == ("node0", "node1", [1]) and leg["mibps"] is not None
    ring = run_module("vca_dma", {"mode": "ring_overlap", "results": {"vca-node0": result}}, capsys)["ring"]
    assert ring["missing"] == ["node1->node0"] and ring["pipelined"] is False and ring["ring_mibps"] is None
