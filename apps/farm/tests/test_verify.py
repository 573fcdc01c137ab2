import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

from farm.join import join
from farm.render import reference_audio
from farm.verify import decode_audio, find_lag, verify
from mediatools import render_parts, require, src_spec

PRIMING = 2048  # samples: the AAC priming that shifts Remotion's own ADTS audio by 42.67 ms


@pytest.fixture(autouse=True)
def tools():
    require("ffmpeg", "ffprobe")


@pytest.fixture
def job(tmp_path):
    spec = src_spec(120)
    parts = render_parts(spec, 4, tmp_path / "parts")
    return spec, parts, reference_audio(spec, 120, tmp_path / "ref.wav")


def joined(parts, out, audios=None):
    join([p["video"] for p in parts], audios if audios is not None else [p["audio"] for p in parts], out, fps=30)
    return out


def shifted(wav, out, samples):
    """The part's audio late by `samples`: silence in front, the same length."""
    with wave.open(str(wav)) as src:
        params, data = src.getparams(), src.readframes(src.getnframes())
    width = params.sampwidth * params.nchannels
    with wave.open(str(out), "wb") as dst:
        dst.setparams(params)
        dst.writeframes(b"\0" * width * samples + data[:len(data) - width * samples])
    return str(out)


def test_good_join_is_ok(job, tmp_path):
    _, parts, ref = job
    check = verify(joined(parts, tmp_path / "out.mp4"), frames=120, fps=30, reference_audio=ref)
    assert check["ok"] and check["reasons"] == [] and check["frames"] == 120
    assert check["videoSeconds"] == pytest.approx(4.0) and check["audioSeconds"] == pytest.approx(4.0)


def test_wrong_frame_count_is_flagged(job, tmp_path):
    _, parts, ref = job
    out = joined(parts[:3], tmp_path / "short.mp4", [p["audio"] for p in parts[:3]])
    check = verify(out, frames=120, fps=30, reference_audio=ref)
    assert not check["ok"] and check["frames"] == 90
    assert "90 frames, want 120" in check["reasons"]


@pytest.mark.parametrize("part, reason", [(0, "audio offset 42.66"), (3, "audio drift 42.66")])
def test_shifted_part_is_flagged(job, tmp_path, part, reason):
    _, parts, ref = job
    audios = [p["audio"] for p in parts]
    audios[part] = shifted(audios[part], tmp_path / "shifted.wav", PRIMING)
    check = verify(joined(parts, tmp_path / "out.mp4", audios), frames=120, fps=30, reference_audio=ref)
    assert not check["ok"]
    assert any(r.startswith(reason) for r in check["reasons"]), check["reasons"]


def test_aac_concatenated_parts_are_flagged(job, tmp_path):
    """The PC's way: each part's audio encoded to AAC, the AAC concatenated."""
    _, parts, ref = job
    listing = tmp_path / "aac.txt"
    for p in parts:
        subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", p["audio"], "-c:a", "aac",
                        str(Path(p["audio"]).with_suffix(".aac"))], check=True)
    listing.write_text("".join(f"file '{Path(p['audio']).with_suffix('.aac')}'\n" for p in parts))
    video = joined(parts, tmp_path / "video.mp4", [])
    out = tmp_path / "aac.mp4"
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-i", str(video), "-f", "concat", "-safe", "0", "-i",
                    str(listing), "-map", "0:v", "-map", "1:a", "-c", "copy", str(out)], check=True)
    check = verify(out, frames=120, fps=30, reference_audio=ref)
    assert not check["ok"] and check["offsetMs"] > 20 and check["driftMs"] > 20, check


def test_no_audio_is_flagged(job, tmp_path):
    _, parts, _ = job
    check = verify(joined(parts, tmp_path / "mute.mp4", []), frames=120, fps=30)
    assert check["reasons"] == ["no audio stream"]


def test_psnr_against_a_reference_render(job, tmp_path):
    _, parts, _ = job
    out = joined(parts, tmp_path / "out.mp4")
    # part 2 (frames 60..89) as the single-node reference of those frames
    same = verify(out, frames=120, fps=30, reference_video=Path(parts[2]["video"]), reference_first=60)
    assert same["ok"] and same["psnr"] > 60
    wrong = verify(out, frames=120, fps=30, reference_video=Path(parts[2]["video"]), reference_first=50)
    assert not wrong["ok"] and wrong["reasons"][0].startswith("PSNR")


def test_find_lag_is_sample_exact():
    rate = 48000
    t = np.arange(2 * rate) / rate
    u = t % 1.0
    ref = 0.5 * np.sin(2 * np.pi * (300 * u + 1350 * u * u))
    for shift in (0, 1, 37, -250, 2048):
        sig = np.roll(ref, shift)
        lag, peak = find_lag(sig, ref, 12000, 12000, int(0.45 * rate))
        assert lag == pytest.approx(shift, abs=0.01) and peak > 0.999


def test_find_lag_on_a_pure_tone_takes_the_peak_nearest_zero():
    rate = 48000
    tone = np.sin(2 * np.pi * 440 * np.arange(rate) / rate)  # matches itself every 109.09 samples
    for shift in (0, 10, -20):
        lag, _ = find_lag(np.roll(tone, shift), tone, 12000, 12000, int(0.45 * rate))
        assert lag == pytest.approx(shift, abs=0.05)


def test_a_window_decodes_the_same_samples_as_the_whole_file(job, tmp_path):
    """verify reads only the windows it checks (a two-hour output is not decoded whole); a window must
    be exactly those samples of the whole decode, in the reference WAV and in the joined MP4's AAC."""
    _, parts, ref = job
    out = joined(parts, tmp_path / "out.mp4")
    for path in (ref, out):
        whole = np.frombuffer(subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(path), "-map", "0:a:0",
                                              "-ac", "1", "-ar", "48000", "-f", "f32le", "-"], check=True,
                                             capture_output=True).stdout, dtype="<f4").astype(np.float64)
        for start in (0, 100, 48000 + 7, 2 * 48000 + 123):
            part = decode_audio(path, 48000, start, 4000)
            assert len(part) == 4000 and np.array_equal(part, whole[start:start + 4000]), (path, start)
