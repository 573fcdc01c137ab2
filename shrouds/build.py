#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Render the fan shrouds: each variant to an STL (openscad, headless) and a PNG preview.

    python3 shrouds/build.py [--variant NAME] [-D name=value ...] [--out DIR] [--previews DIR]

STLs are cached under build/shrouds/, named by a hash of the variant's .scad, the shared
shroud_body.scad and the overrides, so an unchanged shroud is not rendered twice. The parameter
checks live in the .scad files (assert): a set that cannot work fails with openscad's message,
which names the parameter, and leaves no STL behind (openscad writes to a temporary name that
is renamed only on success).

The preview is drawn from the STL here (numpy and Pillow, flat shading): openscad's own PNG
export needs an OpenGL context, which a headless machine does not have.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageChops, ImageDraw

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BODY = HERE / "shroud_body.scad"
VARIANTS = {"shroud_120": HERE / "shroud_120.scad", "shroud_2x80": HERE / "shroud_2x80.scad"}
CACHE = ROOT / "build" / "shrouds"
PREVIEWS = HERE / "previews"

_PARAM = re.compile(r"^([a-z_][a-z0-9_]*)\s*=\s*(-?[0-9.]+)\s*;", re.MULTILINE)


class ShroudError(RuntimeError):
    """openscad refused the parameter set (or failed); the message is openscad's."""


def params(variant: str, overrides: dict | None = None) -> dict[str, float]:
    """The numeric parameters at the top of a variant's .scad, with the overrides applied."""
    found = {name: float(value) for name, value in _PARAM.findall(VARIANTS[variant].read_text())}
    for name, value in (overrides or {}).items():
        if name not in found:
            raise ShroudError("unknown parameter %s for %s (known: %s)" % (name, variant, ", ".join(sorted(found))))
        found[name] = float(value)
    return found


def cache_key(variant: str, overrides: dict | None = None) -> str:
    digest = hashlib.sha256()
    for path in (VARIANTS[variant], BODY):
        digest.update(path.read_bytes())
    digest.update(json.dumps(sorted((overrides or {}).items())).encode())
    return digest.hexdigest()[:16]


def render(variant: str, overrides: dict | None = None, out_dir: Path = CACHE) -> Path:
    """The STL of one variant, rendered only when no cached copy has the same key."""
    overrides = dict(overrides or {})
    params(variant, overrides)  # an unknown name fails here, before openscad runs
    out_dir = Path(out_dir)
    stl = out_dir / ("%s-%s.stl" % (variant, cache_key(variant, overrides)))
    if stl.exists():
        return stl
    openscad = shutil.which("openscad")
    if openscad is None:
        raise ShroudError("openscad is not on PATH: install Debian's openscad (scripts/bootstrap-host.sh unit, "
                          "which reads scripts/host-packages.txt)")
    out_dir.mkdir(parents=True, exist_ok=True)
    partial = stl.with_name(".%s.%d.stl" % (stl.stem, os.getpid()))
    defines = [arg for name, value in sorted(overrides.items()) for arg in ("-D", "%s=%s" % (name, value))]
    try:
        done = subprocess.run([openscad, "-o", str(partial), *defines, str(VARIANTS[variant])],
                              capture_output=True, text=True, timeout=600, check=False)
        errors = [line for line in done.stderr.splitlines() if line.startswith(("ERROR", "WARNING"))]
        if done.returncode != 0 or errors or not partial.exists() or partial.stat().st_size == 0:
            raise ShroudError("%s: %s" % (variant, "\n".join(errors) or done.stderr.strip()[-2000:]))
        partial.replace(stl)
    finally:
        partial.unlink(missing_ok=True)
    return stl


def read_stl(path: Path) -> np.ndarray:
    """Triangles (n, 3, 3) of an ASCII STL, which is what openscad writes."""
    numbers = re.findall(r"vertex\s+(\S+)\s+(\S+)\s+(\S+)", Path(path).read_text())
    return np.array(numbers, dtype=float).reshape(-1, 3, 3)


def _view(triangles: np.ndarray, azimuth: float, elevation: float):
    az, el = np.radians(azimuth), np.radians(elevation)
    eye = np.array([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)])
    right = np.cross([0.0, 0.0, 1.0], eye)
    right /= np.linalg.norm(right)
    up = np.cross(eye, right)
    centred = triangles - triangles.reshape(-1, 3).mean(axis=0)
    return centred @ right, centred @ up, centred @ eye, eye


def preview(stl: Path, png: Path, size: int = 360) -> Path:
    """Two views side by side (inlet end, fan face), flat-shaded, far faces drawn first."""
    triangles = read_stl(stl)
    normals = np.cross(triangles[:, 1] - triangles[:, 0], triangles[:, 2] - triangles[:, 0])
    normals /= np.linalg.norm(normals, axis=1, keepdims=True) + 1e-12
    image = Image.new("RGB", (2 * size, size), (255, 255, 255))
    draw = ImageDraw.Draw(image)
    light = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])
    base = np.array([226, 118, 34])
    for panel, (azimuth, elevation) in enumerate([(-60, 30), (-60, -35)]):
        x, y, depth, eye = _view(triangles, azimuth, elevation)
        facing = normals @ eye > 0
        scale = 0.9 * size / max(np.ptp(x), np.ptp(y))
        px = size * panel + size / 2 + x * scale
        py = size / 2 - y * scale
        shade = 0.35 + 0.65 * np.clip(normals @ light, 0, 1)
        for i in np.argsort(depth.mean(axis=1)):
            if facing[i]:
                colour = tuple(int(c) for c in base * shade[i])
                draw.polygon(list(zip(px[i], py[i], strict=True)), fill=colour, outline=colour)
    _, top, _, bottom = ImageChops.difference(image, Image.new("RGB", image.size, "white")).getbbox()
    image = image.crop((0, max(top - 8, 0), image.width, min(bottom + 8, image.height)))
    png.parent.mkdir(parents=True, exist_ok=True)
    image.quantize(colors=64).save(png, optimize=True)
    return png


def parse_define(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError("-D takes name=number, not %r" % text) from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), action="append")
    parser.add_argument("-D", dest="defines", type=parse_define, action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--out", type=Path, default=CACHE)
    parser.add_argument("--previews", type=Path, help="where the PNGs go (default: shrouds/previews/, or beside "
                        "the STLs when -D changes a parameter)")
    parser.add_argument("--no-previews", action="store_true")
    args = parser.parse_args(argv)
    previews = args.previews or (args.out if args.defines else PREVIEWS)
    for variant in args.variant or sorted(VARIANTS):
        try:
            stl = render(variant, dict(args.defines), args.out)
        except ShroudError as exc:
            print("shrouds: %s" % exc, file=sys.stderr)
            return 1
        print(stl.relative_to(ROOT) if stl.is_relative_to(ROOT) else stl)
        if not args.no_previews:
            png = preview(stl, previews / ("%s.png" % variant))
            print(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
