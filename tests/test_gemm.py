"""The GEMM probe on PoCL and the C SGEMM: verification by content, tuning, cache, thermal guard."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pyopencl
import pytest
from ansible.module_utils.vca_autotune import SPACE, Tuner, size_class, start_params, tune_shapes, tuned_key, valid
from ansible.module_utils.vca_gemm import (
    OpenCLRunner,
    Reference,
    Telemetry,
    VerificationFailed,
    burst_figures,
    measure,
    median_burst,
    random_operands,
    reduce_slices,
    split_k,
    throttle_names,
    timing,
    tolerance,
    wave_plan,
)
from ansible.module_utils.vca_sensors import LAB_MARKER
from ansible.module_utils.vca_thermal import ThermalAbort, ThermalGuard

from conftest import ROOT, run_module
from vcasim.model import NodeModel

PROBES = ROOT / "roles" / "probes" / "files"
SMALL_CPU = dict(TM=16, TN=32, TK=16, WPTM=4, WPTN=8, VW=8, LMEM=0, KBARRIER=1)
SMALL_LMEM = dict(TM=16, TN=16, TK=8, WPTM=2, WPTN=2, VW=1, LMEM=1, KBARRIER=0)
# Register prefetch, with a B chunk (128 floats) that 48 work-items do not divide evenly.
SMALL_PREFETCH = dict(TM=24, TN=16, TK=8, WPTM=4, WPTN=2, VW=1, LMEM=1, KBARRIER=0, PF=1)
SMALL_PACKED = dict(SMALL_CPU, PACK=1)
# LMEM 2: float4 loads, split 4x4 register pieces; one local buffer (DB 0), or two and A unpadded.
SMALL_VEC = dict(TM=32, TN=32, TK=8, WPTM=4, WPTN=4, VW=1, LMEM=2, KBARRIER=0)
SMALL_VEC_DB = dict(TM=64, TN=32, TK=16, WPTM=8, WPTN=4, VW=1, LMEM=2, KBARRIER=0, DB=1, APAD=0)
# Odd sides, none a multiple of any tile; one tall-skinny, one with K < TK.
ODD_SHAPES = [[97, 33, 65], "33x97x130", [300, 7, 200], [5, 200, 3]]



def lab_root(tmp_path):
    """A lab tree without sensors: the marker alone, so the guard lets a blind probe run."""
    root = tmp_path / "nosys"
    root.mkdir(exist_ok=True)
    (root / LAB_MARKER).write_text("test tree\n")
    return str(root)


def opencl_args(tmp_path, **kw):
    args = {"backend": "opencl", "kernel_dir": str(PROBES), "sizes": [96], "repetitions": 5,
            "cache_path": str(tmp_path / "tune.json"), "sysfs_root": lab_root(tmp_path)}
    args.update(kw)
    return args


@pytest.mark.parametrize("params", [SMALL_CPU, SMALL_LMEM, SMALL_PREFETCH, SMALL_PACKED, SMALL_VEC, SMALL_VEC_DB],
                         ids=["vector", "local-memory", "prefetch", "packed", "float4", "float4-double-buffered"])
def test_tiled_kernel_reports_a_verified_figure(tmp_path, capsys, params):
    result = run_module("vca_gemm", opencl_args(tmp_path, params=params, sizes=[96, 100]), capsys)
    assert result.get("failed") is not True, result.get("msg")
    record = result["record"]
    assert record["platform"] == "lab" and result["changed"] is False
    for r in record["results"]:                      # 100 is padded to the tiles, then cut back
        assert r["verification"]["passed"] and r["verification"]["wrong"] == 0
        assert r["verification"]["max_rel_error"] < r["verification"]["tolerance"]
        assert r["timing"]["runs"] >= 5 and r["gflops"] > 0
    assert record["params"] == params and record["tuning"] == {"origin": "given"}
    assert {r["tiling"]["origin"] for r in record["results"]} == {"given"}


def test_kernel_that_skips_the_last_k_tile_is_rejected(tmp_path, capsys):
    result = run_module("vca_gemm", opencl_args(tmp_path, params=SMALL_CPU, build_options=["-DSKIP_LAST_K_TILE"]),
                        capsys)
    assert result["failed"] is True
    assert "no figure reported" in result["msg"]
    assert "record" not in result
    v = result["verification"]
    assert v["wrong"] > 0.99 * v["elements"] and v["max_rel_error"] > 100 * v["tolerance"]


def test_the_all_ones_check_would_have_passed_that_kernel():
    """With A = B = 1 the wrong kernel's output is uniform (K - TK everywhere) and non-zero,
    which is all the seed tree's ones check looked at; random data catches it."""
    ctx = pyopencl.Context([pyopencl.get_platforms()[0].get_devices()[0]])
    runner = OpenCLRunner(ctx.devices[0], (PROBES / "sgemm.cl").read_text())
    ones = np.ones((64, 64), dtype=np.float32)
    run, result = runner.prepare(ones, ones, SMALL_CPU, ["-DSKIP_LAST_K_TILE"])
    run()
    out = result()
    assert np.all(out == out[0, 0]) and out[0, 0] == 64 - SMALL_CPU["TK"]
    a, b = random_operands(64, 64, 64, 3)
    run, result = runner.prepare(a, b, SMALL_CPU, ["-DSKIP_LAST_K_TILE"])
    run()
    assert not Reference(a, b).verify(result())["passed"]


def test_shipped_kernel_reproduction_is_measured_too(tmp_path, capsys):
    result = run_module("vca_gemm", opencl_args(tmp_path, kernel="shipped", sizes=[64]), capsys)
    assert result["record"]["results"][0]["verification"]["passed"]
    assert "params" not in result["record"]


def test_tuning_searches_verifies_caches_and_reuses(tmp_path, capsys):
    args = opencl_args(tmp_path, sizes=[64], tune_budget=6)
    first = run_module("vca_gemm", args, capsys)["record"]
    assert first["tuning"]["origin"] == "tuned here"
    assert 1 <= first["tuning"]["verified_candidates"] <= first["tuning"]["trials"] <= 6
    cache = json.loads((tmp_path / "tune.json").read_text())
    assert list(cache) == [tuned_key(first["device"], "small", [(64, 64, 64)])]
    second = run_module("vca_gemm", args, capsys)["record"]
    assert second["tuning"]["origin"] == "cache" and second["params"] == first["params"]
    assert second["results"][0]["tiling"] == {"params": first["params"], "origin": "cache"}


def test_hot_node_aborts_with_the_temperature_and_no_figure(tmp_path, capsys, sim_tree, sim_params):
    model = NodeModel.from_params(sim_params, "stock")
    model.temp_c = 91.5
    sim_tree.publish(model)
    result = run_module("vca_gemm", opencl_args(tmp_path, params=SMALL_CPU, sysfs_root=str(sim_tree.root)), capsys)
    assert result["aborted"] == "thermal" and result["temperature_c"] == 91.5
    assert "record" not in result and result.get("failed") is not True


def test_guard_trips_mid_run():
    temps = iter([70.0, 85.0, 90.5, 95.0])
    guard = ThermalGuard(read=lambda: next(temps), limit_c=90)
    guard.sample()
    guard.check()
    guard.sample()
    guard.sample()
    with pytest.raises(ThermalAbort, match=r"90\.5"):
        guard.check()
    assert guard.record()["max_seen_c"] == 90.5


def test_repetitions_below_five_are_refused(tmp_path, capsys):
    result = run_module("vca_gemm", opencl_args(tmp_path, repetitions=3), capsys)
    assert result["failed"] and "at least 5" in result["msg"]


@pytest.fixture(scope="module")
def cpu_library(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu") / "libvcasgemm.so"
    subprocess.run(["cc", "-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC", "-Wall", "-Werror",
                    "-o", str(out), str(PROBES / "vca_sgemm.c")], check=True)
    return str(out)


def test_cpu_sgemm_is_verified_on_odd_sizes(tmp_path, capsys, cpu_library):
    result = run_module("vca_gemm", {"backend": "cpu", "cpu_library": cpu_library, "sizes": [1, 7, 130],
                                     "sysfs_root": lab_root(tmp_path)}, capsys)
    record = result["record"]
    assert [r["n"] for r in record["results"]] == [1, 7, 130]
    assert all(r["verification"]["passed"] for r in record["results"])
    assert record["results"][0]["timing"]["expected_threads"] >= 1


def test_tolerance_grows_with_k_and_catches_a_single_bad_element():
    assert tolerance(4096) == pytest.approx(4 * tolerance(256))
    a, b = random_operands(32, 32, 512, 9)
    ref = Reference(a, b)
    good = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)
    assert ref.verify(good)["passed"]
    bad = good.copy()
    bad[5, 7] += 0.05
    assert ref.verify(bad)["wrong"] == 1
    bad[0, 0] = np.nan
    assert ref.verify(bad)["wrong"] == 2


def test_noisy_host_is_flagged():
    assert timing([1.0] * 5, cpu_s=3.9, wall_s=5.0, expected_threads=4)["noisy"] is True
    assert timing([1.0] * 5, cpu_s=19.0, wall_s=5.0, expected_threads=4)["noisy"] is False
    assert timing([1.0, 2.0, 1.5, 1.5, 1.5], cpu_s=0, wall_s=7.5, expected_threads=0)["spread"] == pytest.approx(2 / 3)


LIMITS = {"max_work_group_size": 256, "local_mem_bytes": 32768}


PEAK = dict(TM=64, TN=64, TK=32, WPTM=8, WPTN=16, VW=8, LMEM=0, KBARRIER=1, PF=0, PACK=0, DB=0, APAD=4)


def peak_score(p):
    """One narrow peak at PEAK: the score falls with each parameter's distance from its value."""
    return 100.0 / (1 + sum(abs(SPACE[k].index(p[k]) - SPACE[k].index(v)) for k, v in PEAK.items()))


def test_tuner_prunes_and_finds_the_rare_good_setting():
    evaluated = []

    def evaluate(p):
        assert valid(p, LIMITS, 1024)                       # nothing invalid is ever run
        evaluated.append(p)
        return peak_score(p)

    score, params = Tuner(evaluate, LIMITS, 1024, budget=120, seed=1).run()
    assert params == PEAK and score == 100.0
    assert len(evaluated) <= 120


def test_tuner_never_crowns_an_unverified_candidate():
    """The fastest candidate computes a wrong product; the probe's own check (measure) must
    keep it out, or the tuner crowns it."""
    wrong_but_fast = dict(PEAK)
    a, b = random_operands(16, 16, 16, 5)
    ref = Reference(a, b)
    right = ref.c.astype(np.float32)
    wrong = right.copy()
    wrong[3, 4] += 1.0
    evaluated = []

    def evaluate(p):                                        # as library/vca_gemm.py's evaluate
        evaluated.append(p)
        out = wrong if p == wrong_but_fast else right
        try:
            measure(lambda: None, lambda: out, ref, repetitions=1)
        except VerificationFailed:
            return None
        return peak_score(p)

    score, params = Tuner(evaluate, LIMITS, 1024, budget=40, seed=2).run(start=wrong_but_fast)
    assert evaluated[0] == wrong_but_fast                   # it was run, with every key a candidate has
    assert params is not None and params != wrong_but_fast and score < peak_score(wrong_but_fast)


def test_local_memory_limit_prunes():
    p = dict(TM=128, TN=128, TK=64, WPTM=8, WPTN=8, VW=1, LMEM=1, KBARRIER=0)
    assert not valid(p, LIMITS, 4096)                       # 64 KiB of local memory
    assert valid(dict(p, TK=16), LIMITS, 4096)


def test_params_with_an_unknown_or_missing_macro_are_refused(tmp_path, capsys):
    bad = dict(SMALL_CPU, TILE=4)
    del bad["VW"]
    result = run_module("vca_gemm", opencl_args(tmp_path, params=bad), capsys)
    assert result["failed"] and "params lacks VW" in result["msg"] and "params has unknown TILE" in result["msg"]


@pytest.mark.parametrize("params", [SMALL_CPU, SMALL_VEC, SMALL_VEC_DB], ids=["vector", "float4", "float4-db"])
def test_odd_rectangular_shapes_are_verified(tmp_path, capsys, params):
    result = run_module("vca_gemm", opencl_args(tmp_path, params=params, sizes=[], shapes=ODD_SHAPES), capsys)
    assert result.get("failed") is not True, result.get("msg")
    results = result["record"]["results"]
    assert [(r["m"], r["n"], r["k"]) for r in results] == [(97, 33, 65), (33, 97, 130), (300, 7, 200), (5, 200, 3)]
    assert [r["shape"] for r in results] == ["97x33x65", "33x97x130", "300x7x200", "5x200x3"]
    for r in results:
        v = r["verification"]
        assert v["passed"] and v["wrong"] == 0 and v["elements"] == r["m"] * r["n"]
        assert r["timing"]["clock"] == "device events" and r["gflops"] > 0


def test_cpu_sgemm_is_verified_on_rectangular_shapes(tmp_path, capsys, cpu_library):
    result = run_module("vca_gemm", {"backend": "cpu", "cpu_library": cpu_library, "shapes": ODD_SHAPES,
                                     "sysfs_root": lab_root(tmp_path)}, capsys)
    results = result["record"]["results"]
    assert len(results) == 4 and all(r["verification"]["passed"] for r in results)
    assert {r["timing"]["clock"] for r in results} == {"host wall"}


@pytest.mark.parametrize("shape", [[4, 4], "4x4xK", [4, 0, 4]])
def test_malformed_shapes_are_refused(tmp_path, capsys, shape):
    result = run_module("vca_gemm", opencl_args(tmp_path, params=SMALL_CPU, shapes=[shape]), capsys)
    assert result["failed"] and "record" not in result


def test_size_classes_by_the_output():
    assert [size_class(n) for n in (64, 512, 768, 769, 1152, 1153, 8192)] == [
        "small", "small", "small", "medium", "medium", "large", "large"]
    assert size_class(4096, 8) == "small"            # tall-skinny, narrower than any narrow tile
    assert size_class(1024, 1024) == "medium" and size_class(2048, 1024) == "large"


def test_each_size_class_is_tuned_and_cached_on_its_own(tmp_path, capsys):
    args = opencl_args(tmp_path, sizes=[64], shapes=[[900, 900, 16]], tune_budget=3, tune_size=64)
    first = run_module("vca_gemm", args, capsys)["record"]
    assert set(first["tilings"]) == {"small", "medium"}
    assert all(t["tuning"]["origin"] == "tuned here" for t in first["tilings"].values())
    assert [r["size_class"] for r in first["results"]] == ["small", "medium"]
    assert first["params"] == first["tilings"]["medium"]["params"]     # the largest product's class
    cache = json.loads((tmp_path / "tune.json").read_text())
    at = [(64, 64, 64), (192, 192, 192)]                            # tune_size 64 and 64 + 128
    assert sorted(cache) == sorted([tuned_key(first["device"], "small", at), tuned_key(first["device"], "medium", at)])
    second = run_module("vca_gemm", args, capsys)["record"]
    assert {t["tuning"]["origin"] for t in second["tilings"].values()} == {"cache"}


def test_opencl_figures_are_timed_by_device_events(tmp_path, capsys):
    result = run_module("vca_gemm", opencl_args(tmp_path, params=SMALL_VEC, sizes=[128]), capsys)
    t = result["record"]["results"][0]["timing"]
    assert t["clock"] == "device events"
    assert 0 < t["median_s"] <= t["wall_median_s"]     # the kernel inside the host's launch-and-wait
    assert result["record"]["results"][0]["gflops"] == pytest.approx(2 * 128 ** 3 / t["median_s"] / 1e9, rel=1e-3)


def test_timing_prefers_device_samples():
    t = timing([1.0, 1.0, 1.0], cpu_s=0, wall_s=3, expected_threads=0, device_samples_s=[0.5, 0.25, 0.5])
    assert t["clock"] == "device events" and t["median_s"] == 0.5 and t["min_s"] == 0.25
    assert t["wall_median_s"] == 1.0
    assert timing([1.0], cpu_s=0, wall_s=1, expected_threads=0)["clock"] == "host wall"


def test_float4_tilings_that_do_not_divide_are_pruned():
    ok = dict(SMALL_VEC, PF=0, PACK=0, DB=0, APAD=4)
    assert valid(ok, LIMITS, 64)
    assert not valid(dict(ok, WPTN=2, TN=16), LIMITS, 64)       # a 4x4 piece needs WPTN % 4 == 0
    assert not valid(dict(ok, TK=4), LIMITS, 64)                # 32x4 floats: 32 float4s for 64 work-items
    assert not valid(dict(ok, VW=4), LIMITS, 64)                # VW means nothing on LMEM 2: one point only
    assert not valid(dict(SMALL_CPU, PF=0, PACK=0, DB=1, APAD=4), LIMITS, 64)   # DB only on LMEM 2


def pocl_runner():
    return OpenCLRunner(pyopencl.get_platforms()[0].get_devices()[0], (PROBES / "sgemm.cl").read_text())


def test_split_k_slices_only_outputs_with_too_few_tiles():
    p = dict(TM=128, TN=64, TK=8)
    assert split_k(4096, 64, 4096, p, 132) == (8, 512)          # 32 tiles: 8 slices fill 264 work-groups
    assert split_k(512, 512, 512, dict(TM=64, TN=64, TK=16), 132) == (1, 512)   # square: never (64 tiles)
    assert split_k(8192, 8192, 8192, p, 132) == (1, 8192)        # 8192 tiles: no split
    assert split_k(4096, 64, 300, p, 132) == (1, 304)            # K too short to slice
    assert split_k(4096, 64, 4096, dict(p, SPLITK=1), 132) == (1, 4096)
    assert split_k(100, 64, 1001, dict(p, SPLITK=3), 4) == (3, 336)   # last slice shorter: 1001 - 672
    slices, ks = split_k(4096, 64, 4100, p, 132)
    assert ks % 8 == 0 and (slices - 1) * ks < 4100 <= slices * ks


def test_split_k_reduction_sums_the_slabs_in_order():
    rng = np.random.default_rng(4)
    slabs = rng.standard_normal((3, 5, 8)).astype(np.float32)      # 3 slices of a padded 5 x 8 C
    out = reduce_slices(slabs.ravel(), 3, 4, 6, ld=8)
    assert out.shape == (4, 6)
    np.testing.assert_array_equal(out, ((slabs[0] + slabs[1]) + slabs[2])[:4, :6])


@pytest.mark.parametrize("params", [SMALL_VEC, SMALL_CPU, SMALL_PACKED, SMALL_PREFETCH],
                         ids=["float4", "vector", "packed", "prefetch"])
@pytest.mark.parametrize("shape", [(64, 32, 200), (97, 33, 650), (40, 24, 1001)])
def test_split_k_products_are_verified(params, shape):
    """K split into 3 slabs on the device and summed by reduce_splits: verified against float64."""
    m, n, k = shape
    runner = pocl_runner()
    a, b = random_operands(m, n, k, 11)
    run, result = runner.prepare(a, b, dict(params, SPLITK=3), direct=False)
    run()
    assert runner.last_plan["slices"] == 3
    v = Reference(a, b).verify(result())
    assert v["passed"] and v["elements"] == m * n, v
    run(4)                                   # a burst rewrites the slabs and the sum, never accumulates
    assert Reference(a, b).verify(result())["passed"]


@pytest.mark.parametrize("shape", [(97, 33, 65), (33, 97, 130), (300, 7, 200), (5, 200, 3), (70, 36, 45), (64, 64, 61),
                                   (64, 64, 52)])
def test_odd_shapes_run_with_bounds_checked_edges_not_padding(shape):
    """A float4 tiling runs every side off the tile with EDGE: no padding step, and the K
    edge (a last chunk shorter than TK, rows not 16-byte aligned) verified."""
    m, n, k = shape
    runner = pocl_runner()
    a, b = random_operands(m, n, k, 12)
    run, result = runner.prepare(a, b, SMALL_VEC, direct=False)
    run()
    assert runner.last_plan["edge"] is True and runner.last_plan["padded"] is False
    assert runner.last_plan["launches"] == 1                 # the product alone: nothing before or after
    assert result().shape == (m, n)
    assert Reference(a, b).verify(result())["passed"]


def test_tilings_without_edge_pad_on_the_device_inside_the_timed_run():
    runner = pocl_runner()
    a, b = random_operands(97, 33, 65, 13)
    run, result = runner.prepare(a, b, SMALL_PACKED, direct=False)
    run()
    plan = runner.last_plan
    assert plan["padded"] is True and plan["edge"] is False
    assert plan["launches"] == 6           # pad A, pad B, pack A, pack B, product, cut back: all timed
    assert Reference(a, b).verify(result())["passed"]


def test_tiny_products_run_the_direct_kernel_on_cpu_opencl():
    runner = pocl_runner()
    a, b = random_operands(97, 33, 65, 14)
    run, result = runner.prepare(a, b, SMALL_CPU)
    assert run() > 0 and runner.last_plan["path"] == "direct"
    assert Reference(a, b).verify(result())["passed"]
    a, b = random_operands(256, 256, 256, 14)                 # a whole number of tiles: the tiled kernel
    runner.prepare(a, b, SMALL_CPU)
    assert runner.last_plan["path"] == "tiled"


class FakeGPU(object):
    """A clock, power and energy reader: 700 W and a power-capped 1830 MHz while 'busy'."""

    def __init__(self):
        self.energy = 1000.0
        self.reads = 0

    def read(self):
        self.reads += 1
        return {"sm_mhz": 1830 if self.reads % 2 else 1845, "power_w": 700.0, "throttle": 0x4}

    def energy_j(self):
        self.energy += 35.0                  # each read of the counter sees 35 J more
        return self.energy


def test_burst_energy_prefers_the_counter_and_reports_clocks_and_throttle():
    gpu = FakeGPU()
    with Telemetry(gpu.read, gpu.energy_j, interval_s=0.001) as t:
        pass
    assert t.energy_delta_j == 35.0 and len(t.samples) >= 2
    flops = 20 * 2.0 * 8192 ** 3
    f = burst_figures(flops, 0.5, t.samples, t.energy_delta_j)
    assert f["gflops"] == pytest.approx(flops / 0.5 / 1e9)
    assert f["energy_source"] == "counter" and f["energy_j"] == 35.0
    assert f["gflop_per_j"] == pytest.approx(flops / 1e9 / 35.0)
    assert f["sm_mhz"]["min"] == 1830 and f["sm_mhz"]["max"] == 1845 and f["power_w"] == 700.0
    assert f["throttle"] == ["sw_power_cap"]


def test_burst_energy_falls_back_to_mean_power_times_time():
    samples = [{"sm_mhz": 1980, "power_w": 600.0, "throttle": 0}, {"sm_mhz": 1980, "power_w": 700.0, "throttle": 0}]
    for counter in (None, 0.0):                    # no counter, or one that did not move
        f = burst_figures(1e12, 2.0, samples, counter)
        assert f["energy_source"] == "mean power x time" and f["energy_j"] == pytest.approx(1300.0)
        assert f["gflop_per_j"] == pytest.approx(1000 / 1300.0) and f["throttle"] == []
    bare = burst_figures(1e12, 2.0)                # no telemetry at all (PoCL): the rate alone
    assert bare["gflops"] == 500.0 and "gflop_per_j" not in bare


def test_throttle_names_and_median_burst():
    assert throttle_names(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    trials = [{"gflops": g, "sm_mhz": g} for g in (5.0, 1.0, 3.0, 4.0)]
    mid = median_burst(trials)
    assert mid["gflops"] == 3.0 and mid["sm_mhz"] == 3.0 and mid["trials_gflops"] == [5.0, 1.0, 3.0, 4.0]


def test_skinny_outputs_over_a_long_k_are_their_own_class():
    assert size_class(4096, 128, 4096) == "skinny" and size_class(8192, 128, 8192) == "skinny"
    assert size_class(64, 4096, 4096) == "skinny"              # few rows: narrow is about N
    assert size_class(4096, 200, 64) == "medium"               # short K: nothing to split
    assert size_class(4096, 4096, 4096) == "large" and size_class(97, 33, 65) == "small"


def test_narrow_n_is_a_class_per_tile_width():
    """N from 16 to 127 beside at least 1024 rows, whatever K: the tile as wide as the next of
    32, 64, 96, 128, so no group is more than 31 columns off C's right edge."""
    assert [size_class(6000, n, 6000) for n in (16, 32, 33, 64, 96, 97, 117, 127)] == [
        "narrow32", "narrow32", "narrow64", "narrow64", "narrow96", "narrow128", "narrow128", "narrow128"]
    assert size_class(2000, 100, 257) == "narrow128"           # any K
    assert size_class(6000, 15, 6000) != "narrow32" and size_class(6000, 128, 6000) == "skinny"
    assert size_class(1023, 96, 6000) != "narrow96"            # too few rows: the usual classes
    for cls in ("narrow32", "narrow64", "narrow96", "narrow128"):
        p = start_params(False, cls)
        assert valid(dict(p, DB=0, APAD=4), {"max_work_group_size": 1024, "local_mem_bytes": 49152}, 4096)
        assert p["TN"] == int(cls[len("narrow"):])
    assert tune_shapes("narrow96", False) == ((4096, 96, 4096), (4096, 80, 4096))
    assert tune_shapes("narrow32", True) == ((2048, 32, 2048), (2048, 16, 2048))


def test_classes_are_tuned_at_their_size_and_the_neighbouring_size():
    assert tune_shapes("large", False) == ((4096, 4096, 4096), (4224, 4224, 4224))
    assert tune_shapes("small", True, 64) == ((64, 64, 64), (192, 192, 192))
    assert tune_shapes("skinny", False) == ((4096, 128, 4096), (4096, 256, 4096))


def test_the_module_scores_candidates_at_two_sizes(tmp_path, capsys):
    args = opencl_args(tmp_path, sizes=[64], tune_budget=2, tune_size=64)
    record = run_module("vca_gemm", args, capsys)["record"]
    cache = json.loads((tmp_path / "tune.json").read_text())
    key = tuned_key(record["device"], "small", [(64, 64, 64), (192, 192, 192)])
    assert cache[key]["tune_shapes"] == ["64x64x64", "192x192x192"]
    assert record["results"][0]["plan"]["path"] in ("tiled", "direct")


@pytest.mark.parametrize("shape, edge_counts", [
    ((64, 64, 61), {1}),            # K % 4 != 0, tiles inside C: only the short last chunk is checked
    ((96, 99, 257), {1, 33}),       # unaligned A and B rows: inner groups check one chunk, the N edge all 33
    ((64, 64, 52), {1}),
    ((64, 66, 64), {0, 8}),         # only N off the tile: inner groups check nothing, the edge all 8
])
def test_inner_work_groups_check_only_the_last_k_chunk(shape, edge_counts):
    """COUNT_CHECKED makes every work-item store how many K chunks it loaded through the checked
    path: inner work-groups (tile inside C) check the last chunk alone, even where K or N is not
    a multiple of 4 (their rows read with vload4); the real product is verified too."""
    m, n, k = shape
    runner = pocl_runner()
    a, b = random_operands(m, n, k, 15)
    run, result = runner.prepare(a, b, SMALL_VEC, direct=False)
    run()
    assert Reference(a, b).verify(result())["passed"]
    run, result = runner.prepare(a, b, SMALL_VEC, ["-DCOUNT_CHECKED"], direct=False)
    run()
    counts = result()
    assert set(np.unique(counts).tolist()) == edge_counts
    assert np.all(counts[:32, :32] == min(edge_counts))         # the first work-group is an inner one


def test_the_module_tunes_at_the_products_it_runs_and_says_where_its_tiling_came_from(tmp_path, capsys):
    """No tune_size: each class is tuned at its own products in this run (the largest and the
    smallest), not at a size of its own (the large class tuned at 1024 ran slower than untuned);
    a winner tuned at other products is not reused, and every result names its tiling's origin."""
    args = opencl_args(tmp_path, sizes=[64, 96, 80], tune_budget=2)
    first = run_module("vca_gemm", args, capsys)["record"]
    tuning = first["tilings"]["small"]["tuning"]
    assert tuning["origin"] == "tuned here" and tuning["tune_shapes"] == ["96x96x96", "64x64x64"]
    cache = json.loads((tmp_path / "tune.json").read_text())
    assert cache[tuned_key(first["device"], "small", [(96, 96, 96), (64, 64, 64)])]["tune_shapes"] == [
        "96x96x96", "64x64x64"]
    assert [r["tiling"]["origin"] for r in first["results"]] == ["tuned here"] * 3
    again = run_module("vca_gemm", opencl_args(tmp_path, sizes=[96, 64], tune_budget=2), capsys)["record"]
    assert [r["tiling"]["origin"] for r in again["results"]] == ["cache"] * 2
    other = run_module("vca_gemm", opencl_args(tmp_path, sizes=[128], tune_budget=2), capsys)["record"]
    assert other["tilings"]["small"]["tuning"]["tune_shapes"] == ["128x128x128"]
    assert other["results"][0]["tiling"]["origin"] == "tuned here"
    untuned = run_module("vca_gemm", opencl_args(tmp_path, sizes=[64], tune=False,
                                                 cache_path=str(tmp_path / "none.json")), capsys)["record"]
    assert untuned["results"][0]["tiling"] == {"params": untuned["params"], "origin": "default"}


LARGE_GPU = start_params(False, "large")


def test_wave_aware_choice_counts_the_compute_units():
    """2200^3 in 128x128 tiles is 324 work-groups: on 132 compute units some run 3 and most 2,
    so the plan splits K (or halves the tile); on 108 units it is 3 each, and nothing changes.
    2048^3 fills 132 units evenly; 1000x3000x257 (K too short to split) gets half-height tiles."""
    planned, note = wave_plan(2200, 2200, 2200, LARGE_GPU, 132)
    assert note and (planned["SPLITK"] > 1 or planned["TM"] == 64)
    assert wave_plan(2200, 2200, 2200, LARGE_GPU, 108) == (dict(LARGE_GPU, SPLITK=1), None)
    assert wave_plan(2048, 2048, 2048, LARGE_GPU, 132) == (dict(LARGE_GPU, SPLITK=1), None)
    planned, note = wave_plan(1000, 3000, 257, LARGE_GPU, 132)
    assert planned["TM"] == 64 and planned["SPLITK"] == 1 and "half-height" in note
    assert valid(dict(planned, DB=0, APAD=4), {"max_work_group_size": 1024, "local_mem_bytes": 49152}, 257)


def test_wave_aware_choice_leaves_alone_what_it_was_not_fitted_for():
    medium = start_params(False, "medium")                    # 8x4 blocks: split at 1024 lost a third
    assert wave_plan(1024, 1024, 1024, medium, 132) == (medium, None)
    assert wave_plan(2200, 2200, 2200, dict(LARGE_GPU, SPLITK=1), 132)[1] is None     # forced
    skinny = start_params(False, "skinny")                    # split_k's own many slices stay
    assert wave_plan(4096, 128, 4096, skinny, 132) == (skinny, None)
    cpu = start_params(True, "large")
    assert wave_plan(2200, 2200, 2200, cpu, 2) == (cpu, None)


def test_wave_aware_choice_halves_the_tile_width_where_a_third_of_its_columns_are_empty():
    """5999x257x3001 in 128-column tiles computes 384 columns for 257: the plan takes 128x64
    tiles with TK 16 (same float4 loads a work-item a chunk) instead. Shapes whose last column
    tile is nearly full, where 128x64 measured slower, keep their plans; the chosen tiling runs
    right (PoCL, the same N over fewer rows)."""
    planned, note = wave_plan(5999, 257, 3001, LARGE_GPU, 132)
    assert (planned["TM"], planned["TN"], planned["TK"]) == (128, 64, 16) and "half-width" in note
    # 235 tiles: in 2 slices (470 groups) too few to fill 132 units' 4 resident slots, which
    # measured slower than 1, 3 or 4 slices on the H100
    assert planned["SPLITK"] >= 3
    assert valid(dict(planned, DB=0, APAD=4), {"max_work_group_size": 1024, "local_mem_bytes": 49152}, 257)
    for shape in [(1000, 3000, 257), (2200, 2200, 2200), (4001, 3003, 1999), (3001, 4999, 701),
                  (1531, 1531, 1531), (333, 5555, 2221), (2048, 2048, 2048), (8192, 8192, 8192)]:
        assert wave_plan(*shape, LARGE_GPU, 132)[0]["TN"] == 128, shape
    a, b = random_operands(131, 257, 301, 13)
    runner = pocl_runner()
    run, result = runner.prepare(a, b, dict(planned, SPLITK=2), direct=False)
    run()
    assert runner.last_plan["tile"] == "128x64x16" and runner.last_plan["edge"]
    assert Reference(a, b).verify(result())["passed"]
