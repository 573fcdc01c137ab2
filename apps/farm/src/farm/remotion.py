"""Remotion: node_modules from a cache keyed by the lock, bundle (the CLI, on the host), render a range
(@remotion/renderer, on the workers).

What makes the parts joinable comes from Remotion's own distributed path (combineChunks() in
@remotion/renderer, which Lambda uses): h264 chunks are concatenated without re-encoding, and
`h264-ts` is the codec whose output (MPEG-TS) concatenates. Lambda's audio path concatenates AAC
chunks rendered with `--for-seamless-aac-concatenation` and trims their priming by in/out points;
here the audio comes out as PCM (`--separate-audio-to` with `pcm-16`) and is encoded once, at the
join, so there is no priming to trim and nothing to drift.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from farm import proc

NODE_CACHE = Path(os.environ.get("FARM_NODE_CACHE", "/var/cache/vcafleet/farm-node"))
CLI_JS = Path("@remotion/cli/remotion-cli.js")
INSTALLED = Path(".package-lock.json")   # npm writes node_modules/.package-lock.json when an install completes


class RemotionError(RuntimeError):
    pass


def _run(argv: list, cwd: Path | None = None, what: str = "remotion") -> None:
    # In its own process group, taken down whole on a cancel (farm.proc): node starts chromium and ffmpeg.
    proc.run(argv, cwd=cwd, what=what, error=RemotionError)


def lock_hash(project: Path) -> str:
    lock = Path(project) / "package-lock.json"
    if not lock.is_file():
        raise RemotionError(f"{lock} missing: the farm installs a project's exact lock, commit it")
    return hashlib.sha256(lock.read_bytes()).hexdigest()[:16]


def ensure_node_modules(project: Path, *, cache: Path | None = None, npm: str = "npm") -> Path:
    """The project's node_modules: its own if it has a real one, else a link to
    `cache/<lock hash>/node_modules`, installed once from package-lock.json (never into the repo)."""
    project = Path(project).resolve()
    link = project / "node_modules"
    if link.is_dir() and not link.is_symlink():
        return link
    cache = Path(cache or NODE_CACHE)
    home = cache / lock_hash(project)
    target = home / "node_modules"
    if not (target / INSTALLED).is_file():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=cache))
        try:
            for name in ("package.json", "package-lock.json"):
                shutil.copy2(project / name, tmp / name)
            # `npm install` with the lock present installs the locked tree; `npm ci` would refuse
            # a lock that lacks the platform packages of other OSes the registry did not offer.
            _run([npm, "install", "--no-save", "--no-audit", "--no-fund", "--ignore-scripts",
                  "--loglevel=error"], cwd=tmp, what="npm install")
            _check_locked_versions(tmp)
            tmp.chmod(0o755)   # mkdtemp's 0700: other users (the farm's, a lab host's) read the cache too
            try:
                tmp.rename(home)
            except OSError:  # another process installed it first
                if not (target / INSTALLED).is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if not (link.is_symlink() and link.resolve() == target.resolve()):
        tmp_link = project / f".node_modules.{os.getpid()}"
        tmp_link.unlink(missing_ok=True)
        tmp_link.symlink_to(target)
        os.replace(tmp_link, link)
    return link


def _check_locked_versions(root: Path) -> None:
    lock = json.loads((root / "package-lock.json").read_text())
    for key, meta in lock.get("packages", {}).items():
        if not key.startswith("node_modules/"):
            continue
        installed = root / key / "package.json"
        if not installed.is_file() and meta.get("optional"):
            continue  # another platform's binary
        version = json.loads(installed.read_text()).get("version") if installed.is_file() else None
        if version != meta.get("version"):
            raise RemotionError(f"npm installed {key} {version}, the lock says {meta.get('version')}")


def cli(node_modules: Path, node: str = "node") -> list[str]:
    js = Path(node_modules) / CLI_JS
    if not js.is_file():
        raise RemotionError(f"{js} missing: @remotion/cli is not installed there")
    return [node, str(js)]


def tree_hash(root: Path) -> str:
    """sha256 over the files under root, sorted by relative path (name and content both count)."""
    h = hashlib.sha256()
    root = Path(root)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def bundle(project_dir: Path, out_dir: Path, *, entry: str | None = None, node: str = "node") -> tuple[Path, str]:
    """`remotion bundle` the project into out_dir (replaced whole, atomically); (out_dir, hash)."""
    project, out_dir = Path(project_dir).resolve(), Path(out_dir).resolve()
    argv = cli(ensure_node_modules(project), node)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        # --disable-git-source: no git call, and the bundle does not change with each commit.
        _run([*argv, "bundle", *([entry] if entry else []), "--out-dir", tmp, "--disable-git-source",
                     "--log", "error"], cwd=project, what="remotion bundle")
        digest = tree_hash(tmp)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old.{os.getpid()}")
            out_dir.rename(old)
            shutil.rmtree(old)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir, digest


# selectComposition() is @remotion/renderer's public API: the composition's metadata as JSON,
# not the CLI's table for people.
_SELECT_JS = """
const [renderer, serveUrl, id, props, browserExecutable] = process.argv.slice(1);
require(renderer).selectComposition({serveUrl, id, inputProps: JSON.parse(props), browserExecutable,
                                     logLevel: 'error'})
  .then((c) => { console.log(JSON.stringify({id: c.id, frames: c.durationInFrames, fps: c.fps,
                                             width: c.width, height: c.height})); process.exit(0); })
  .catch((e) => { console.error(e.stack || String(e)); process.exit(1); });
"""


def composition(bundle_dir: Path, composition_id: str, props: dict, *, node_modules: Path,
                browser: str = "/usr/bin/chromium", node: str = "node") -> dict:
    """{"id", "frames", "fps", "width", "height"} of a composition in a bundle (with these props)."""
    argv = [node, "-e", _SELECT_JS, Path(node_modules) / "@remotion" / "renderer", Path(bundle_dir).resolve(),
            composition_id, json.dumps(props or {}), browser]
    out = proc.run(argv, what=f"composition {composition_id!r} in {bundle_dir}", error=RemotionError).stdout
    return json.loads(out.strip().splitlines()[-1])


def job_spec(project: Path, composition_id: str, props: dict, settings) -> dict:
    """Bundle the project once (work_dir/bundles/<sha256>) and describe the job for render_chunk.
    settings.render may set browser, node, node_modules (the workers' @remotion/renderer), concurrency,
    sample_rate; node_modules defaults to the project's own (ensure_node_modules)."""
    knobs = dict(getattr(settings, "render", None) or {})
    node, browser = knobs.get("node", "node"), knobs.get("browser", "/usr/bin/chromium")
    project_modules = ensure_node_modules(project)
    bundles = Path(settings.work_dir) / "bundles"
    staged, digest = bundle(project, bundles / f".new-{os.getpid()}", node=node)
    final = bundles / digest
    if final.is_dir():  # the same bundle is there already
        shutil.rmtree(staged)
    else:
        staged.rename(final)
    meta = composition(final, composition_id, props, node_modules=project_modules, browser=browser, node=node)
    spec = {"renderer": "remotion", "bundle": str(final), "bundleHash": digest, "composition": composition_id,
            "props": props or {}, "frames": meta["frames"], "fps": meta["fps"], "width": meta["width"],
            "height": meta["height"], "browser": browser, "node": node,
            "node_modules": str(knobs.get("node_modules") or project_modules)}
    spec.update({k: knobs[k] for k in ("concurrency", "sample_rate") if k in knobs})
    return spec


# The worker renders through @remotion/renderer's public API (renderMedia(), as the CLI and Lambda
# do), not the CLI: a worker then needs only the renderer and its peers (apps/farm/remotion-worker,
# 43 MB), no bundler or studio, and one browser serves selectComposition() and the render.
# SIGTERM cancels the render (makeCancelSignal), so chromium and ffmpeg go with it.
# Remotion renders frames into its own temporary directory and writes the output only at the end, so
# the render's progress is its onProgress (frames rendered and encoded), written to o.progress (the
# whole file replaced, at most twice a second) for the worker's progress reports.
_RENDER_JS = """
const [rendererPath, json] = process.argv.slice(1);
const {openBrowser, selectComposition, renderMedia, makeCancelSignal} = require(rendererPath);
const fs = require('fs');
const o = JSON.parse(json);
let written = 0;
const onProgress = (p) => {
  const now = Date.now();
  if (!o.progress || (now - written < 500 && p.progress < 1)) return;
  written = now;
  try {
    fs.writeFileSync(o.progress + '.tmp', JSON.stringify({rendered: p.renderedFrames, encoded: p.encodedFrames,
                                                         stage: p.stitchStage}));
    fs.renameSync(o.progress + '.tmp', o.progress);
  } catch (e) { /* a progress file that cannot be written costs the reports, not the render */ }
};
const {cancelSignal, cancel} = makeCancelSignal();
let cancelled = false;
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => { cancelled = true; cancel(); setTimeout(() => process.exit(143), 5000).unref(); });
}
(async () => {
  const browser = await openBrowser('chrome', {browserExecutable: o.browser, logLevel: 'error'});
  try {
    const common = {serveUrl: o.serveUrl, inputProps: o.props, browserExecutable: o.browser,
                    puppeteerInstance: browser, logLevel: 'error'};
    const composition = await selectComposition({...common, id: o.composition});
    await renderMedia({...common, composition, codec: o.codec, audioCodec: o.audioCodec,
                       separateAudioTo: o.separateAudioTo, enforceAudioTrack: true,
                       frameRange: o.frameRange, outputLocation: o.output, overwrite: true,
                       concurrency: o.concurrency, sampleRate: o.sampleRate, cancelSignal, onProgress});
  } finally {
    await browser.close({silent: true});
  }
  process.exit(0);
})().catch((e) => { console.error(e.stack || String(e)); process.exit(cancelled ? 143 : 1); });
"""


def render_args(spec: dict, first: int, last: int, video: Path, audio: Path | None, *,
                progress: Path | None = None) -> list[str]:
    """argv of a render of frames first..last: MPEG-TS H.264 video and PCM s16 wav audio, or with
    audio=None the range's audio alone as one wav (a reference). `progress`: the file the render keeps
    its frames rendered and encoded in (farm.render.frames_done reads it)."""
    modules = spec.get("node_modules")
    renderer = Path(modules or "") / "@remotion" / "renderer"
    if not modules or not (renderer / "package.json").is_file():
        raise RemotionError(f"no @remotion/renderer in node_modules {modules!r} (the worker's render.node_modules)")
    options = {"serveUrl": str(Path(spec["bundle"]).resolve()), "composition": spec["composition"],
               "props": spec.get("props") or {}, "frameRange": [first, last],
               "browser": spec.get("browser", "/usr/bin/chromium"),
               "concurrency": spec.get("concurrency"), "sampleRate": spec.get("sample_rate"),
               "progress": str(progress) if progress else None}
    if audio is None:
        options.update(codec="wav", output=str(video), audioCodec=None, separateAudioTo=None)
    else:
        options.update(codec="h264-ts", output=str(video), audioCodec="pcm-16", separateAudioTo=str(audio))
    options = {k: v for k, v in options.items() if v is not None}
    return [spec.get("node", "node"), "-e", _RENDER_JS, str(renderer), json.dumps(options)]


def render_range(spec: dict, first: int, last: int, video: Path, audio: Path | None, *, cwd: Path,
                 progress: Path | None = None) -> None:
    try:
        _run(render_args(spec, first, last, video, audio, progress=progress), cwd=cwd, what="remotion render")
    finally:
        if progress:
            Path(str(progress) + ".tmp").unlink(missing_ok=True)
