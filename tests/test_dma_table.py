"""playbooks/bench/templates/dma-table.md.j2 rendered with jinja2 from results exactly as the
vca_dma module returns them: every result below comes out of the module's main(), over the fake
engine of tests/test_vca_dma.py, never written by hand."""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest
import yaml
from ansible.module_utils import vca_dma as dma
from ansible.plugins.filter.core import FilterModule
from test_vca_dma import KIB, SEED, T0, FakeClock, FakeEngine, pci_tree

from conftest import run_module

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "playbooks" / "bench" / "templates" / "dma-table.md.j2"
NODES = (0, 1, 2)


def windows_of(node):
    """A node's A-LUT windows: the host, then every other node."""
    return ((-1, 64 * KIB), *((n, 64 * KIB) for n in NODES if n != node))


def render(**variables):
    # As the template module renders it: trim_blocks on, an undefined variable an error.
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["basename"] = FilterModule().filters()["basename"]
    return env.from_string(TEMPLATE.read_text()).render(**variables)


@pytest.fixture
def bench(tmp_path, monkeypatch, capsys):
    """run(host, args, engine, clock) -> the module's result on that machine's fake engine."""
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "vca_dma0").write_text("")
    base = {"dev_root": str(tmp_path / "dev"), "sysfs_root": str(pci_tree(tmp_path / "sys", plx_driver="vca_dma")),
            "bytes": 64 * KIB, "repeats": 2}

    def run(args, engine, clock=None):
        monkeypatch.setattr(dma, "open_device", lambda path: engine.device())
        clock = clock or FakeClock()
        monkeypatch.setattr(dma, "clock", clock)
        monkeypatch.setattr(dma, "sleep", clock.sleep)
        result = run_module("vca_dma", dict(base, **args), capsys)
        assert result.get("failed") is not True, result.get("msg")
        return result
    return run


def matrix_hostvars(bench):
    hostvars = {"vca-host": {"vca_bench_dma": bench({"mode": "matrix"}, FakeEngine(windows=windows_of(None)))}}
    for n in NODES:
        hostvars["vca-node%d" % n] = {"vca_bench_dma": bench({"mode": "matrix", "node": n, "node_rates": SEED},
                                                             FakeEngine(windows=windows_of(n)))}
    return hostvars


def ring_summary(bench, hostvars, clocks, start_at):
    results = {}
    for n in NODES:
        args = {"mode": "ring", "node": n, "node_rates": SEED}
        if start_at is not None:
            args["start_at"] = start_at
        results["vca-node%d" % n] = bench(args, FakeEngine(windows=windows_of(n)), clocks[n])
        hostvars["vca-node%d" % n]["vca_bench_dma_ring_hop"] = results["vca-node%d" % n]
    return bench({"mode": "ring_overlap", "results": results}, None)


def table(hostvars, summary=None):
    variables = {"vca_bench_run_dir": "/x/dma-20261202T020000Z", "vca_bench_hosts": sorted(hostvars),
                 "hostvars": hostvars}
    if summary is not None:
        variables["vca_bench_dma_ring_summary"] = summary
    return render(**variables)


def rows(text, first_cell):
    return [line for line in text.splitlines() if line.startswith("| %s |" % first_cell)]


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_leg_rows_and_the_prediction_column(bench):
    text = table(matrix_hostvars(bench))
    assert re.search(r"^## vca-node0: \S+/dev/vca_dma0 \(lab\)$", text, re.M)
    assert re.search(r"^## vca-host: \S+/dev/vca_dma0 \(lab\)$", text, re.M)
    assert "No PLX DMA engine" not in text and "Pipelined ring" not in text
    # node0's six legs, in the module's order: host first, then every node; predicted only node to node.
    section = text.split("## vca-node0:")[1].split("## ")[0]
    got = [cells(line) for line in section.splitlines() if line.startswith("| node") or line.startswith("| host")]
    assert [(c[0], c[1]) for c in got] == [("node0", "host"), ("host", "node0"), ("node0", "node1"),
                                           ("node1", "node0"), ("node0", "node2"), ("node2", "node0")]
    for c in got:
        assert c[2] == "4000" and c[4] == str(16 * KIB) and c[5] == "0" and c[6] == ""
    assert [c[3] for c in got] == ["-", "-", "%.0f" % (min(3997, 4849) * 0.96), "%.0f" % (min(2058, 3949) * 0.96),
                                   "%.0f" % (min(3997, 3129) * 0.96), "%.0f" % (min(5642, 3949) * 0.96)]
    # The host's engine names its side "local" and has no prediction at all.
    host = text.split("## vca-host:")[1].split("## ")[0]
    assert all(cells(line)[3] == "-" for line in host.splitlines() if line.startswith("| local |"))


def test_a_leg_without_a_figure_shows_its_reason_not_a_number(bench):
    hostvars = {"vca-node0": {"vca_bench_dma": bench(
        {"mode": "matrix", "node": 0, "node_rates": SEED},
        FakeEngine(windows=windows_of(0), fault=lambda n, req: "flip" if n == 1 else None))}}
    first = cells(rows(table(hostvars), "node0")[0])
    assert first[:2] == ["node0", "host"] and first[2] == "-" and first[5] == "1" and first[6] == "1 mismatched words"


def test_the_ring_row_gives_the_figure_only_when_the_hops_overlapped(bench):
    hostvars = matrix_hostvars(bench)
    summary = ring_summary(bench, hostvars, {n: FakeClock(T0 + n * 0.0003) for n in NODES}, T0 + 5)
    assert summary["ring"]["pipelined"] is True
    text = table(hostvars, summary)
    assert "## Pipelined ring: 0 → 2 → 1" in text
    hops = [cells(line) for line in text.splitlines() if re.match(r"\| node\d->node\d \|", line)]
    assert [(c[0], c[1]) for c in hops] == [("node0->node2", "vca-node0"), ("node2->node1", "vca-node2"),
                                            ("node1->node0", "vca-node1")]
    assert [c[3] for c in hops] == ["4000"] * 3
    assert [c[4] for c in hops] == ["%.0f" % (min(3997, 3129) * 0.96), "%.0f" % (min(5642, 4849) * 0.96),
                                    "%.0f" % (min(2058, 3949) * 0.96)]
    assert hops[0][5] == "0.000" and all(float(c[6]) > float(c[5]) for c in hops)
    (ring,) = rows(text, "0 → 2 → 1")
    ring = cells(ring)
    assert ring[1].startswith("yes, common span") and float(ring[2].split()[0]) > 0
    assert ring[3] == "%.0f" % summary["ring"]["ring_mibps"] == "4000" and ring[4] == "node0->node2"


def test_a_ring_whose_hops_did_not_overlap_is_not_pipelined_and_has_no_figure(bench):
    hostvars = matrix_hostvars(bench)
    summary = ring_summary(bench, hostvars, {n: FakeClock(T0 + 100 * n) for n in NODES}, None)
    (ring,) = rows(table(hostvars, summary), "0 → 2 → 1")
    ring = cells(ring)
    assert ring[1] == "NO" and ring[3].startswith("NOT pipelined: the hops did not overlap") and ring[4] == "-"
    assert not re.search(r"\d", ring[3].split(":")[0])


def test_the_lab_without_an_engine_has_no_figure_and_no_ring_figure(tmp_path, capsys):
    (tmp_path / "dev").mkdir()
    args = {"dev_root": str(tmp_path / "dev"), "sysfs_root": str(pci_tree(tmp_path / "sys"))}
    hostvars = {h: {"vca_bench_dma": run_module("vca_dma", dict(args, mode="matrix"), capsys)}
                for h in ("vca-host", "vca-node0")}
    ring = run_module("vca_dma", {"mode": "ring_overlap", "results": {
        "vca-node0": run_module("vca_dma", dict(args, mode="ring", node=0, node_rates=SEED), capsys)}}, capsys)
    text = table(hostvars, ring)
    assert "- vca-node0: unsupported: no PLX DMA engine found: looked for" in text
    assert "No PLX DMA engine bound to vca_dma was found on any machine: no figure was measured." in text
    (row,) = [line for line in text.splitlines() if "NOT pipelined" in line]
    assert cells(row)[3] == "NOT pipelined: no pipelined ring ran"
    assert text.rstrip().endswith("- vca-node0: unsupported: no PLX DMA engine found")


def test_the_matrix_runs_one_machine_at_a_time():
    """Every engine shares the card's switch: a machine's figure is its own only when no other copies."""
    plays = yaml.safe_load((ROOT / "playbooks/bench/dma.yml").read_text())
    [matrix] = [p for p in plays if p["name"] == "DMA matrix where an engine is bound"]
    assert matrix["serial"] == 1
