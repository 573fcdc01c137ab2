#!/usr/bin/env bash
# The node image's CI check (issue: image builder): build the debian-12 profile
# twice, require bit-identical artefacts (the blockio disk and the volatile
# image; the second build is one an earlier run made of the same recipe and tree,
# where the cache holds its witness: see below), verify their layout (the disk: ESP with GRUB, ext4 root; the volatile
# image: a bare FAT32 volume with GRUB, the kernel and the whole root), then boot
# both under QEMU with OVMF firmware from their own bootloader, as a card boots
# them. The disk's copy carries a node's overlay: a throwaway host key and fleet
# key, written by the production writer (module_utils/vca_node_image.py, through
# scripts/node-disk-overlay.py). The volatile image's copy carries the same node's
# files as a newc cpio on the volume (vca-image overlay-cpio), root-owned: that
# boot logs in as root. Each boot logs in over ssh with the fleet key, accepting
# that host key only, runs the verifier and requires every non-hardware check to
# pass. The built artefacts must be unchanged afterwards. Timings are printed for
# the record; downloads are cached.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/image_builder/src
PY=${PYTHON:-.venv/bin/python}
# Its own download cache: node_image, beside it in make test, syncs the lab's in and out.
CACHE=${VCA_IMAGE_CACHE:-/var/cache/vcafleet/vca-image-test}
OUT=build/image
rm -rf "$OUT"
mkdir -p "$OUT"
build() {
    local start=$SECONDS
    "$PY" -m vca_image build --profile debian-12 --out "$OUT/$1" --cache "$CACHE" 2>"$OUT/build-$1.log" \
        || { tail -30 "$OUT/build-$1.log"; exit 1; }
    echo "image build $1: $((SECONDS - start)) s"
}
artefact_sums() {    # "sha256 <hash> <file>" of both artefacts, from a build's manifest
    grep -E '^sha256 [0-9a-f]{64} +debian-12(\.volatile)?\.img$' "$OUT/$1/debian-12.manifest" | sort
}
build a
[ "$(artefact_sums a | wc -l)" = 2 ] || { echo "build a's manifest names no sha256 of its two artefacts" >&2; exit 1; }
# Two builds of one recipe (profile, overlays, builder code) that made one tree (build_id) must give
# the same bytes. An earlier run's two builds that agreed are the witness: a build now, days later in
# another directory, that matches it shows the same as a second build here would, in half the time.
# Anything else (no witness, or one that differs: the host's mkfs or GRUB moved on) builds twice.
key=$("$PY" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["recipe"] + "-" + r["build_id"])' \
      "$OUT/a/debian-12.json")
WITNESS=$CACHE/reproduced/$key
if [ -s "$WITNESS" ] && [ "$(artefact_sums a)" = "$(cat "$WITNESS")" ]; then
    echo "image build b: not run: build a matches both artefacts of an earlier run's two identical builds" \
         "of recipe and build $key ($WITNESS, $(date -ur "$WITNESS" +%FT%TZ))"
    artefact_sums a | sed 's/^/witness /'
else
    [ -s "$WITNESS" ] && echo "the witness for $key differs from build a: building b to compare here"
    build b
    for artefact in debian-12.img debian-12.volatile.img; do
        a=$(awk -v f="$artefact" '$1 == "sha256" && $3 == f {print $2}' "$OUT/a/debian-12.manifest")
        b=$(awk -v f="$artefact" '$1 == "sha256" && $3 == f {print $2}' "$OUT/b/debian-12.manifest")
        echo "sha256 a: $a  $artefact"
        echo "sha256 b: $b  $artefact"
        [ -n "$a" ] && [ "$a" = "$b" ] || { echo "the two builds differ: $artefact" >&2; exit 1; }
        cmp "$OUT/a/$artefact" "$OUT/b/$artefact"
    done
    mkdir -p "$(dirname "$WITNESS")"
    artefact_sums a > "$WITNESS.tmp" && mv "$WITNESS.tmp" "$WITNESS"
fi
for artefact in debian-12.img debian-12.volatile.img; do
    echo "$artefact: $(stat -c %s "$OUT/a/$artefact") bytes ($(du -k "$OUT/a/$artefact" | cut -f1) KiB on disk)"
done
"$PY" -m vca_image verify "$OUT/a/debian-12.img"      # and the volatile image its record names
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
# The volatile image as a rollout would boot it: the node's files as a newc cpio (root-owned, by
# number: there is no disk to look names up in) put on a copy of the volume, where grub.cfg finds it.
start=$SECONDS
cat > "$OUT/volatile-overlay.json" <<EOF
{
 "/etc/vca-node.local.conf": "FLEET_USERS=root\n",
 "/etc/ssh/ssh_host_ed25519_key": {"src": "$PWD/$KEYS/ssh_host_ed25519_key", "mode": "0600"},
 "/etc/ssh/ssh_host_ed25519_key.pub": {"src": "$PWD/$KEYS/ssh_host_ed25519_key.pub", "mode": "0644"},
 "/root/.ssh": {"state": "directory", "mode": "0700"},
 "/root/.ssh/authorized_keys": {"src": "$PWD/$KEYS/fleet.pub", "mode": "0600"}
}
EOF
"$PY" -m vca_image overlay-cpio "$OUT/volatile-overlay.json" "$OUT/node-overlay.cpio"
cp --sparse=always "$OUT/a/debian-12.volatile.img" "$OUT/node.volatile.img"
MTOOLSRC=/dev/null MTOOLS_SKIP_CHECK=1 mcopy -i "$OUT/node.volatile.img" "$OUT/node-overlay.cpio" ::/vca-overlay.cpio
echo "volatile node copy with its overlay: $((SECONDS - start)) s"
start=$SECONDS
"$PY" -m vca_image boot-test "$OUT/a" --volatile --image "$OUT/node.volatile.img" --ssh-key "$KEYS/fleet" \
    --host-key "$KEYS/ssh_host_ed25519_key.pub" --user root --timeout 540
echo "boot test (volatile copy, OVMF, GRUB from the FAT volume, kernel, root in tmpfs with the overlay," \
     "ssh login as root, verifier, poweroff): $((SECONDS - start)) s"
rm -f "$OUT/node.volatile.img"
want=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["volatile_sha256"])' "$OUT/a/debian-12.json")
have=$(sha256sum "$OUT/a/debian-12.volatile.img" | cut -d" " -f1)
[ "$have" = "$want" ] || { echo "the volatile image changed: sha256 $have, the build recorded $want" >&2; exit 1; }
echo "volatile image unchanged: sha256 $have"
"$PY" -m vca_image verify "$OUT/a/debian-12.img"     # both artefacts as they were built
