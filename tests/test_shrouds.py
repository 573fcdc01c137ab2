# SPDX-License-Identifier: MIT
"""The printable fan shrouds (shrouds/): each variant renders to a closed mesh that fits the
bed, fits the card, takes the fan's screws, and has no wall thinner than its `wall` parameter;
a parameter set that cannot work is refused by name before any STL exists.

Renders are cached in build/shrouds/ (shrouds/build.py), so only a changed .scad re-renders.
Geometry is measured from the mesh itself: cross-sections and ray casts, in numpy.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import trimesh
import trimesh.sample
from trimesh.intersections import mesh_plane

ROOT = Path(__file__).resolve().parent.parent
# shrouds/build.py by its path: a plain `import build` could find PyPA's build package instead
_spec = importlib.util.spec_from_file_location("shroud_build", ROOT / "shrouds" / "build.py")
build = importlib.util.module_from_spec(_spec)
sys.modules["shroud_build"] = build
_spec.loader.exec_module(build)

MM = 0.02  # geometric tolerance: openscad writes coordinates to about 1e-6 mm


@pytest.fixture(scope="module", params=sorted(build.VARIANTS))
def shroud(request):
    p = build.params(request.param)
    mesh = trimesh.load(build.render(request.param), file_type="stl")
    return p, mesh


def first_hits(origins: np.ndarray, directions: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Distance along each ray to the nearest triangle in front of it (inf: none)."""
    v0, e1, e2 = triangles[:, 0], triangles[:, 1] - triangles[:, 0], triangles[:, 2] - triangles[:, 0]
    out = np.full(len(origins), np.inf)
    for start in range(0, len(origins), 128):
        o, d = origins[start:start + 128, None, :], directions[start:start + 128, None, :]
        p = np.cross(d, e2)
        det = np.einsum("rtk,tk->rt", p, e1)
        ok = np.abs(det) > 1e-12
        inv = np.where(ok, 1.0 / np.where(ok, det, 1.0), 0.0)
        s = o - v0
        u = np.einsum("rtk,rtk->rt", s, p) * inv
        q = np.cross(s, e1)
        v = np.einsum("rtk,rtk->rt", np.broadcast_to(d, q.shape), q) * inv
        t = np.einsum("rtk,tk->rt", q, e2) * inv
        hit = ok & (u >= -1e-9) & (v >= -1e-9) & (u + v <= 1 + 1e-9) & (t > 1e-9)
        out[start:start + 128] = np.where(hit, t, np.inf).min(axis=1)
    return out


def section(mesh, z: float) -> np.ndarray:
    """The mesh cut at height z: line segments (n, 2, 2) in the xy plane."""
    return mesh_plane(mesh, [0, 0, 1], [0, 0, z])[:, :, :2]


def ray_2d(segments: np.ndarray, origin, direction) -> list[float]:
    """Distances from origin along direction to every wall it crosses, nearest first."""
    a, b = segments[:, 0], segments[:, 1]
    d = np.asarray(direction, float)
    e = b - a
    denom = d[0] * e[:, 1] - d[1] * e[:, 0]
    ok = np.abs(denom) > 1e-12
    w = a - np.asarray(origin, float)
    t = np.where(ok, (w[:, 0] * e[:, 1] - w[:, 1] * e[:, 0]) / np.where(ok, denom, 1), -1)
    s = np.where(ok, (w[:, 0] * d[1] - w[:, 1] * d[0]) / np.where(ok, denom, 1), -1)
    hits = np.sort(t[(t > 0) & (s >= 0) & (s <= 1)])
    return hits[np.r_[True, np.diff(hits) > 1e-6]].tolist()  # a ray through a vertex meets two segments


def outlines(mesh, z: float) -> list[np.ndarray]:
    """The mesh cut at height z as closed outlines (points in the xy plane). Segments are joined
    by the mesh edge their ends lie on, not by comparing coordinates, so rounding cannot split
    an outline in two."""
    segments, faces = mesh_plane(mesh, [0, 0, 1], [0, 0, z], return_faces=True)
    tri, v = mesh.faces[faces], mesh.vertices
    edge_of = np.zeros((len(segments), 2), dtype=np.int64)
    best = np.full((len(segments), 2), np.inf)
    for k in range(3):
        a, b = tri[:, k], tri[:, (k + 1) % 3]
        dz = v[b, 2] - v[a, 2]
        t = (z - v[a, 2]) / np.where(dz == 0, 1, dz)
        crossing = (dz != 0) & (t >= 0) & (t <= 1)
        point = v[a] + t[:, None] * (v[b] - v[a])
        key = np.minimum(a, b) * len(v) + np.maximum(a, b)
        for end in (0, 1):
            gap = np.where(crossing, np.linalg.norm(segments[:, end] - point, axis=1), np.inf)
            closer = gap < best[:, end]
            best[closer, end], edge_of[closer, end] = gap[closer], key[closer]
    _, ids = np.unique(edge_of, return_inverse=True)
    ids = ids.reshape(-1, 2)
    parent = list(range(ids.max() + 1))

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in ids:
        parent[root(i)] = root(j)
    groups: dict[int, list[int]] = {}
    for n, (i, _) in enumerate(ids):
        groups.setdefault(root(i), []).append(n)
    return [segments[g][:, :, :2].reshape(-1, 2) for g in groups.values()]


def fan_centres(p) -> list[float]:
    n = int(p["fan_count"])
    return [(i - (n - 1) / 2) * p["fan_size"] for i in range(n)]


def test_mesh_is_closed_with_consistent_outward_normals(shroud):
    _, mesh = shroud
    assert mesh.is_watertight, "open edges: the slicer would have to guess"
    assert mesh.is_winding_consistent
    assert mesh.volume > 0, "normals point inwards"
    edges = np.sort(mesh.edges, axis=1)
    _, counts = np.unique(edges, axis=0, return_counts=True)
    assert set(counts.tolist()) == {2}, "an edge shared by more than two faces (non-manifold)"


def test_fits_the_bed_lying_on_the_fan_plate(shroud):
    p, mesh = shroud
    (x0, y0, z0), (x1, y1, z1) = mesh.bounds
    assert z0 == pytest.approx(0, abs=1e-6)
    assert x1 - x0 <= p["bed_x"] and y1 - y0 <= p["bed_y"] and z1 - z0 <= p["bed_z"]
    # the plate, not an edge, is on the bed: the faces at z = 0 cover most of the fan's square
    down = (mesh.face_normals[:, 2] < -0.999) & (np.abs(mesh.triangles_center[:, 2]) < 1e-6)
    assert mesh.area_faces[down].sum() > 0.2 * p["fan_count"] * p["fan_size"] ** 2


def test_collar_fits_the_card_within_the_clearance(shroud):
    p, mesh = shroud
    top = p["taper_length"] + p["collar_depth"]
    cut = section(mesh, top - p["collar_depth"] / 2)
    want = {0: p["card_height"] + 2 * p["clearance"], 1: p["card_thickness"] + 2 * p["clearance"]}
    for axis, card in ((0, p["card_height"]), (1, p["card_thickness"])):
        unit = np.eye(2)[axis]
        plus, minus = ray_2d(cut, (0, 0), unit), ray_2d(cut, (0, 0), -unit)
        inside = plus[0] + minus[0]
        assert inside == pytest.approx(want[axis], abs=MM)
        assert inside > card, "the card would not go in"
        assert plus[1] - plus[0] == pytest.approx(p["wall"], abs=MM)
    # below the collar the opening is smaller than the card: its end face rests on the stop lip
    lip = section(mesh, p["taper_length"] - 0.5)
    slot_x = -(p["card_height"] / 2 - p["stop_lip"]) + 1
    half = ray_2d(lip, (slot_x, 0), (0, 1))[0]
    assert half < p["card_thickness"] / 2


def test_fan_plate_has_the_fans_screw_pattern(shroud):
    p, mesh = shroud
    holes = []
    for outline in outlines(mesh, p["plate_thickness"] / 2):
        centre = (outline.max(axis=0) + outline.min(axis=0)) / 2
        radius = np.linalg.norm(outline - centre, axis=1)
        if radius.max() < p["hole_d"]:
            holes.append((centre, radius))
    expected = sorted((x + sx * p["screw_spacing"] / 2, sy * p["screw_spacing"] / 2)
                      for x in fan_centres(p) for sx in (-1, 1) for sy in (-1, 1))
    found = sorted((round(c[0], 3), round(c[1], 3)) for c, _ in holes)
    assert len(found) == len(expected)
    assert np.allclose(found, expected, atol=MM), found
    for _, radius in holes:
        # a polygon of 24 sides: its flats sit at cos(pi/24) of the nominal radius
        assert radius.max() == pytest.approx(p["hole_d"] / 2, abs=MM)
        assert radius.min() >= p["hole_d"] / 2 * np.cos(np.pi / 24) - MM
    # and each bore opens the fan's swept circle where it meets the fan
    face = section(mesh, 1e-3)
    for x in fan_centres(p):
        for direction in ((0, 1), (0, -1), (1, 0), (-1, 0)):
            assert ray_2d(face, (x, 0), direction)[0] == pytest.approx(p["fan_bore"] / 2, abs=MM)


def test_every_screw_head_can_be_reached_from_above(shroud):
    p, mesh = shroud
    r = p["screw_head_d"] / 2
    ring = [(0, 0)] + [(r * np.cos(a), r * np.sin(a)) for a in np.linspace(0, 2 * np.pi, 16, endpoint=False)]
    origins = np.array([(x + sx * p["screw_spacing"] / 2 + dx, sy * p["screw_spacing"] / 2 + dy,
                         p["plate_thickness"] + 0.01)
                        for x in fan_centres(p) for sx in (-1, 1) for sy in (-1, 1) for dx, dy in ring])
    up = np.tile([0.0, 0.0, 1.0], (len(origins), 1))
    assert np.isinf(first_hits(origins, up, mesh.triangles)).all(), "a duct wall hangs over a screw"


def test_no_wall_is_thinner_than_the_wall_parameter(shroud):
    """Thickness at a point = the ray from it straight into the material until it leaves again,
    at 8,000 points spread over the walls by area (a fixed seed: the same points every run).
    Horizontal faces (the plate's faces, the collar's rim, the stop lip) are ends of walls, not
    walls: the plate is checked by its own thickness."""
    p, mesh = shroud
    walls = np.abs(mesh.face_normals[:, 2]) < 0.95
    points, faces = trimesh.sample.sample_surface(mesh, 8000, face_weight=mesh.area_faces * walls, seed=43)
    normals = mesh.face_normals[faces]
    thickness = first_hits(points - 1e-6 * normals, -normals, mesh.triangles)
    assert np.isfinite(thickness).all(), "a ray into the wall never left it: the mesh is not closed"
    thinnest = thickness.argmin()
    assert thickness.min() >= p["wall"] - MM, "a wall of %.2f mm at %s" % (
        thickness.min(), np.round(points[thinnest], 1).tolist())
    z = np.unique(np.round(mesh.vertices[:, 2], 6))
    assert z[1] == pytest.approx(p["plate_thickness"]), "the first step up from the bed is the plate's top"


@pytest.mark.parametrize(("variant", "overrides", "named"), [
    ("shroud_120", {"fan_size": 250}, "fan_size"),
    ("shroud_2x80", {"bed_x": 150}, "fan_size"),
    ("shroud_120", {"wall": 0.6}, "wall"),
    ("shroud_120", {"nozzle_width": 1.2}, "wall"),
    ("shroud_120", {"taper_length": 25}, "taper_length"),
    ("shroud_2x80", {"hole_d": 9}, "hole_d"),
])
def test_a_parameter_set_that_cannot_work_is_refused_by_name(tmp_path, variant, overrides, named):
    with pytest.raises(build.ShroudError, match=r"Assertion .* failed: \"%s \(" % named):
        build.render(variant, overrides, out_dir=tmp_path)
    assert list(tmp_path.iterdir()) == [], "an STL (or a partial one) was left behind"


def test_an_unknown_parameter_is_refused_before_openscad_runs(tmp_path):
    with pytest.raises(build.ShroudError, match="unknown parameter card_width"):
        build.render("shroud_120", {"card_width": 40}, out_dir=tmp_path)


def test_the_cache_key_follows_the_parameters():
    assert build.cache_key("shroud_120") == build.cache_key("shroud_120", {})
    assert build.cache_key("shroud_120") != build.cache_key("shroud_120", {"wall": 2.4})
    assert build.cache_key("shroud_120") != build.cache_key("shroud_2x80")


def test_the_readme_shows_every_variants_preview():
    readme = (ROOT / "shrouds" / "README.md").read_text()
    for variant in build.VARIANTS:
        png = ROOT / "shrouds" / "previews" / ("%s.png" % variant)
        assert png.stat().st_size > 1000
        assert "previews/%s.png" % variant in readme
