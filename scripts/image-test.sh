#!/usr/bin/env bash
# The node image's CI check (issue: image builder): build the debian-12 profile
# twice, require bit-identical images, verify the layout (ESP with GRUB, ext4 root),
# then boot the disk under QEMU with OVMF firmware from its own bootloader, as a
# card boots it, and require every non-hardware verifier check to pass; the
# built disk must be unchanged afterwards (the boot test boots a copy).
# Timings are printed for the record; downloads are cached across runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/image_builder/src
PY=${PYTHON:-.venv/bin/python}
CACHE=${VCA_IMAGE_CACHE:-/var/cache/vcafleet/vca-image}
OUT=build/image
rm -rf "$OUT"
mkdir -p "$OUT"
for run in a b; do
    start=$SECONDS
    "$PY" -m vca_image build --profile debian-12 --out "$OUT/$run" --cache "$CACHE" 2>"$OUT/build-$run.log" \
        || { tail -30 "$OUT/build-$run.log"; exit 1; }
    echo "image build $run: $((SECONDS - start)) s"
done
a=$(awk '/^sha256/ {print $2}' "$OUT/a/debian-12.manifest")
b=$(awk '/^sha256/ {print $2}' "$OUT/b/debian-12.manifest")
echo "sha256 a: $a"
echo "sha256 b: $b"
[ "$a" = "$b" ] || { echo "the two builds differ" >&2; exit 1; }
cmp "$OUT/a/debian-12.img" "$OUT/b/debian-12.img"
echo "image size: $(stat -c %s "$OUT/a/debian-12.img") bytes ($(du -k "$OUT/a/debian-12.img" | cut -f1) KiB on disk)"
"$PY" -m vca_image verify "$OUT/a/debian-12.img"
rm -rf "$OUT/b"
start=$SECONDS
"$PY" -m vca_image boot-test "$OUT/a" --timeout 540
echo "boot test (copy, OVMF, GRUB, kernel, verifier): $((SECONDS - start)) s"
"$PY" -m vca_image verify "$OUT/a/debian-12.img"     # the boot test left the built disk as it was
