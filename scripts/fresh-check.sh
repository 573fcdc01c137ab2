#!/usr/bin/env bash
# Prove the install steps the way CI cannot: in a throwaway container made from a
# bare Debian bookworm rootfs (mmdebstrap minbase: no python3, no make, no
# compiler), run scripts/bootstrap-host.sh and then the unit tests, on a copy
# of this checkout as a commit would carry it (tracked and untracked-not-ignored
# files). A package the code needs and host-packages.txt does not list fails here.
# Docker itself is not exercised inside (a container cannot run dockerd here):
# molecule and the lab prove that part on the machine itself.
set -euo pipefail
cd "$(dirname "$0")/.."
mirror=${VCA_LAB_MIRROR:-http://deb.debian.org/debian}
hash=$(printf 'minbase bookworm %s' "$mirror" | sha256sum | cut -c1-12)
tag="vcafleet-bare:$hash"
if ! docker image inspect "$tag" >/dev/null 2>&1; then
    echo "fresh-check: building $tag (bare bookworm minbase)" >&2
    mmdebstrap --variant=minbase --format=tar --quiet bookworm - "$mirror" \
        | docker import --change 'ENV DEBIAN_FRONTEND=noninteractive' - "$tag" >&2
fi

# Builds cached by content hash go in read-only, made first on this machine: the container
# proves the install steps (cmake and g++ are in the list and installed in there), not a
# second five-minute compile of the same llama-server.
scripts/llama-server.sh >/dev/null
scripts/lab-models.sh >/dev/null
mkdir -p /var/cache/vcafleet/apt-archives-fresh   # its own: molecule, beside it, holds the shared one's apt lock
mkdir -p /var/cache/vcafleet/farm-node   # the example's node_modules, by lock hash (farm's tests fill it)

name="vcafleet-fresh-$$"
trap 'docker rm -f "$name" >/dev/null 2>&1 || true' EXIT
# The machine's trust store goes in as a file of its own: pip's index may sit
# behind this workplace's TLS proxy, whose CA a bare rootfs does not know.
docker create --name "$name" \
    -v /etc/ssl/certs/ca-certificates.crt:/etc/vcafleet-host-ca.crt:ro \
    -v /var/cache/vcafleet/apt-archives-fresh:/var/cache/apt/archives \
    -v /var/cache/vcafleet/llama-server:/var/cache/vcafleet/llama-server:ro \
    -v /var/cache/vcafleet/models:/var/cache/vcafleet/models:ro \
    -v /var/cache/vcafleet/farm-node:/var/cache/vcafleet/farm-node \
    -e PIP_CERT=/etc/vcafleet-host-ca.crt -e SSL_CERT_FILE=/etc/vcafleet-host-ca.crt \
    -e VCA_BOOTSTRAP_DOCKER=0 -e CI="${CI:-}" \
    -w /src "$tag" bash -euo pipefail -c '
        rm -f /etc/apt/apt.conf.d/docker-clean   # keep downloads in the shared archive cache
        # a throwaway container: no fsync per unpacked file (what is installed is the same)
        echo force-unsafe-io > /etc/dpkg/dpkg.cfg.d/vcafleet-fresh-unsafe-io
        scripts/bootstrap-host.sh lint unit
        scripts/preflight.sh lint unit
        make unit' >/dev/null
git ls-files -z --cached --others --exclude-standard \
    | tar --null -T - --transform 's,^,src/,SH' -cf - | docker cp - "$name:/"
mkdir -p build
docker start -a "$name" 2>&1 | tee build/fresh-check.log
