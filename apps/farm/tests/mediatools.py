"""Helpers for the media tests: real tools or a clear failure naming the package, testsrc parts."""

import hashlib
import shutil
import subprocess
import wave

import pytest

from farm.plan import plan_chunks
from farm.render import render_chunk

TOOLS = {"ffmpeg": "ffmpeg", "ffprobe": "ffmpeg", "node": "nodejs", "npm": "npm", "chromium": "chromium"}


def require(*tools):
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} not found: install Debian's {TOOLS[tool]} package (scripts/host-packages.txt)")


def src_spec(frames, fps=30, width=160, height=90):
    return {"renderer": "testsrc", "width": width, "height": height, "fps": fps, "frames": frames}


def render_parts(spec, parts, workdir):
    """The job split into exactly `parts` chunks, rendered; the render_chunk results in order."""
    chunks = plan_chunks(spec["frames"], parts, min_chunk=1, per_node=1)
    assert len(chunks) == parts
    return [render_chunk(spec, i, first, last, workdir) for i, first, last in chunks]


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def decoded_frame_md5s(path):
    """md5 of every decoded video frame: equal lists mean the same pictures, whatever the container."""
    out = subprocess.run(["ffmpeg", "-v", "error", "-i", str(path), "-map", "0:v:0", "-f", "framemd5", "-"],
                         capture_output=True, text=True, check=True).stdout
    return [line.rsplit(",", 1)[1].strip() for line in out.splitlines() if line and not line.startswith("#")]


def pcm(path):
    """A wav file's frames, as bytes."""
    with wave.open(str(path)) as w:
        return w.readframes(w.getnframes())
