"""Join the parts of a job: video concatenated without re-encoding, PCM concatenated sample by
sample, and the audio encoded once (ffmpeg's native AAC) straight into the MP4.

Encoding once is the point: AAC encoded per part carries the encoder's priming (2048 samples,
+42.7 ms at 48 kHz) into every part, and concatenating such parts shifts the audio further at
each join. PCM has no priming, and the MP4 muxer records the one encoder delay in an edit list.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
import wave
from fractions import Fraction
from pathlib import Path

from farm.render import as_fraction, ffmpeg


class JoinError(RuntimeError):
    pass


def concat_wav(parts: list, out: Path, block: int = 1 << 16) -> dict:
    """Concatenate PCM s16 wavs sample-exactly into out; all parts must share rate and channels."""
    params = None
    total = 0
    with wave.open(str(out), "wb") as dst:
        for part in parts:
            with wave.open(str(part), "rb") as src:
                p = (src.getnchannels(), src.getsampwidth(), src.getframerate())
                if p[1] != 2:
                    raise JoinError(f"{part}: {8 * p[1]}-bit audio, the parts must be PCM s16")
                if params is None:
                    params = p
                    dst.setnchannels(p[0])
                    dst.setsampwidth(2)
                    dst.setframerate(p[2])
                elif p != params:
                    raise JoinError(
                        f"{part}: {p[0]} ch at {p[2]} Hz, the first part has {params[0]} ch at {params[2]} Hz")
                while data := src.readframes(block):
                    dst.writeframes(data)
                total += src.getnframes()
    return {"samples": total, "channels": params[0], "sampleRate": params[2]}


def _probe_fps(video: Path) -> Fraction:
    argv = ["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries", "stream=r_frame_rate",
            "-of", "csv=p=0", str(video)]
    proc = subprocess.run(argv, check=False, capture_output=True, text=True)
    rates = proc.stdout.split()  # MPEG-TS lists the stream under its program too
    if proc.returncode != 0 or not rates:
        raise JoinError(f"ffprobe could not read the frame rate of {video}: {proc.stderr.strip()}")
    return Fraction(rates[0])


def join(videos: list, audios: list, out: Path, *, fps=None, audio_bitrate: str = "192k") -> dict:
    """Join parts in the order given (chunk index order) into out (an MP4), atomically."""
    videos, audios, out = [Path(v).resolve() for v in videos], [Path(a).resolve() for a in audios], Path(out)
    if not videos:
        raise JoinError("no video parts")
    if audios and len(audios) != len(videos):
        raise JoinError(f"{len(videos)} video parts but {len(audios)} audio parts")
    missing = [str(p) for p in videos + audios if not p.is_file()]
    if missing:
        raise JoinError(f"missing parts: {' '.join(missing)}")
    fps = as_fraction(fps) if fps else _probe_fps(videos[0])
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmpdir = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        listing = tmpdir / "videos.txt"
        # the concat demuxer's quoting: a ' inside '...' is written '\''
        listing.write_text("".join("file '{}'\n".format(str(v).replace("'", "'\\''")) for v in videos))
        args = ["-f", "concat", "-safe", "0", "-i", listing]
        audio = None
        if audios:
            audio = concat_wav(audios, tmpdir / "audio.wav")
            args += ["-i", tmpdir / "audio.wav", "-map", "0:v:0", "-map", "1:a:0",
                     "-c:a", "aac", "-b:a", audio_bitrate]
        else:
            args += ["-map", "0:v:0"]
        tmp_out = tmpdir / out.name
        # -r: the exact rate, not one the muxer infers from the parts' timestamps (as Remotion does)
        ffmpeg([*args, "-c:v", "copy", "-r", fps, "-movflags", "+faststart", "-map_metadata", "-1",
                       "-fflags", "+bitexact", tmp_out], what="join")
        os.replace(tmp_out, out)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    result = {"out": str(out), "parts": len(videos), "fps": str(fps), "seconds": round(time.monotonic() - started, 3)}
    if audio:
        result.update(audioSamples=audio["samples"], sampleRate=audio["sampleRate"], channels=audio["channels"])
    return result


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(prog="farm join", description=(
        "Join rendered parts in the order given: video without re-encoding, the PCM sample-exactly, "
        "the audio encoded once into the MP4. Parts from any renderer: MPEG-TS (or other "
        "concat-demuxable) H.264 video and PCM s16 wav audio."))
    ap.add_argument("--video", nargs="+", required=True, metavar="PART", help="video parts, in chunk order")
    ap.add_argument("--audio", nargs="*", default=[], metavar="PART", help="PCM s16 wav parts, same order")
    ap.add_argument("--out", required=True, type=Path, help="the MP4 to write")
    ap.add_argument("--fps", help="frame rate (e.g. 30 or 30000/1001); default: the first part's")
    ap.add_argument("--audio-bitrate", default="192k")
    a = ap.parse_args(argv)
    try:
        result = join(a.video, a.audio, a.out, fps=a.fps, audio_bitrate=a.audio_bitrate)
    except (JoinError, RuntimeError) as e:
        ap.exit(1, f"farm join: {e}\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
