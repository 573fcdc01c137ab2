#!/usr/bin/env bash
# llama-server for this machine's tests and the lab: the llama_server role's pinned source
# (roles/llama_server/defaults/main.yml) built by the role's own script into the same cache
# the lab host shares, so it is built once per source, whichever asks first.
# stdout: the binary's path, nothing else.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd -P)   # physical, as make's CURDIR on PATH is
defaults=$here/roles/llama_server/defaults/main.yml
cache=${LLAMA_SERVER_CACHE:-/var/cache/vcafleet/llama-server}
value() { sed -n "s/^$1: *\([^ #]*\).*/\1/p" "$defaults"; }
version=$(value llama_server_source_version)
sha256=$(value llama_server_source_sha256)
sdist=$cache/src/llama_cpp_python-$version.tar.gz

if [ ! -f "$sdist" ]; then
    mkdir -p "$cache/src"
    # make lab starts this while the venv is made or remade (make puts it first on PATH, and pip
    # upgrades itself in it): never the venv's pip, but the system's, else a throwaway venv's
    py=$(PATH=$(tr ':' '\n' <<<"$PATH" | grep -vxF "$here/.venv/bin" | paste -sd:) command -v python3)
    if "$py" -m pip --version >/dev/null 2>&1; then
        pip="$py -m pip"
    else
        "$py" -m venv "$here/build/pip-venv" >&2
        pip=$here/build/pip-venv/bin/pip
    fi
    echo "llama-server: downloading llama-cpp-python $version (its sdist carries llama.cpp)" >&2
    $pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$cache/src" >&2
fi
echo "$sha256  $sdist" | sha256sum -c --quiet - >&2 || { echo "llama-server: $sdist is not the pinned source" >&2; exit 1; }
exec "$here/roles/llama_server/files/build-llama-server.sh" "$sdist" "$cache"
