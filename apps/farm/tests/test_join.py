import json

import pytest

from farm.join import JoinError, concat_wav, join, main
from farm.render import reference_audio, render_chunk
from farm.verify import verify
from mediatools import decoded_frame_md5s, pcm, render_parts, require, sha256, src_spec

FRAMES = 320  # 10.7 s at 30 fps: 10 frames a part at 32 parts


@pytest.fixture(autouse=True)
def tools():
    require("ffmpeg", "ffprobe")


@pytest.mark.parametrize("parts", [2, 8, 32])
def test_join_is_frame_and_sample_exact(tmp_path, parts):
    spec = src_spec(FRAMES)
    rendered = render_parts(spec, parts, tmp_path / "parts")
    ref = reference_audio(spec, FRAMES, tmp_path / "ref.wav")
    out = tmp_path / "out.mp4"
    result = join([r["video"] for r in rendered], [r["audio"] for r in rendered], out, fps=30)
    assert result["parts"] == parts and result["audioSamples"] == FRAMES * 1600

    check = verify(out, frames=FRAMES, fps=30, reference_audio=ref)
    sample_ms = 1000 / 48000
    assert check["frames"] == FRAMES
    assert abs(check["offsetMs"]) < sample_ms, check
    assert abs(check["driftMs"]) < sample_ms, check
    assert check["ok"], check["reasons"]


def test_pcm_concat_is_the_continuous_tone(tmp_path):
    spec = src_spec(FRAMES)
    rendered = render_parts(spec, 8, tmp_path / "parts")
    joined = concat_wav([r["audio"] for r in rendered], tmp_path / "joined.wav")
    assert joined == {"samples": FRAMES * 1600, "channels": 1, "sampleRate": 48000}
    assert pcm(tmp_path / "joined.wav") == pcm(reference_audio(spec, FRAMES, tmp_path / "ref.wav"))


def test_video_is_not_reencoded(tmp_path):
    rendered = render_parts(src_spec(90), 3, tmp_path / "parts")
    out = tmp_path / "out.mp4"
    join([r["video"] for r in rendered], [r["audio"] for r in rendered], out, fps=30)
    parts = [md5 for r in rendered for md5 in decoded_frame_md5s(r["video"])]
    assert decoded_frame_md5s(out) == parts  # a re-encode would change the pictures


def test_part_that_ran_twice_joins_identically(tmp_path):
    spec = src_spec(120)
    rendered = render_parts(spec, 4, tmp_path / "parts")
    videos, audios = [r["video"] for r in rendered], [r["audio"] for r in rendered]
    join(videos, audios, tmp_path / "once.mp4", fps=30)
    before = [sha256(tmp_path / "parts" / n) for n in ("part-00002.ts", "part-00002.wav")]
    again = render_chunk(spec, 2, 60, 89, tmp_path / "parts")  # chunk 2 delivered a second time
    assert [again["video"], again["audio"]] == [videos[2], audios[2]]
    assert [sha256(tmp_path / "parts" / n) for n in ("part-00002.ts", "part-00002.wav")] == before
    join(videos, audios, tmp_path / "twice.mp4", fps=30)
    assert sha256(tmp_path / "twice.mp4") == sha256(tmp_path / "once.mp4")
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == sorted(
        f"part-{i:05d}.{ext}" for i in range(4) for ext in ("ts", "wav"))


def test_cli_joins_parts_made_by_ffmpeg(tmp_path, capsys):
    rendered = render_parts(src_spec(60), 2, tmp_path)
    out = tmp_path / "cli.mp4"
    assert main(["--video", *(r["video"] for r in rendered), "--audio", *(r["audio"] for r in rendered),
                 "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["parts"] == 2 and printed["fps"] == "30" and out.is_file()
    assert verify(out, frames=60, fps=30)["ok"]


def test_cli_names_a_missing_part(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--video", str(tmp_path / "nope.ts"), "--out", str(tmp_path / "x.mp4"), "--fps", "30"])
    assert e.value.code == 1
    assert "missing parts" in capsys.readouterr().err and not (tmp_path / "x.mp4").exists()


def test_join_refuses_mismatched_parts(tmp_path):
    a = render_parts(src_spec(60), 2, tmp_path / "a")
    with pytest.raises(JoinError, match="2 video parts but 1 audio"):
        join([r["video"] for r in a], [a[0]["audio"]], tmp_path / "x.mp4", fps=30)
    b = render_chunk({**src_spec(30), "sample_rate": 44100}, 1, 30, 59, tmp_path / "b")
    with pytest.raises(JoinError, match="44100 Hz"):
        join([a[0]["video"], b["video"]], [a[0]["audio"], b["audio"]], tmp_path / "x.mp4", fps=30)
    assert not (tmp_path / "x.mp4").exists()
