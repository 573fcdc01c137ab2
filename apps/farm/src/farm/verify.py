"""Check a joined MP4: frame count, audio length against the video's, audio offset and drift by
cross-correlation against a reference, and optionally PSNR of frames against a reference render.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from farm.render import as_fraction


class VerifyError(RuntimeError):
    pass


def _np():
    try:
        import numpy  # noqa: PLC0415
    except ImportError as e:  # the nodes do not need numpy; the host, which verifies, does
        raise VerifyError("numpy is needed to verify: pip install numpy") from e
    return numpy


def _run(argv: list) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run([str(a) for a in argv], check=False, capture_output=True)
    except FileNotFoundError as e:
        raise VerifyError(f"{argv[0]} not found: install Debian's ffmpeg package") from e
    if proc.returncode != 0:
        raise VerifyError(f"{argv[0]} failed: {' '.join(map(str, argv))}\n{proc.stderr.decode()[-3000:]}")
    return proc


def probe(path: Path) -> dict:
    """{"frames", "videoSeconds", "audioSeconds", "sampleRate", "samples"} of a file. Frames are the
    video's packets, counted without decoding (one frame each in MPEG-TS and MP4): a two-hour output
    is read, not decoded."""
    out = _run(["ffprobe", "-v", "error", "-count_packets", "-show_entries",
                "stream=codec_type,nb_read_packets,duration,sample_rate,duration_ts,time_base", "-of", "json",
                path]).stdout
    info = {"frames": None, "videoSeconds": None, "audioSeconds": None, "sampleRate": None}
    for s in json.loads(out)["streams"]:
        seconds = float(s["duration"]) if s.get("duration") not in (None, "N/A") else None
        if s["codec_type"] == "video" and info["frames"] is None:
            info.update(frames=int(s.get("nb_read_packets") or 0), videoSeconds=seconds)
        elif s["codec_type"] == "audio" and info["audioSeconds"] is None:
            info.update(audioSeconds=seconds, sampleRate=int(s["sample_rate"]))
            if seconds is not None:
                info["samples"] = round(seconds * info["sampleRate"])
    return info


def decode_audio(path: Path, sample_rate: int, start: int = 0, count: int | None = None):
    """The first audio stream as mono float64 at sample_rate: `count` samples from sample `start` (all
    of it by default). ffmpeg seeks to the window (atrim by sample index, after the decoder's own
    start trimming), so a window of a two-hour file costs the window, not the file."""
    np = _np()
    seek = max(0.0, start / sample_rate - 1.0)     # input seek to a second before, then exact by samples
    skip = start - round(seek * sample_rate)
    trim = f"atrim=start_sample={skip}" + (f":end_sample={skip + count}" if count is not None else "")
    raw = _run(["ffmpeg", "-v", "error", "-nostdin", *(["-ss", f"{seek:.6f}"] if seek else []), "-i", path,
                "-map", "0:a:0", "-ac", "1", "-ar", sample_rate, "-af", f"asetpts=N/SR/TB,{trim}",
                "-f", "f32le", "-"]).stdout
    return np.frombuffer(raw, dtype="<f4").astype(np.float64)


def find_lag(signal, reference, at: int, window: int, max_lag: int) -> tuple[float, float]:
    """Where reference[at:at+window] is found in signal, relative to `at`, in samples (sub-sample,
    by a parabola through the peak), and the normalized correlation there (1 = identical).
    Positive: the signal is late."""
    np = _np()
    ref = reference[at:at + window]
    seg = np.zeros(window + 2 * max_lag)
    lo, hi = at - max_lag, at + window + max_lag
    src = signal[max(lo, 0):min(hi, len(signal))]
    seg[max(lo, 0) - lo:max(lo, 0) - lo + len(src)] = src
    n = 1 << int(np.ceil(np.log2(len(seg) + window)))
    corr = np.fft.irfft(np.fft.rfft(seg, n) * np.conj(np.fft.rfft(ref, n)), n)[:2 * max_lag + 1]
    energy = np.concatenate([[0.0], np.cumsum(seg * seg)])
    norm = np.sqrt(np.maximum(energy[window:window + 2 * max_lag + 1] - energy[:2 * max_lag + 1], 0) * np.dot(ref, ref))
    corr = np.where(norm > 1e-9, corr / np.maximum(norm, 1e-9), 0.0)
    # A periodic reference (a pure tone) matches as well one period away: of the peaks as high as
    # the highest, take the one nearest no offset.
    top = corr.max()
    peaks = np.flatnonzero((corr >= top - 1e-3) & (corr >= np.roll(corr, 1)) & (corr >= np.roll(corr, -1)))
    k = int(peaks[np.argmin(np.abs(peaks - max_lag))]) if len(peaks) else int(np.argmax(corr))
    frac = 0.0
    if 0 < k < len(corr) - 1:
        a, b, c = corr[k - 1], corr[k], corr[k + 1]
        if a - 2 * b + c < 0:
            frac = 0.5 * (a - c) / (a - 2 * b + c)
    return float(k - max_lag + frac), float(corr[k])


def audio_offset(out: Path, reference: Path, *, window_s: float = 0.25, max_lag_s: float = 0.45,
                 margin_s: float = 0.05) -> dict:
    """Offset of out's audio against the reference at the start and at the end, in ms."""
    np = _np()
    info = probe(reference)
    rate, total = info["sampleRate"], info.get("samples")
    if not rate or not total:
        raise VerifyError(f"{reference} has no audio stream")
    window = min(int(window_s * rate), total // 4)
    margin, max_lag = min(int(margin_s * rate), total // 8), int(max_lag_s * rate)
    result = {"sampleRate": rate}
    for name, at in (("start", margin), ("end", total - margin - window)):
        lo = max(0, at - max_lag)                   # only the window and its lags, from both files
        ref = decode_audio(reference, rate, lo, at + window - lo)
        if window < 16 or np.dot(ref[at - lo:], ref[at - lo:]) < 1e-6 * window:
            result[name] = None  # a silent (or too short) reference: nothing to measure against
            continue
        sig = decode_audio(out, rate, lo, at + window + max_lag - lo)
        lag, peak = find_lag(sig, ref, at - lo, window, max_lag)
        result[name] = {"offsetMs": round(1000 * lag / rate, 4), "peak": round(peak, 4)}
    return result


def psnr(out: Path, reference: Path, *, first: int = 0) -> float:
    """Mean PSNR (dB) of the reference's frames against out's frames first, first+1, ...
    (inf when identical)."""
    n = probe(reference)["frames"]
    graph = (f"[0:v]trim=start_frame={first}:end_frame={first + n},setpts=PTS-STARTPTS[a];"
             "[1:v]setpts=PTS-STARTPTS[b];[a][b]psnr")
    err = _run(["ffmpeg", "-hide_banner", "-nostdin", "-i", out, "-i", reference, "-lavfi", graph,
                "-f", "null", "-"]).stderr.decode()
    m = re.search(r"PSNR .*average:(\S+)", err)
    if not m:
        raise VerifyError(f"no PSNR in ffmpeg's output:\n{err[-2000:]}")
    return float(m.group(1))


def _check_offset(out: Path, reference: Path, max_offset_ms: float | None, result: dict) -> list[str]:
    measured = result["audioMatch"] = audio_offset(out, reference)
    tol = max_offset_ms if max_offset_ms is not None else 1000 / measured["sampleRate"]
    reasons = [f"audio at the {name} does not match the reference (correlation {measured[name]['peak']})"
               for name in ("start", "end") if measured[name] and measured[name]["peak"] < 0.5]
    # an offset read where nothing matched means nothing
    start, end = ((m if m and m["peak"] >= 0.5 else None) for m in (measured["start"], measured["end"]))
    if start:
        result["offsetMs"] = start["offsetMs"]
        if abs(start["offsetMs"]) > tol:
            reasons.append(f"audio offset {start['offsetMs']} ms at the start (tolerance {tol:.4f} ms)")
    if start and end:
        result["driftMs"] = round(end["offsetMs"] - start["offsetMs"], 4)
        if abs(result["driftMs"]) > tol:
            reasons.append(f"audio drift {result['driftMs']} ms from start to end (tolerance {tol:.4f} ms)")
    return reasons


def verify(out: Path, *, frames: int, fps, reference_audio: Path | None = None,
           reference_video: Path | None = None, reference_first: int = 0, psnr_min: float = 35.0,
           max_offset_ms: float | None = None) -> dict:
    """{"frames", "videoSeconds", "audioSeconds", "offsetMs", "driftMs", "ok", "reasons"}.

    The offset is measured at the start and the end against reference_audio (the continuous tone,
    or a single-node render); drift = end offset - start offset. Both must be within one sample
    period (max_offset_ms). With reference_video, the mean PSNR of its frames against out's frames
    from reference_first on must reach psnr_min."""
    fps = as_fraction(fps)
    info = probe(out)
    reasons: list[str] = []
    result = {"frames": info["frames"], "videoSeconds": info["videoSeconds"],
              "audioSeconds": info["audioSeconds"], "offsetMs": None, "driftMs": None}
    if info["frames"] != frames:
        reasons.append(f"{info['frames']} frames, want {frames}")
    want_s = float(frames / fps)
    if info["videoSeconds"] is None or abs(info["videoSeconds"] - want_s) > 0.5 / float(fps):
        reasons.append(f"video lasts {info['videoSeconds']} s, {frames} frames at {fps} fps last {want_s:.4f} s")
    if info["audioSeconds"] is None:
        reasons.append("no audio stream")
    else:
        # within a frame, or an AAC frame (1024 samples) where that is longer
        slack = max(1 / float(fps), 1024 / (info["sampleRate"] or 48000)) + 1e-3
        if abs(info["audioSeconds"] - want_s) > slack:
            reasons.append(f"audio lasts {info['audioSeconds']} s, the video {want_s:.4f} s")
    if reference_audio is not None and info["audioSeconds"] is not None:
        reasons += _check_offset(out, Path(reference_audio), max_offset_ms, result)
    if reference_video is not None:
        result["psnr"] = psnr(out, Path(reference_video), first=reference_first)
        if result["psnr"] < psnr_min:
            reasons.append(f"PSNR {result['psnr']} dB against the reference, want >= {psnr_min}")
    result.update(ok=not reasons, reasons=reasons)
    return result
