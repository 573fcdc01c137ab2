"""A per-node overlay as a newc cpio archive, for the volatile image.

A volatile boot has no disk to write a node's files into: its grub.cfg hands the kernel
/vca-overlay.cpio after the whole-root initramfs (GRUB's initrd joins the files, each
padded to 4 bytes), and the kernel unpacks concatenated newc archives one over another,
so the overlay's files replace the image's (Documentation/driver-api/early-userspace/
buffer-format.rst in the kernel's tree). The spec is the one scripts/node-disk-overlay.py
and module_utils/vca_node_image.py take (absolute path -> text, or {content | src, mode,
owner, group, state: file | directory}), with one difference: owner and group are numbers
here. The disk writer looks names up in the disk's own /etc/passwd; an archive has no
disk beside it, so a name is refused.

Only what the spec names goes into the archive. The kernel's unpacker applies a
directory entry's owner and mode to a directory that is already there, so an entry for
/etc/ssh would change the image's /etc/ssh; and it makes no parent directories, so a
file under a directory the image lacks is dropped unless the spec names that directory.
"""

from __future__ import annotations

import os
import re

MAGIC = b"070701"       # newc: ASCII header, no checksum
TRAILER = "TRAILER!!!"
S_IFDIR, S_IFREG = 0o040000, 0o100000
ENTRY_KEYS = ("content", "src", "mode", "owner", "group", "state")
DEFAULT_MODE = {"file": "0644", "directory": "0755"}
MODE_TEXT = re.compile(r"^[0-7]{3,4}\Z")


class OverlayError(Exception):
    """A spec entry the archive cannot hold; the message names its path."""


def _id(path, key, value):
    if isinstance(value, bool) or value is None:
        raise OverlayError("overlay %s: %s %r is not a number" % (path, key, value))
    if isinstance(value, str) and not value.isdigit():
        raise OverlayError("overlay %s: %s %r is a name: a volatile overlay takes numeric ids (there is no "
                           "disk to look names up in; the image's /etc/passwd and /etc/group have them)"
                           % (path, key, value))
    if not isinstance(value, (int, str)) or not 0 <= int(value) < 2**32 - 1:
        raise OverlayError("overlay %s: %s %r is no id" % (path, key, value))
    return int(value)


def entries(spec):
    """The spec checked and in one shape, a directory before what lies beneath it:
    [(path, {state, mode, uid, gid, content, src})]."""
    if not isinstance(spec, dict):
        raise OverlayError("overlay: a mapping of absolute path -> entry, not %s" % type(spec).__name__)
    out = []
    for path, entry in spec.items():
        if not isinstance(path, str) or not path.startswith("/") or path.endswith("/") \
                or any(c in path for c in '"\n\t ') or ".." in path.split("/"):
            raise OverlayError("overlay path %r: must be absolute, without spaces, quotes or '..'" % (path,))
        value = {"content": entry} if isinstance(entry, str) else entry
        if not isinstance(value, dict):
            raise OverlayError("overlay %s: the text of a file or a mapping of %s, not %s"
                               % (path, ", ".join(ENTRY_KEYS), type(value).__name__))
        unknown = sorted(str(k) for k in value if k not in ENTRY_KEYS)
        if unknown:
            raise OverlayError("overlay %s: unknown key(s) %s (known: %s)" % (path, ", ".join(unknown),
                                                                              ", ".join(ENTRY_KEYS)))
        state = value.get("state", "file")
        if state not in DEFAULT_MODE:
            raise OverlayError("overlay %s: state %r, not file or directory" % (path, state))
        given = [k for k in ("content", "src") if value.get(k) is not None]
        if state == "directory" and given:
            raise OverlayError("overlay %s: a directory takes no %s" % (path, " or ".join(given)))
        if state == "file" and len(given) != 1:
            raise OverlayError("overlay %s: a file needs exactly one of content and src (%s given)"
                               % (path, " and ".join(given) or "neither"))
        if "content" in given and not isinstance(value["content"], str):
            raise OverlayError("overlay %s: content must be text" % path)
        if "src" in given and not (isinstance(value["src"], str) and os.path.isabs(value["src"])):
            raise OverlayError("overlay %s: src must be an absolute path on this machine" % path)
        mode = value.get("mode", DEFAULT_MODE[state])
        if not isinstance(mode, str) or not MODE_TEXT.match(mode):
            raise OverlayError("overlay %s: mode %r: an octal string such as \"0600\" (quoted: YAML reads 0600 "
                               "as the number 384)" % (path, mode))
        out.append((path, {"state": state, "mode": int(mode, 8), "uid": _id(path, "owner", value.get("owner", 0)),
                           "gid": _id(path, "group", value.get("group", 0)),
                           "content": value.get("content"), "src": value.get("src")}))
    return sorted(out, key=lambda e: e[0].split("/"))


def _data(path, entry):
    if entry["src"] is None:
        return entry["content"].encode()
    try:
        with open(entry["src"], "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise OverlayError("overlay %s: cannot read its src %s: %s" % (path, entry["src"], exc.strerror)) from None


def _pad(n):
    return b"\0" * (-n % 4)


def member(ino, name, mode, *, uid=0, gid=0, nlink=1, mtime=0, data=b""):
    """One newc member: the 110-byte header (13 fields of 8 hex digits after the magic), the
    name and its NUL padded to 4 bytes, the data padded to 4 bytes."""
    raw = name.encode() + b"\0"
    fields = (ino, mode, uid, gid, nlink, mtime, len(data), 0, 0, 0, 0, len(raw), 0)
    header = MAGIC + b"".join(b"%08X" % f for f in fields)
    return header + raw + _pad(len(header) + len(raw)) + data + _pad(len(data))


def archive(spec, mtime=0):
    """The overlay as one newc archive (bytes): names relative to / as the kernel unpacks them,
    each entry's own mode and numeric owner, mtime on every entry, the trailer last."""
    parts = []
    for ino, (path, entry) in enumerate(entries(spec), start=1):
        owner = {"uid": entry["uid"], "gid": entry["gid"], "mtime": mtime}
        if entry["state"] == "directory":
            parts.append(member(ino, path[1:], S_IFDIR | entry["mode"], nlink=2, **owner))
        else:
            parts.append(member(ino, path[1:], S_IFREG | entry["mode"], data=_data(path, entry), **owner))
    parts.append(member(0, TRAILER, 0))
    return b"".join(parts)
