# SPDX-License-Identifier: MIT
"""Node images on the host: the store of built images and each node's own disk.

Store (one for the fleet, whatever profile a build came from: the fleet runs one image):
    <store>/<build_id>/<profile>.img, .json (the builder's record), .manifest, vmlinuz, initrd.img
    <store>/candidate -> <build_id>   built, being rolled out
    <store>/good      -> <build_id>   passed the verifier on every live node
    <store>/previous  -> <build_id>   the good image before it (rollback)
Images that none of the three names is pruned at promotion.

Node disk (vcactl blockio opens it RW, so each node has its own copy):
    <dir>/<node>.img + <node>.json     the disk and which build and overlay it holds
    <dir>/<node>.prev.img + .prev.json the disk it replaced, until the new one is verified
The per-node overlay (hostname, address, ...) is written into partition 2's ext4
with debugfs: no loop device, no mount.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile

LINKS = ("candidate", "good", "previous")


class NodeImageError(Exception):
    pass


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_record(build_dir):
    """The builder's record in a build directory (the one .json that has a build_id)."""
    for name in sorted(os.listdir(build_dir)):
        if name.endswith(".json"):
            with open(os.path.join(build_dir, name)) as fh:
                record = json.load(fh)
            if isinstance(record, dict) and "build_id" in record and "image" in record:
                return record
    raise NodeImageError("%s: no build record (<profile>.json with a build_id): not a vca-image build" % build_dir)


def _relink(directory, name, target):
    tmp = os.path.join(directory, ".%s.tmp" % name)
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink(target, tmp)
    os.replace(tmp, os.path.join(directory, name))


class ImageStore:
    def __init__(self, root):
        self.root = root

    def link(self, name):
        path = os.path.join(self.root, name)
        return os.readlink(path) if os.path.islink(path) else None

    def builds(self):
        if not os.path.isdir(self.root):
            return {}
        found = {}
        for name in sorted(os.listdir(self.root)):
            path = os.path.join(self.root, name)
            if name.startswith(".") or os.path.islink(path) or not os.path.isdir(path):
                continue
            try:
                found[name] = read_record(path)
            except (NodeImageError, OSError, ValueError):
                continue
        return found

    def _stored(self, build_id):
        """The stored builds, which must hold build_id."""
        builds = self.builds()
        if build_id not in builds:
            raise NodeImageError("%s: no build %s in the store" % (self.root, build_id))
        return builds

    def image(self, build_id):
        return os.path.join(self.root, build_id, self._stored(build_id)[build_id]["image"])

    def info(self):
        builds = self.builds()
        out = {name: self.link(name) for name in LINKS}
        out["builds"] = sorted(builds)
        out["images"] = {b: os.path.join(self.root, b, r["image"]) for b, r in builds.items()}
        out["recipes"] = {r["recipe"]: b for b, r in builds.items() if "recipe" in r}
        return out

    def add(self, src, check=False):
        """Move a finished build into the store (checked by sha256) and make it the candidate."""
        record = read_record(src)
        image = os.path.join(src, record["image"])
        digest = sha256(image)
        if digest != record.get("sha256"):
            raise NodeImageError("%s: sha256 %s, its build recorded %s: not published" % (image, digest,
                                                                                          record.get("sha256")))
        bid = record["build_id"]
        if check:
            return bid
        os.makedirs(self.root, exist_ok=True)
        dest = os.path.join(self.root, bid)
        if os.path.isdir(dest):
            shutil.rmtree(src)          # the same build again: the stored one stays
        else:
            os.rename(src, dest)
        _relink(self.root, "candidate", bid)
        return bid

    def select(self, build_id, check=False):
        """Make an existing build the candidate; True when that changed the link."""
        self._stored(build_id)
        if self.link("candidate") == build_id:
            return False
        if not check:
            _relink(self.root, "candidate", build_id)
        return True

    def promote(self, build_id, check=False):
        """build_id passed everywhere: it becomes good, the good before it previous; the rest is pruned."""
        builds = self._stored(build_id)
        good = self.link("good")
        links = {"candidate": build_id, "good": build_id,
                 "previous": good if good and good != build_id else self.link("previous")}
        prune = [b for b in builds if b not in links.values()]
        changed = any(self.link(n) != links[n] for n in LINKS if links[n]) or bool(prune)
        if changed and not check:
            for name in LINKS:
                if links[name]:
                    _relink(self.root, name, links[name])
            for bid in prune:
                shutil.rmtree(os.path.join(self.root, bid))
        return changed, prune


def root_partition_offset(disk):
    """Byte offset of GPT partition 2, the root file system."""
    with open(disk, "rb") as fh:
        fh.seek(512)
        header = fh.read(92)
        if header[:8] != b"EFI PART":
            raise NodeImageError("%s: no GPT label" % disk)
        entries_lba, count, size = struct.unpack_from("<QII", header, 72)
        fh.seek(entries_lba * 512 + size)
        entry = fh.read(size)
    first_lba = struct.unpack_from("<Q", entry, 32)[0] if count >= 2 and len(entry) == size else 0
    if not first_lba:
        raise NodeImageError("%s: no partition 2 (the root file system)" % disk)
    return first_lba * 512


def write_files(disk, files, debugfs="debugfs"):
    """Write {absolute path: text} into partition 2's ext4 (replacing what is there), root-owned 0644."""
    target = "%s?offset=%d" % (disk, root_partition_offset(disk))
    with tempfile.TemporaryDirectory() as tmp:
        script = []
        for i, (path, text) in enumerate(sorted(files.items())):
            if not path.startswith("/") or any(c in path for c in '"\n ') or ".." in path.split("/"):
                raise NodeImageError("overlay path %r: must be absolute, without spaces, quotes or '..'" % path)
            local = os.path.join(tmp, str(i))
            with open(local, "w") as fh:
                fh.write(text)
            os.chmod(local, 0o644)
            parts = path.split("/")[1:-1]
            script += ["mkdir /%s" % "/".join(parts[:n]) for n in range(1, len(parts) + 1)]
            script += ["rm %s" % path, "write %s %s" % (local, path), "sif %s uid 0" % path, "sif %s gid 0" % path]
        with open(os.path.join(tmp, "script"), "w") as fh:
            fh.write("\n".join(script) + "\n")
        # debugfs goes on past a failed line (rm of a file not there, mkdir of a dir that is): read back instead
        subprocess.run([debugfs, "-w", "-f", os.path.join(tmp, "script"), target],
                       capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=False)
        for path, text in files.items():
            done = subprocess.run([debugfs, "-R", "cat %s" % path, target], capture_output=True, text=True,
                                  check=False)
            if done.stdout != text:
                raise NodeImageError("%s: writing %s into partition 2 failed: %s"
                                     % (disk, path, done.stderr.strip().splitlines()[-1:] or "read back differs"))


def overlay_digest(files):
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]


class NodeDisk:
    def __init__(self, path):
        if not path.endswith(".img"):
            raise NodeImageError("%s: a node disk's name ends in .img" % path)
        self.path = path
        self.record_path = path[:-4] + ".json"
        self.prev = path[:-4] + ".prev.img"
        self.prev_record = path[:-4] + ".prev.json"

    @staticmethod
    def _read(path):
        try:
            with open(path) as fh:
                return json.load(fh)
        except (OSError, ValueError):
            return None

    def record(self):
        return self._read(self.record_path) if os.path.exists(self.path) else None

    def previous(self):
        return self._read(self.prev_record) if os.path.exists(self.prev) else None

    def ensure(self, image, build_id, files, check=False):
        """The disk holds build_id with this overlay; the disk it replaces is kept as .prev. True if changed."""
        want = {"build_id": build_id, "overlay": overlay_digest(files), "image": image}
        have = self.record()
        if have and have.get("build_id") == build_id and have.get("overlay") == want["overlay"]:
            return False
        if check:
            return True
        if not os.path.isfile(image):
            raise NodeImageError("%s: no such image" % image)
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = self.path + ".new"
        subprocess.run(["cp", "--sparse=always", "--reflink=auto", image, tmp], check=True)
        try:
            write_files(tmp, files)
        except Exception:
            os.unlink(tmp)
            raise
        if have:
            os.replace(self.path, self.prev)
            os.replace(self.record_path, self.prev_record)
        os.replace(tmp, self.path)
        with open(self.record_path + ".tmp", "w") as fh:
            json.dump(want, fh, indent=1, sort_keys=True)
        os.replace(self.record_path + ".tmp", self.record_path)
        return True

    def rollback(self, check=False):
        """Put the kept disk back; returns its record, or None when there is none to go back to."""
        prev = self.previous()
        if prev is None:
            return None
        if not check:
            os.replace(self.prev, self.path)
            os.replace(self.prev_record, self.record_path)
        return prev
