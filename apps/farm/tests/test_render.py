import os
import signal
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import pytest

from farm import remotion
from farm.config import Settings
from farm.join import join
from farm.plan import plan_chunks
from farm.render import RenderError, frames_done, reference_audio, render_chunk, written
from farm.verify import probe, verify
from mediatools import pcm, require, src_spec

HELLO = Path(__file__).resolve().parents[1] / "examples" / "hello"
WORKER_MODULES = Path(__file__).resolve().parents[1] / "remotion-worker"   # what the farm role installs on nodes


@pytest.fixture(autouse=True)
def tools():
    require("ffmpeg", "ffprobe")


def test_testsrc_part(tmp_path):
    got = render_chunk(src_spec(300), 7, 100, 129, tmp_path)
    assert got["video"] == str(tmp_path / "part-00007.ts") and got["audio"] == str(tmp_path / "part-00007.wav")
    assert got["frames"] == 30 and got["seconds"] > 0
    assert probe(Path(got["video"]))["frames"] == 30
    with wave.open(got["audio"]) as w:
        assert (w.getnframes(), w.getframerate(), w.getsampwidth()) == (30 * 1600, 48000, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00007.ts", "part-00007.wav"]


def test_fractional_fps_chunks_add_up(tmp_path):
    spec = src_spec(100, fps=30000 / 1001)  # as a float, the way it comes through JSON
    samples = 0
    for i, first, last in plan_chunks(100, 3, min_chunk=1, per_node=1):
        with wave.open(render_chunk(spec, i, first, last, tmp_path)["audio"]) as w:
            samples += w.getnframes()
    assert samples == 100 * 48000 * 1001 // 30000


def test_killed_render_leaves_no_part_under_its_final_name(tmp_path):
    code = ("import sys; from farm.render import render_chunk; "
            "render_chunk({'renderer': 'testsrc', 'width': 640, 'height': 360, 'fps': 30}, 7, 0, 30000, sys.argv[1])")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not any(p.stat().st_size > 0 for p in tmp_path.iterdir()):  # it has begun writing
            assert proc.poll() is None and time.monotonic() < deadline, "the render ended before it could be killed"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # ffmpeg runs in a session of its own (farm.proc) and outlives a SIGKILLed caller: end it here,
        # or it renders its 30,000 frames beside the rest of the suite
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)], check=False)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not {"part-00007.ts", "part-00007.wav"} & set(names), f"a partial part under its final name: {names}"
    assert names and all(n.startswith(".part-00007.") for n in names), names


def watched_render(spec, index, first, last, workdir):
    """render_chunk in a thread, and what a worker's progress report would have said every 0.1 s:
    (frames the renderer reports, bytes of parts in the work directory)."""
    progress = workdir / "progress" / "p.json"
    progress.parent.mkdir(parents=True)
    result, seen = {}, []
    t = threading.Thread(target=lambda: result.update(render_chunk(spec, index, first, last, workdir,
                                                                   progress=progress)))
    t.start()
    while t.is_alive():
        frames = frames_done(progress)
        if frames is not None:
            seen.append((frames, written(workdir, index)))
        time.sleep(0.1)
    t.join()
    assert result, "the render failed"
    assert not progress.exists()
    return result, seen


def test_testsrc_reports_frames_and_writes_its_parts_only_at_the_end(tmp_path):
    """testsrc is as strict as Remotion where the watchdog looks: no byte of a part in the work
    directory until the chunk ends, frames rendered as the render goes (realtime: 40 frames at 10 fps
    take 4 s)."""
    spec = {**src_spec(40, fps=10), "realtime": True}
    got, seen = watched_render(spec, 3, 0, 39, tmp_path)
    counts = [frames for frames, _ in seen]
    assert len(set(counts)) >= 3 and counts == sorted(counts) and counts[-1] <= 40, seen
    assert all(w == 0 for frames, w in seen if frames < 30), seen
    assert probe(Path(got["video"]))["frames"] == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00003.ts", "part-00003.wav", "progress"]


def test_progress_files_of_both_renderers_read_as_frames(tmp_path):
    p = tmp_path / "p"
    assert frames_done(p) is None
    p.write_text('{"rendered": 12, "encoded": 10, "stage": "encoding"}')
    assert frames_done(p) == 12
    p.write_text("frame=3\nfps=1.0\nprogress=continue\nframe=17\nfps=2.0\nprogress=continue\n")
    assert frames_done(p) == 17
    p.write_text('{"rendered": 1')          # read while being replaced
    assert frames_done(p) is None


def test_failed_render_leaves_nothing(tmp_path):
    with pytest.raises(RenderError, match="testsrc render failed"):
        render_chunk({**src_spec(30), "width": -1}, 0, 0, 29, tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RenderError, match="unknown renderer"):
        render_chunk({"renderer": "blender"}, 0, 0, 29, tmp_path)


def test_remotion_hello_in_two_chunks(tmp_path):
    """The example composition bundled, rendered in 2 chunks with Debian's chromium, joined, and
    checked against a single-node render of the whole: frames, audio offset and drift, PSNR. The
    chunks' PCM is the single-node render's, bit for bit. The renders use the workers' package set
    (@remotion/renderer and its peers, no CLI or bundler), as the nodes do."""
    require("node", "npm", "chromium")
    worker_modules = remotion.ensure_node_modules(WORKER_MODULES)
    assert not (worker_modules / "@remotion" / "cli").exists()
    settings = Settings(work_dir=str(tmp_path / "work"),
                        render={"browser": "/usr/bin/chromium", "node_modules": str(worker_modules)})
    spec = remotion.job_spec(HELLO, "Hello", {}, settings)  # bundles, reads the composition
    assert (spec["frames"], spec["fps"], spec["width"], spec["height"]) == (90, 30, 320, 180)
    bundle_dir = Path(spec["bundle"])
    assert bundle_dir.name == spec["bundleHash"] and (bundle_dir / "index.html").is_file()
    assert remotion.bundle(HELLO, tmp_path / "again")[1] == spec["bundleHash"]  # same project, same hash
    parts = [render_chunk(spec, i, first, last, tmp_path / "parts")
             for i, first, last in plan_chunks(90, 1, min_chunk=45, per_node=2)]
    assert [p["frames"] for p in parts] == [45, 45]
    single, seen = watched_render(spec, 0, 0, 89, tmp_path / "single")
    # Remotion's own progress (onProgress: frames rendered and encoded) while its parts do not exist yet
    assert any(0 < frames <= 90 and written == 0 for frames, written in seen), seen
    out = tmp_path / "hello.mp4"
    join([p["video"] for p in parts], [p["audio"] for p in parts], out, fps=30)
    ref = reference_audio(spec, 90, tmp_path / "ref.wav")  # the audio-only single-node render
    assert pcm(ref) == pcm(single["audio"]) == b"".join(pcm(p["audio"]) for p in parts)
    check = verify(out, frames=90, fps=30, reference_audio=ref, reference_video=Path(single["video"]))
    assert check["frames"] == 90
    assert abs(check["offsetMs"]) < 1000 / 48000 and abs(check["driftMs"]) < 1000 / 48000, check
    assert check["ok"], check["reasons"]
