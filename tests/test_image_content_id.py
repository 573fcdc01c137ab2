"""A node image's build_id names what ends up on the disk, not the builder's code: a change to the
builder (its recipe) that writes the same tree names the same build, the host's store files the new
recipe under the build it has, and the rollout finds nothing to do. A change on the disk is a new build."""

from __future__ import annotations

import json

from ansible.module_utils.vca_node_image import ImageStore
from test_image_access import tree_with_accounts
from test_node_image import make_build

from conftest import ROOT
from vca_image import build
from vca_image.profile import load

PROFILES = ROOT / "image_builder" / "profiles"


def configured(tmp_path, name):
    rootfs = tree_with_accounts(tmp_path / name)
    return build.configure(load("debian-12", PROFILES), rootfs, ROOT / "image_builder", [], "2.06-13"), rootfs


def test_a_builder_change_that_writes_the_same_tree_names_the_same_build(tmp_path, monkeypatch):
    before, _ = configured(tmp_path, "before")
    monkeypatch.setattr(build, "recipe", lambda profile: "0123456789abcdef")   # the builder's code changed
    after, rootfs = configured(tmp_path, "after")
    assert after["recipe"] != before["recipe"]                 # so the role builds again...
    assert after["build_id"] == before["build_id"]             # ...and the nodes keep their disks
    assert json.loads((rootfs / build.RECORD).read_text())["build_id"] == before["build_id"]


def test_a_change_on_the_disk_is_a_new_build(tmp_path):
    first, _ = configured(tmp_path, "first")
    rootfs = tree_with_accounts(tmp_path / "second")
    (rootfs / "etc/motd").write_text("one byte more on the disk\n")
    second = build.configure(load("debian-12", PROFILES), rootfs, ROOT / "image_builder", [], "2.06-13")
    assert second["build_id"] != first["build_id"]
    bootloader = build.configure(load("debian-12", PROFILES), tree_with_accounts(tmp_path / "third"),
                                 ROOT / "image_builder", [], "2.12-1")
    assert bootloader["build_id"] != first["build_id"]         # the ESP's GRUB is on the disk too


def test_the_store_files_a_new_recipe_under_the_build_it_has(tmp_path):
    (src, rec) = make_build(tmp_path, "tiny", "one")
    store = ImageStore(str(tmp_path / "store"))
    store.add(str(src))
    again, rec2 = make_build(tmp_path, "tiny", "again", build_id=rec["build_id"])   # same content, new recipe
    assert store.add(str(again)) == rec["build_id"]
    info = store.info()
    assert info["builds"] == [rec["build_id"]] and info["candidate"] == rec["build_id"]
    assert info["recipes"] == {rec["recipe"]: rec["build_id"], rec2["recipe"]: rec["build_id"]}
    third, _ = make_build(tmp_path, "tiny", "third", build_id=rec["build_id"])
    (third / "tiny.json").write_text(json.dumps({**json.loads((third / "tiny.json").read_text()),
                                                 "recipe": rec2["recipe"]}))
    store.add(str(third))                                      # a recipe it knows: not written twice
    assert (tmp_path / "store" / rec["build_id"] / "also-recipes").read_text() == rec2["recipe"] + "\n"
