#!/usr/bin/env bash
# The lab image with what prepare.yml installs already in it (two kernels' headers, sparse, the
# kernel source's checkpatch.pl): about 150 s of every run of this scenario, made once per base
# image and recipe and kept as a local image. prepare.yml still runs and finds it all in place (a
# newer backports kernel is still installed there), so the scenario also runs on the plain lab image.
# Usage: image.sh BASE_IMAGE; stdout: the tag, nothing else.
set -euo pipefail
base=$1
here=$(cd "$(dirname "$0")" && pwd)
hash=$( (docker image inspect --format '{{.Id}}' "$base"; cat "$here/image.sh") | sha256sum | cut -c1-12)
tag="vcafleet-lab-vca-host:$hash"
if docker image inspect "$tag" >/dev/null 2>&1; then
    echo "$tag"
    exit 0
fi
echo "building $tag on $base" >&2
name="vcafleet-vca-host-image-$$"
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
docker run --name "$name" \
    -v "${VCA_APT_ARCHIVES:-/var/cache/vcafleet/apt-archives}:/var/cache/apt/archives" "$base" /bin/bash -euc '
    export DEBIAN_FRONTEND=noninteractive
    echo "deb http://deb.debian.org/debian bookworm-backports main" > /etc/apt/sources.list.d/bookworm-backports.list
    apt-get update -qq
    apt-get install -y -qq linux-headers-amd64 sparse perl linux-source-6.1 xz-utils >/dev/null
    apt-get install -y -qq -t bookworm-backports linux-headers-amd64 >/dev/null
    mkdir -p /opt/checkpatch
    tar -xJf /usr/src/linux-source-6.1.tar.xz -C /opt/checkpatch --strip-components=2 \
        linux-source-6.1/scripts/checkpatch.pl linux-source-6.1/scripts/spelling.txt \
        linux-source-6.1/scripts/const_structs.checkpatch' >&2
docker commit --change 'CMD ["/lib/systemd/systemd"]' --message "vca_host scenario image ($hash)" \
    "$name" "$tag" >/dev/null
echo "$tag"
