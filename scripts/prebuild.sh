#!/usr/bin/env bash
# make lab's longest build, started first and run beside the rest (issue 30): llama-server, cached
# by source hash in the cache the lab host shares (scripts/llama-server.sh), so the llm_workers
# role finds it built, or waits for it (the build script's lock) instead of building it twice.
# While it runs, a progress line every 30 s; its log: build/prebuild-llama-server.log.
# It runs at the lowest CPU and I/O priority: on two cores a full-priority compile halves the speed
# of every play on the critical path, while at nice 19 it takes only what they leave idle (SSH
# round trips, downloads). If a play needs it before it is done, the play waits on its lock, and the
# compile then has the cores to itself.
# A failed prebuild is only reported: the role then builds it itself, and its error shows there.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
log=build/prebuild-llama-server.log
(
    start=$SECONDS
    nice -n 19 ionice -c 2 -n 7 scripts/llama-server.sh >"$log" 2>&1 &
    build=$!
    while sleep 30; kill -0 "$build" 2>/dev/null; do
        echo "... llama-server: building for $((SECONDS - start)) s beside the lab: $(tail -n1 "$log" | cut -c1-90)" >&2
    done
    if wait "$build"; then
        [ $((SECONDS - start)) -le 30 ] || echo "... llama-server: built in about $((SECONDS - start)) s" >&2
    else
        echo "... llama-server: the prebuild failed (the role builds it again; its log: $log)" >&2
    fi
) &
