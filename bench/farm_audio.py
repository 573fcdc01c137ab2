#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Audio offset and drift of farm's join over 2, 8 and 32 parts (the goal: 0 ms and 0 drift),
against the PC's way (each part's audio encoded to AAC, the AAC concatenated).

Parts are made by farm's testsrc renderer (ffmpeg: testsrc2 and a continuous chirp), the offset
is measured by farm.verify against the continuous tone, at the start and at the end. The
correlation looks within +-450 ms (the chirp repeats every second), so a larger shift shows
aliased; the last column, the AAC concatenation's decoded samples less those of farm's output, is
the audio that its joins inserted before the end, whole.

  bench/farm_audio.py                         # 64 s at 30 and at 60 fps, 2 8 32 parts
  bench/farm_audio.py --remotion --parts 2 3  # the example composition: bundle and chunk times too
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "apps" / "farm" / "src"))
from farm import remotion
from farm.join import join
from farm.plan import plan_chunks
from farm.render import reference_audio, render_chunk
from farm.verify import decode_audio, verify

HELLO = ROOT / "apps" / "farm" / "examples" / "hello"


def aac_concat(parts: list, out: Path, work: Path) -> Path:
    listing = work / "aac.txt"
    for p in parts:
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", p["audio"], "-c:a", "aac", "-b:a", "192k",
                        str(Path(p["audio"]).with_suffix(".aac"))], check=True)
    listing.write_text("".join(f"file '{Path(p['audio']).with_suffix('.aac')}'\n" for p in parts))
    video = join([p["video"] for p in parts], [], work / "video.mp4", fps=parts[0]["fps"])
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", video["out"], "-f", "concat", "-safe", "0", "-i",
                    str(listing), "-map", "0:v", "-map", "1:a", "-c", "copy", str(out)], check=True)
    return out


def row(method, n, check, inserted=""):
    print(f"{method:<22} {n:>5} {check['frames']:>7} {check['offsetMs']:>12.4f} {check['driftMs']:>10.4f} "
          f"{inserted:>14}  {'ok' if check['ok'] else 'FAIL'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--frames", type=int, default=None, help="default 64 s of frames at each fps")
    ap.add_argument("--fps", type=int, nargs="+", default=[30, 60],
                    help="testsrc's rates (60: where Remotion's users hear clicks)")
    ap.add_argument("--remotion", action="store_true", help="render the example composition instead")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="farm-audio-") as tmp:
        work = Path(tmp)
        if a.remotion:
            started = time.monotonic()
            bundle_dir, digest = remotion.bundle(HELLO, work / "bundle")
            print(f"bundle: {time.monotonic() - started:.1f} s (sha256 {digest[:16]})")
            spec = {"renderer": "remotion", "bundle": str(bundle_dir), "composition": "Hello", "fps": 30,
                    "browser": "/usr/bin/chromium", "node_modules": str(HELLO / "node_modules")}
            frames = 90
            single = render_chunk(spec, 0, 0, frames - 1, work / "single")
            print(f"single-node render of {frames} frames: {single['seconds']:.1f} s")
            ref = Path(single["audio"])
            runs = [(spec, frames, ref)]
        else:
            runs = []
            for fps in a.fps:
                spec = {"renderer": "testsrc", "width": 160, "height": 90, "fps": fps}
                frames = a.frames or 64 * fps
                runs.append((spec, frames, reference_audio(spec, frames, work / f"ref-{fps}.wav")))
        for spec, frames, ref in runs:
            print(f"{spec['fps']} fps, {frames} frames")
            table(a, work, spec, frames, ref)
    return 0


def table(a, work: Path, spec: dict, frames: int, ref: Path) -> None:
    print(f"{'method':<22} {'parts':>5} {'frames':>7} {'offset (ms)':>12} {'drift (ms)':>10} "
          f"{'inserted (ms)':>14}")
    for n in a.parts:
        d = work / f"p{n}-{spec['fps']}"
        parts = [render_chunk(spec, i, first, last, d)
                 for i, first, last in plan_chunks(frames, n, min_chunk=1, per_node=1)]
        for p in parts:
            p["fps"] = spec["fps"]
        if a.remotion:
            times = [p["seconds"] for p in parts]
            print(f"  {n} chunks of ~{frames // n} frames: {', '.join(f'{t:.1f}' for t in times)} s each")
        out = join([p["video"] for p in parts], [p["audio"] for p in parts], d / "farm.mp4", fps=spec["fps"])
        good, bad = Path(out["out"]), aac_concat(parts, d / "aac.mp4", d)
        row("farm (PCM, AAC once)", n, verify(good, frames=frames, fps=spec["fps"], reference_audio=ref))
        inserted = (len(decode_audio(bad, 48000)) - len(decode_audio(good, 48000))) / 48
        row("AAC per part, concat", n, verify(bad, frames=frames, fps=spec["fps"], reference_audio=ref),
            f"{inserted:.1f}")


if __name__ == "__main__":
    raise SystemExit(main())
