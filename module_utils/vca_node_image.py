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
The per-node overlay (hostname, address, host key, authorized_keys, ...) is written
into partition 2's ext4 with debugfs, with each entry's mode and owner (names looked
up in the disk's own /etc/passwd and /etc/group): no loop device, no mount.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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


# In a stored build's directory: the recipes after the first whose builds had the same content.
ALSO_RECIPES = "also-recipes"


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
        for bid in builds:          # later recipes that built the same content (add())
            for recipe in self._also_recipes(bid):
                out["recipes"][recipe] = bid
        return out

    def _also_recipes(self, build_id):
        try:
            with open(os.path.join(self.root, build_id, ALSO_RECIPES)) as fh:
                return [line.strip() for line in fh if line.strip()]
        except OSError:
            return []

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
            # The same content again (a new recipe, e.g. a builder change that writes the same tree):
            # the stored build stays, and answers for this recipe too, so it is not built again.
            stored = read_record(dest).get("recipe")
            if record.get("recipe") and record["recipe"] != stored \
                    and record["recipe"] not in self._also_recipes(bid):
                with open(os.path.join(dest, ALSO_RECIPES), "a") as fh:
                    fh.write(record["recipe"] + "\n")
            shutil.rmtree(src)
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


# The overlay entry's keys (its dict form) and the file types it can make.
ENTRY_KEYS = ("content", "src", "mode", "owner", "group", "state")
STATES = {"file": (0o100000, "regular", "0644"), "directory": (0o040000, "directory", "0755")}
MODE_TEXT = re.compile(r"^[0-7]{3,4}\Z")


def _owner(path, key, value):
    """An owner or group as given: a number (int or digits) or an account name."""
    if isinstance(value, bool) or value is None:
        raise NodeImageError("overlay %s: %s %r is neither a name nor a number" % (path, key, value))
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        if int(value) < 0 or int(value) >= 2**32 - 1:
            raise NodeImageError("overlay %s: %s %s is out of range" % (path, key, value))
        return int(value)
    if isinstance(value, str) and value:
        return value
    raise NodeImageError("overlay %s: %s %r is neither a name nor a number" % (path, key, value))


def overlay_entries(files):
    """The overlay checked and in one shape, sorted so that a directory comes before what lies
    beneath it: [(path, {state, mode, owner, group, content, src})]. A value is the text of a
    file (root:root 0644) or a dict of ENTRY_KEYS; NodeImageError names the path of a bad one."""
    if not isinstance(files, dict):
        raise NodeImageError("overlay: a mapping of absolute path -> entry, not %s" % type(files).__name__)
    entries = []
    for path, entry in files.items():
        if not isinstance(path, str) or not path.startswith("/") or path.endswith("/") \
                or any(c in path for c in '"\n\t ') or ".." in path.split("/"):
            raise NodeImageError("overlay path %r: must be absolute, without spaces, quotes or '..'" % (path,))
        value = {"content": entry} if isinstance(entry, str) else entry
        if not isinstance(value, dict):
            raise NodeImageError("overlay %s: the text of a file or a mapping of %s, not %s"
                                 % (path, ", ".join(ENTRY_KEYS), type(value).__name__))
        unknown = sorted(str(k) for k in value if k not in ENTRY_KEYS)
        if unknown:
            raise NodeImageError("overlay %s: unknown key(s) %s (known: %s)"
                                 % (path, ", ".join(unknown), ", ".join(ENTRY_KEYS)))
        state = value.get("state", "file")
        if state not in STATES:
            raise NodeImageError("overlay %s: state %r, not file or directory" % (path, state))
        given = [k for k in ("content", "src") if value.get(k) is not None]
        if state == "directory" and given:
            raise NodeImageError("overlay %s: a directory takes no %s" % (path, " or ".join(given)))
        if state == "file" and len(given) != 1:
            raise NodeImageError("overlay %s: a file needs exactly one of content and src (%s given)"
                                 % (path, " and ".join(given) or "neither"))
        if "content" in given and not isinstance(value["content"], str):
            raise NodeImageError("overlay %s: content must be text" % path)
        if "src" in given and not (isinstance(value["src"], str) and os.path.isabs(value["src"])):
            raise NodeImageError("overlay %s: src must be an absolute path on this machine" % path)
        mode = value.get("mode", STATES[state][2])
        if not isinstance(mode, str) or not MODE_TEXT.match(mode):
            raise NodeImageError("overlay %s: mode %r: an octal string such as \"0600\" (quoted: YAML "
                                 "reads 0600 as the number 384)" % (path, mode))
        entries.append((path, {"state": state, "mode": int(mode, 8),
                               "owner": _owner(path, "owner", value.get("owner", 0)),
                               "group": _owner(path, "group", value.get("group", 0)),
                               "content": value.get("content"), "src": value.get("src")}))
    return sorted(entries, key=lambda e: e[0].split("/"))


def _data(path, entry):
    """A file entry's bytes: its content, or what its src holds now."""
    if entry["src"] is None:
        return entry["content"].encode()
    try:
        with open(entry["src"], "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise NodeImageError("overlay %s: cannot read its src %s: %s" % (path, entry["src"], exc.strerror)) from None


def _debugfs(debugfs, target, request):
    return subprocess.run([debugfs, "-R", request, target], capture_output=True, check=False,
                          env=dict(os.environ, LC_ALL="C"))


def _accounts(debugfs, target, table):
    """name -> id from the disk's own /etc/passwd or /etc/group (field 3)."""
    found = {}
    for line in _debugfs(debugfs, target, "cat /etc/%s" % table).stdout.decode(errors="replace").splitlines():
        fields = line.split(":")
        if len(fields) >= 3 and fields[2].isdigit():
            found.setdefault(fields[0], int(fields[2]))
    return found


def _resolve(disk, debugfs, target, entries):
    """Every entry's (uid, gid): names looked up in the disk's own account files, not this machine's."""
    tables = {}
    ids = {}
    for path, entry in entries:
        pair = []
        for key, table, file in (("owner", "passwd", "/etc/passwd"), ("group", "group", "/etc/group")):
            value = entry[key]
            if isinstance(value, str):
                if table not in tables:
                    tables[table] = _accounts(debugfs, target, table)
                if value not in tables[table]:
                    raise NodeImageError("overlay %s: %s %s is not in %s of %s's root file system"
                                         % (path, key, value, file, disk))
                value = tables[table][value]
            pair.append(value)
        ids[path] = tuple(pair)
    return ids


def _stat(debugfs, target, path):
    """(type, mode, uid, gid) of path in the file system, from `debugfs stat`; None if it is not there."""
    text = _debugfs(debugfs, target, "stat %s" % path).stdout.decode(errors="replace")
    kind = re.search(r"Type:\s*(\S+)\s+Mode:\s*([0-7]+)", text)
    owner = re.search(r"User:\s*(\d+)\s+Group:\s*(\d+)", text)
    if not kind or not owner:
        return None
    return kind.group(1), int(kind.group(2), 8), int(owner.group(1)), int(owner.group(2))


def write_files(disk, files, debugfs="debugfs"):
    """Write the overlay into partition 2's ext4, replacing what is there: each path's text (root:root
    0644) or entry (overlay_entries()). Directories the writer makes on the way are root 0755; an
    existing one keeps its owner and mode unless the overlay names it. Every entry is read back
    (content, type, mode, uid, gid); NodeImageError names the path that differs."""
    entries = overlay_entries(files)
    target = "%s?offset=%d" % (disk, root_partition_offset(disk))
    ids = _resolve(disk, debugfs, target, entries)
    for path, entry in entries:
        # checked first: debugfs's sif would otherwise turn a directory's inode into a file's
        there = _stat(debugfs, target, path)
        if there and (there[0] == "directory") != (entry["state"] == "directory"):
            raise NodeImageError("overlay %s: a %s on %s, the overlay would make it a %s"
                                 % (path, there[0], disk, entry["state"]))
    data = {path: _data(path, entry) for path, entry in entries if entry["state"] == "file"}
    with tempfile.TemporaryDirectory() as tmp:
        script = []
        for i, (path, entry) in enumerate(entries):
            parts = path.split("/")[1:-1]
            script += ["mkdir /%s" % "/".join(parts[:n]) for n in range(1, len(parts) + 1)]
            if entry["state"] == "directory":
                script.append("mkdir %s" % path)
            else:
                local = os.path.join(tmp, str(i))
                with open(local, "wb") as fh:
                    fh.write(data[path])
                os.chmod(local, entry["mode"])
                script += ["rm %s" % path, "write %s %s" % (local, path)]
            uid, gid = ids[path]
            script += ["sif %s mode 0%o" % (path, STATES[entry["state"]][0] | entry["mode"]),
                       "sif %s uid %d" % (path, uid), "sif %s gid %d" % (path, gid)]
        with open(os.path.join(tmp, "script"), "w") as fh:
            fh.write("\n".join(script) + "\n")
        # debugfs goes on past a failed line (rm of a file not there, mkdir of a dir that is): read back instead
        subprocess.run([debugfs, "-w", "-f", os.path.join(tmp, "script"), target],
                       capture_output=True, text=True, env=dict(os.environ, LC_ALL="C"), check=False)
    for path, entry in entries:
        want = (STATES[entry["state"]][1], entry["mode"]) + ids[path]
        have = _stat(debugfs, target, path)
        if have is None:
            raise NodeImageError("%s: writing %s into partition 2 failed: it is not there" % (disk, path))
        if have != want:
            raise NodeImageError("%s: writing %s into partition 2 failed: %s %04o %d:%d, want %s %04o %d:%d"
                                 % (disk, path, *have, *want))
        if entry["state"] == "file":
            done = _debugfs(debugfs, target, "cat %s" % path)
            if done.stdout != data[path]:
                why = [line for line in done.stderr.decode(errors="replace").strip().splitlines()
                       if not line.startswith("debugfs ")]           # its version banner
                raise NodeImageError("%s: writing %s into partition 2 failed: %s"
                                     % (disk, path, why[-1] if why else "its content reads back otherwise"))


def overlay_digest(files):
    """What the overlay puts on a disk, as a digest: a src's content (read now), not its name, and every
    mode and owner. An overlay of text values only keeps the digest it had before entries had a dict
    form, so disks written then are not rewritten for nothing."""
    entries = overlay_entries(files)
    if all(isinstance(v, str) for v in files.values()):
        return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()[:16]
    h = hashlib.sha256()
    for path, entry in entries:
        content = hashlib.sha256(_data(path, entry)).hexdigest() if entry["state"] == "file" else None
        h.update(json.dumps([path, entry["state"], entry["mode"], entry["owner"], entry["group"], content]).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


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
        os.makedirs(directory, mode=0o700, exist_ok=True)
        tmp = self.path + ".new"
        if os.path.lexists(tmp):
            os.unlink(tmp)
        subprocess.run(["cp", "--sparse=always", "--reflink=auto", image, tmp], check=True)
        # root only, before the overlay goes in: a node's disk holds its private host key
        os.chmod(tmp, 0o600)
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

    def host_public_key(self):
        """The SSH host key the disk's root file system holds (the one the node answers with), or ''."""
        if not os.path.exists(self.path):
            return ""
        target = "%s?offset=%d" % (self.path, root_partition_offset(self.path))
        done = subprocess.run(["debugfs", "-R", "cat /etc/ssh/ssh_host_ed25519_key.pub", target],
                              capture_output=True, text=True, check=False, env=dict(os.environ, LC_ALL="C"))
        fields = done.stdout.split()
        return " ".join(fields[:2]) if len(fields) >= 2 and fields[0].startswith("ssh-") else ""

    def rollback(self, check=False):
        """Put the kept disk back; returns its record, or None when there is none to go back to."""
        prev = self.previous()
        if prev is None:
            return None
        if not check:
            os.replace(self.prev, self.path)
            os.replace(self.prev_record, self.record_path)
        return prev
