#!/usr/bin/env bash
# Build llama.cpp's llama-server once per source and flags, CPU only, and cache it.
# Usage: build-llama-server.sh [--key] SOURCE CACHE_DIR [CMAKE_FLAG...]
#   SOURCE     the llama-cpp-python sdist (it carries llama.cpp in vendor/llama.cpp), a
#              llama.cpp source tarball, or a llama.cpp source directory
#   CACHE_DIR  builds land in CACHE_DIR/<key>/llama-server; key = hash of the source,
#              this script and the flags. An existing build is reused, never rebuilt.
#   CMAKE_FLAG none: the VCA node's Xeon E3 (Skylake): AVX2/FMA/F16C, no AVX-512, no
#              -march=native (the build host's CPU is not the nodes').
# stdout: the binary's path, nothing else. Progress goes to stderr.
# --key: build nothing; print the key, then "cached" or "missing".
set -euo pipefail
only_key=0
if [ "${1:-}" = --key ]; then only_key=1; shift; fi
src=${1:?usage: build-llama-server.sh SOURCE CACHE_DIR [CMAKE_FLAG...]}
cache=${2:?usage: build-llama-server.sh SOURCE CACHE_DIR [CMAKE_FLAG...]}
shift 2
flags=("$@")
if [ ${#flags[@]} -eq 0 ]; then
    flags=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
           -DGGML_AVX512=OFF -DGGML_OPENMP=OFF)
fi
common=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_OPENSSL=OFF)

if [ -d "$src" ]; then
    src_hash=$(cd "$src" && find . -type f ! -path './.git/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum)
else
    src_hash=$(sha256sum <"$src")
fi
key=$( (echo "$src_hash"; sha256sum <"$0"; printf '%s\n' "${common[@]}" "${flags[@]}") | sha256sum | cut -c1-16)
out="$cache/$key"
if [ "$only_key" = 1 ]; then
    echo "$key"
    if [ -x "$out/llama-server" ]; then echo cached; else echo missing; fi
    exit 0
fi
if [ -x "$out/llama-server" ]; then
    echo "$out/llama-server"
    exit 0
fi

for tool in cmake c++ make; do
    command -v "$tool" >/dev/null || { echo "build-llama-server: $tool is missing (install cmake, g++, make)" >&2; exit 1; }
done
mkdir -p "$cache"
# One build per key at a time (make lab starts one early; the lab host's role may ask meanwhile):
# the second waits for the first and takes its result.
exec 9>"$cache/.$key.lock"
if ! flock -n 9; then
    echo "build-llama-server: $key is being built by another run; waiting for it" >&2
    flock 9
fi
if [ -x "$out/llama-server" ]; then
    echo "$out/llama-server"
    exit 0
fi
work=$(mktemp -d "$cache/.build-XXXXXX")
trap 'rm -rf "$work"' EXIT
if [ -d "$src" ]; then
    tree=$src
else
    tar -xzf "$src" -C "$work"
    top=$(find "$work" -mindepth 1 -maxdepth 1 -type d | head -1)
    tree=$top
    [ -f "$top/vendor/llama.cpp/CMakeLists.txt" ] && tree=$top/vendor/llama.cpp
fi
[ -f "$tree/tools/server/server.cpp" ] || { echo "build-llama-server: no llama.cpp server source in $src" >&2; exit 1; }
echo "build-llama-server: building $key from $src (several minutes on two cores)" >&2
cmake -S "$tree" -B "$work/build" "${common[@]}" "${flags[@]}" >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$work/out"
install -m 0755 "$work/build/bin/llama-server" "$work/out/llama-server"
"$work/out/llama-server" --version >"$work/out/VERSION" 2>&1 || true
printf '%s\n' "source: $src" "source sha256: ${src_hash%% *}" "flags: ${common[*]} ${flags[*]}" >"$work/out/BUILD-INFO"
# Whole or not at all: a killed build leaves no half-written cache entry.
mv -T "$work/out" "$out" 2>/dev/null || [ -x "$out/llama-server" ]
echo "$out/llama-server"
