#!/usr/bin/env bash
# The node image's CI check (issue: image builder): build the debian-12 profile
# twice, require bit-identical images, verify the layout (ESP with GRUB, ext4 root),
# then boot a node's copy of the disk under QEMU with OVMF firmware from its own
# bootloader, as a card boots it. The copy carries a node's overlay: a throwaway
# host key and fleet key, written by the production writer (module_utils/
# vca_node_image.py, through scripts/node-disk-overlay.py). The boot test logs in
# over ssh with the fleet key, accepting that host key only, runs the verifier
# with sudo and requires every non-hardware check to pass. The built disk must be
# unchanged afterwards. Timings are printed for the record; downloads are cached.
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
KEYS=$OUT/keys
mkdir -m 0700 "$KEYS"
ssh-keygen -q -t ed25519 -N "" -C "fleet@image-test" -f "$KEYS/fleet"
ssh-keygen -q -t ed25519 -N "" -C "root@image-test-node" -f "$KEYS/ssh_host_ed25519_key"
cat > "$OUT/node-overlay.json" <<EOF
{
 "/etc/vca-node.local.conf": "FLEET_USERS=vcaadmin\n",
 "/etc/ssh/ssh_host_ed25519_key": {"src": "$PWD/$KEYS/ssh_host_ed25519_key", "mode": "0600"},
 "/etc/ssh/ssh_host_ed25519_key.pub": {"src": "$PWD/$KEYS/ssh_host_ed25519_key.pub", "mode": "0644"},
 "/home/vcaadmin/.ssh": {"state": "directory", "mode": "0700", "owner": "vcaadmin", "group": "vcaadmin"},
 "/home/vcaadmin/.ssh/authorized_keys": {"src": "$PWD/$KEYS/fleet.pub", "mode": "0600",
                                         "owner": "vcaadmin", "group": "vcaadmin"}
}
EOF
cp --sparse=always "$OUT/a/debian-12.img" "$OUT/node.img"
# -I -S: no site-packages, so the writer is shown to need the standard library only
"$PY" -I -S scripts/node-disk-overlay.py "$OUT/node.img" "$OUT/node-overlay.json"
echo "node copy with its overlay: $((SECONDS - start)) s"
start=$SECONDS
"$PY" -m vca_image boot-test "$OUT/a" --image "$OUT/node.img" --ssh-key "$KEYS/fleet" \
    --host-key "$KEYS/ssh_host_ed25519_key.pub" --timeout 540
echo "boot test (copy, OVMF, GRUB, kernel, ssh login, verifier, poweroff): $((SECONDS - start)) s"
rm -f "$OUT/node.img"
"$PY" -m vca_image verify "$OUT/a/debian-12.img"     # the boot test left the built disk as it was
