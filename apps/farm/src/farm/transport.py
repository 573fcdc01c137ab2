"""Bundles and parts over HTTP, for workers that share no filesystem with the host (host_url).

A worker fetches a bundle by its content hash (farm.remotion.tree_hash) from the farm API as a tar,
extracts it with nothing but plain files and directories, checks the hash and keeps it in
cache_dir/bundles/<hash> (the bundle_cache_keep most recently used). It renders into
cache_dir/parts/<job>/ and uploads each part with its sha256, which the API checks before the
part takes its name in parts_dir/<job>/ on the host.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

import httpx

from farm import remotion

HASH = re.compile(r"[0-9a-f]{64}")
PART = re.compile(r"part-\d{5}\.(ts|wav)")
STALE_FETCH_S = 3600.0     # a temporary fetch dir this old was left by a killed worker


class TransportError(RuntimeError):
    pass


class HostFull(TransportError):
    """The host has no room for the part (507): the host's fault, not the node's."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# -- the host's side ---------------------------------------------------------------------------
def bundle_tar(bundle_dir: Path, tars_dir: Path) -> Path:
    """A tar of the bundle's files, made once: a bundle's name is its hash, so it never changes."""
    out = Path(tars_dir) / (Path(bundle_dir).name + ".tar")
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}-{secrets.token_hex(4)}")
    try:
        # dereference: a link becomes the file it names, as tree_hash reads it
        with tarfile.open(tmp, "w", dereference=True) as tar:
            for path in sorted(Path(bundle_dir).rglob("*")):
                tar.add(path, arcname=path.relative_to(bundle_dir).as_posix(), recursive=False)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


# -- the worker's side --------------------------------------------------------------------------
def extract(tar_path: Path, dest: Path) -> None:
    """Plain files and directories only, every name inside dest: an absolute name, `..`, a link or a
    device is refused (TransportError) whatever the host sent."""
    dest = Path(dest)
    with tarfile.open(tar_path, "r:") as tar:
        for m in tar:
            parts = PurePosixPath(m.name).parts
            if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                raise TransportError(f"refused tar member {m.name!r} (type {m.type!r}): plain files and dirs"
                                     " under the bundle only")
            target = dest.joinpath(*parts)
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with tar.extractfile(m) as src, open(target, "xb") as dst:
                shutil.copyfileobj(src, dst)


class Host:
    """The farm API as a worker uses it (the worker token)."""

    def __init__(self, url: str, token: str, cache_dir: str | Path, *, keep: int = 4,
                 client: httpx.Client | None = None, timeout: float = 60.0):
        self.http = client or httpx.Client(base_url=url.rstrip("/"), timeout=timeout,
                                           transport=httpx.HTTPTransport(retries=2))
        self.http.headers["Authorization"] = "Bearer " + token
        self.cache, self.keep = Path(cache_dir), keep

    def close(self) -> None:
        self.http.close()

    def bundle(self, digest: str) -> Path:
        """cache_dir/bundles/<digest>, fetched and checked unless there already."""
        if not HASH.fullmatch(digest or ""):
            raise TransportError(f"bundle hash {digest!r}: not 64 hex digits")
        bundles = self.cache / "bundles"
        final = bundles / digest
        if not final.is_dir():
            bundles.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=bundles))
            try:
                self._download("/v1/bundles/" + digest, tmp / "bundle.tar", f"bundle {digest}")
                tree = tmp / "tree"
                tree.mkdir()
                extract(tmp / "bundle.tar", tree)
                got = remotion.tree_hash(tree)
                if got != digest:
                    raise TransportError(f"bundle {digest}: the files fetched hash to {got}: refused")
                try:
                    tree.rename(final)
                except OSError:      # another process put it there first: the same files
                    if not final.is_dir():
                        raise
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        os.utime(final)              # its mtime is when it was last used
        self._prune(final)
        return final

    def _download(self, route: str, out: Path, what: str) -> None:
        try:
            with self.http.stream("GET", route) as r:
                if r.status_code != 200:
                    r.read()
                    raise TransportError(f"{what}: the host answered {r.status_code}: {r.text[:300]}")
                with open(out, "wb") as f:
                    for block in r.iter_bytes(1 << 20):
                        f.write(block)
        except httpx.HTTPError as e:
            raise TransportError(f"{what}: {type(e).__name__}: {e}") from e

    def _prune(self, current: Path) -> None:
        """The bundles beyond `keep`, least recently used first; and what a killed worker left."""
        bundles = current.parent
        kept = sorted((p for p in bundles.iterdir() if HASH.fullmatch(p.name) and p.is_dir() and p != current),
                      key=lambda p: p.stat().st_mtime, reverse=True)
        old = kept[self.keep - 1:]
        old += [p for p in bundles.glob(".fetch-*") if time.time() - p.stat().st_mtime > STALE_FETCH_S]
        old += list(bundles.glob(".gone-*"))
        for p in old:
            gone = bundles / f".gone-{p.name}-{secrets.token_hex(4)}"
            with contextlib.suppress(OSError):
                p.rename(gone)       # out of sight at once: never a half-deleted bundle under its name
                shutil.rmtree(gone, ignore_errors=True)

    def upload(self, job: str, path: Path, *, attempt: str, key: str | None) -> None:
        """PUT the part under its name; the host checks X-Content-SHA256 and that the attempt's key is
        the one its message carried (README "Reports belong to an attempt"), and replaces it whole."""
        path = Path(path)
        digest = sha256_file(path)
        try:
            with open(path, "rb") as f:
                r = self.http.put(f"/v1/jobs/{job}/parts/{path.name}", content=f,
                                  headers={"X-Content-SHA256": digest, "X-Farm-Attempt": attempt,
                                           "X-Farm-Attempt-Key": key or ""})
        except httpx.HTTPError as e:
            raise TransportError(f"upload of {job}/{path.name}: {type(e).__name__}: {e}") from e
        if r.status_code == 507:
            raise HostFull(f"upload of {job}/{path.name}: {r.text[:300]}")
        if r.status_code >= 300:
            raise TransportError(f"upload of {job}/{path.name}: the host answered {r.status_code}: {r.text[:300]}")
