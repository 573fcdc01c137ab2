"""Render one chunk into two parts: MPEG-TS H.264 video (concatenates without re-encoding) and a
PCM s16 wav holding exactly the chunk's samples. Both are written under a temporary name and
renamed into place, so a part under its final name is always whole, and a chunk that runs twice
just replaces its parts with the same content.

Renderers: "remotion" (production) and "testsrc" (ffmpeg's testsrc2 and a tone: real files, fast).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
import wave
from fractions import Fraction
from pathlib import Path

from farm import proc, remotion

VIDEO_EXT = "ts"
SAMPLE_RATE = 48000


class RenderError(RuntimeError):
    pass


def part_paths(workdir: Path, index: int) -> tuple[Path, Path]:
    stem = Path(workdir) / f"part-{index:05d}"
    return stem.with_suffix(f".{VIDEO_EXT}"), stem.with_suffix(".wav")


def written(workdir: Path, index: int) -> int:
    """Bytes of the chunk's parts in workdir so far. Neither renderer writes them before the chunk's
    end (each renders in a private temporary directory, as Remotion does), so this is progress only
    for the last steps; frames_done() is the render's own progress."""
    total = 0
    for f in Path(workdir).glob(f"*part-{index:05d}.*"):
        try:
            if f.name.endswith(PROGRESS_EXT) or not f.is_file():    # not a part: the renderer's own
                continue
            total += f.stat().st_size
        except FileNotFoundError:     # renamed or removed meanwhile
            pass
    return total


PROGRESS_EXT = ".progress"


def progress_path(workdir: Path, index: int, token: str) -> Path:
    return Path(workdir) / f".part-{index:05d}.{token}{PROGRESS_EXT}"


def frames_done(progress: Path | None) -> int | None:
    """Frames the renderer says it has rendered so far, from its progress file: Remotion's
    onProgress (JSON: renderedFrames, encodedFrames) or ffmpeg's -progress (key=value blocks, the last
    `frame=` counts). None before the renderer wrote any."""
    if progress is None:
        return None
    try:
        text = Path(progress).read_text(errors="replace")
    except FileNotFoundError:
        return None
    if text.startswith("{"):
        try:
            p = json.loads(text)
        except ValueError:       # read while it was being replaced: the next tick reads it whole
            return None
        return max(int(p.get("rendered") or 0), int(p.get("encoded") or 0))
    frames = [line[6:] for line in text.splitlines() if line.startswith("frame=")]
    return int(frames[-1]) if frames and frames[-1].strip().isdigit() else None


def as_fraction(fps) -> Fraction:
    """30, "30000/1001" or a float such as 29.97002997002997 (JSON) -> the exact rate."""
    return Fraction(str(fps)).limit_denominator(100000)


def sample_at(frame: int, fps, sample_rate: int = SAMPLE_RATE) -> int:
    """The first audio sample of a frame. Chunk boundaries come from this one function, so the
    chunks' samples add up to the whole job's, whatever the fps."""
    return int(frame * sample_rate / as_fraction(fps))


def chirp_expr(first_sample: int, sample_rate: int = SAMPLE_RATE) -> str:
    """aevalsrc expression of the test tone at absolute sample first_sample + n: a 1 s chirp,
    300 -> 3000 Hz, repeating. A sweep rather than a pure tone: a pure tone correlates equally at
    every period, so an offset of a few ms would be indistinguishable from none."""
    u = f"mod((n+{first_sample})/{sample_rate}\\,1)"
    return f"0.5*sin(2*PI*(300*{u}+1350*{u}*{u}))"


def ffmpeg(args: list, what: str = "ffmpeg") -> None:
    argv = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-nostdin", "-y", *map(str, args)]
    proc.run(argv, what=what, error=RenderError)


def _testsrc(spec: dict, first: int, last: int, video: Path, audio: Path, *, cwd: Path, progress: Path) -> None:
    """As strict as Remotion where the farm's watchdog looks: the parts are written in a private
    temporary directory and appear in the work directory only at the chunk's end, and progress is
    frames (ffmpeg's -progress). `realtime: true` in the spec renders at the job's fps (ffmpeg's realtime filter),
    so a chunk takes its own length in seconds: a long render with no output until its end."""
    fps, sr = spec["fps"], spec.get("sample_rate", SAMPLE_RATE)
    n0, n1 = sample_at(first, fps, sr), sample_at(last + 1, fps, sr)
    # testsrc2 draws the frame number and time itself: trimming keeps them absolute.
    vf = f"trim=start_frame={first}:end_frame={last + 1},setpts=PTS-STARTPTS"
    if spec.get("realtime"):       # after the trim: the frames before `first` are skipped at full speed
        vf += ",realtime"
    private = Path(tempfile.mkdtemp(prefix=f".{video.stem.lstrip('.')}.", suffix=".render", dir=video.parent))
    try:
        ffmpeg([
            "-progress", progress, "-stats_period", "0.5",
            "-f", "lavfi", "-i", f"testsrc2=size={spec['width']}x{spec['height']}:rate={as_fraction(fps)}",
            "-f", "lavfi", "-i", f"aevalsrc=exprs='{chirp_expr(n0, sr)}':s={sr}",
            "-map", "0:v", "-vf", vf, "-frames:v", last + 1 - first,
            "-c:v", "libx264", "-preset", "veryfast", "-crf", 18, "-pix_fmt", "yuv420p", "-f", "mpegts",
            private / "video.ts",
            "-map", "1:a", "-af", f"atrim=end_sample={n1 - n0}", "-c:a", "pcm_s16le", "-f", "wav",
            private / "audio.wav",
        ], what="testsrc render")
        shutil.move(private / "video.ts", video)
        shutil.move(private / "audio.wav", audio)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _remotion(spec: dict, first: int, last: int, video: Path, audio: Path, *, cwd: Path, progress: Path) -> None:
    remotion.render_range(spec, first, last, video, audio, cwd=cwd, progress=progress)


RENDERERS = {"testsrc": _testsrc, "remotion": _remotion}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def wav_samples(path: Path) -> int:
    with wave.open(str(path), "rb") as w:
        return w.getnframes()


def render_chunk(spec: dict, index: int, first: int, last: int, workdir: Path, *,
                 progress: Path | None = None) -> dict:
    """Render frames first..last (inclusive) into workdir/part-{index:05d}.ts and .wav.
    Returns {"video", "audio", "frames", "seconds"}; seconds is the render's wall time. The renderer
    keeps `progress` (a file; default one beside the parts) up to date with the frames it has
    rendered (frames_done reads it); it is removed at the end."""
    renderer = RENDERERS.get(spec.get("renderer"))
    if renderer is None:
        raise RenderError(f"unknown renderer {spec.get('renderer')!r}: one of {sorted(RENDERERS)}")
    if not 0 <= first <= last:
        raise RenderError(f"bad frame range {first}..{last}")
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    video, audio = part_paths(workdir, index)
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp_video = workdir / f".{video.stem}.{token}.{VIDEO_EXT}"
    tmp_audio = workdir / f".{audio.stem}.{token}.wav"
    progress = Path(progress) if progress else progress_path(workdir, index, token)
    started = time.monotonic()
    try:
        renderer(spec, first, last, tmp_video, tmp_audio, cwd=workdir, progress=progress)
        sr = spec.get("sample_rate", SAMPLE_RATE)
        want = sample_at(last + 1, spec["fps"], sr) - sample_at(first, spec["fps"], sr)
        got = wav_samples(tmp_audio)
        # Remotion rounds each chunk's length to whole samples itself: one sample either way.
        if abs(got - want) > (0 if spec["renderer"] == "testsrc" else 1):
            raise RenderError(f"part {index}: {got} audio samples for frames {first}..{last}, want {want}")
        for tmp, final in ((tmp_audio, audio), (tmp_video, video)):
            _fsync(tmp)
            os.replace(tmp, final)
    finally:
        tmp_video.unlink(missing_ok=True)
        tmp_audio.unlink(missing_ok=True)
        progress.unlink(missing_ok=True)
    return {"video": str(video), "audio": str(audio), "frames": last - first + 1,
            "seconds": round(time.monotonic() - started, 3)}


def reference_audio(spec: dict, frames: int, out: Path) -> Path:
    """The job's whole audio rendered in one piece, as verify's reference: the continuous tone for
    testsrc, a single-node audio-only render for remotion. Written atomically."""
    out = Path(out).resolve()
    tmp = out.with_name(f".{out.stem}.{os.getpid()}-{secrets.token_hex(4)}.wav")
    sr = spec.get("sample_rate", SAMPLE_RATE)
    try:
        if spec.get("renderer") == "testsrc":
            ffmpeg(["-f", "lavfi", "-i", f"aevalsrc=exprs='{chirp_expr(0, sr)}':s={sr}",
                    "-af", f"atrim=end_sample={sample_at(frames, spec['fps'], sr)}",
                    "-c:a", "pcm_s16le", tmp], what="reference tone")
        else:
            remotion.render_range(spec, 0, frames - 1, tmp, None, cwd=out.parent)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
