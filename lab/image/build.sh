#!/usr/bin/env bash
# Build the lab/molecule base image from a Debian bookworm rootfs, once.
# No registry can be pulled here, so: mmdebstrap -> tar -> docker import.
# The tag is the content hash of the recipe; an existing tag is reused.
# stdout: the image tag, nothing else. Progress goes to stderr.
# The image keeps the apt lists it was built with: a role's cache_valid_time
# then sees lists that really are as fresh as their date says.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
mirror=${VCA_LAB_MIRROR:-http://deb.debian.org/debian}
hash=$( (cat "$here/packages.txt" "$here/build.sh"; cd "$here" && find files -type f | LC_ALL=C sort | xargs sha256sum) \
    | sha256sum | cut -c1-12)
tag="vcafleet-lab:$hash"

if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
echo "building $tag from $mirror" >&2
if ! command -v mmdebstrap >/dev/null 2>&1; then
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >&2
fi
packages=$(grep -v '^\s*#' "$here/packages.txt" | grep -v '^\s*$' | sort | paste -sd, -)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# force-unsafe-io (kept in the image's /etc/dpkg/dpkg.cfg.d/99mmdebstrap): lab and molecule
# containers are thrown away, and dpkg's fsync per unpacked file doubled every role's package
# install (kernel headers: 31 s with it, 14 s without). Never on a real machine.
mmdebstrap --variant=apt --format=tar --include="$packages" --dpkgopt=force-unsafe-io \
    --customize-hook='rm -f "$1"/etc/machine-id; touch "$1"/etc/machine-id' \
    --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
    --customize-hook="copy-in $here/files/etc/systemd/system/ssh-hostkeys.service /etc/systemd/system" \
    --customize-hook="copy-in $here/files/etc/ssh/sshd_config.d/00-lab-hostkey.conf /etc/ssh/sshd_config.d" \
    --customize-hook='ln -s ../ssh-hostkeys.service "$1"/etc/systemd/system/multi-user.target.wants/' \
    --skip=cleanup/apt/lists \
    bookworm "$work/rootfs.tar" "$mirror" >&2
docker import \
    --change 'CMD ["/lib/systemd/systemd"]' \
    --change 'ENV container=docker' \
    --message "vcafleet lab base (bookworm; recipe $hash)" \
    "$work/rootfs.tar" "$tag" >&2
echo "$tag"
