#!/usr/bin/env bash
# make lab's longest build, started first and run beside the rest (issue 30): llama-server, cached
# by source hash in the cache the lab host shares (scripts/llama-server.sh), so the llm_workers
# role finds it built, or waits for it (the build script's lock) instead of building it twice.
# While it runs, a progress line every 30 s; its log: build/prebuild-llama-server.log.
# It runs at the lowest CPU and I/O priority: on two cores a full-priority compile halves the speed
# of every play on the critical path, while at the lowest it takes only what they leave idle (SSH
# round trips, downloads). If a play needs it before it is done, the play waits on its lock, and the
# compile then has the cores to itself. nice alone does not do it: the scheduler weighs a session's
# autogroup, or a cgroup, against the containers' as an equal whatever its tasks' nice. So the
# build gets a systemd scope of CPU weight 1 where systemd runs, else a session whose autogroup is
# niced as well.
# A failed prebuild is only reported: the role then builds it itself, and its error shows there.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
log=build/prebuild-llama-server.log
(
    start=$SECONDS
    if [ -d /run/systemd/system ] && command -v systemd-run >/dev/null; then
        systemd-run --quiet --scope --collect -p CPUWeight=1 -p IOWeight=1 -- \
            nice -n 19 scripts/llama-server.sh >"$log" 2>&1 &
    else
        setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 ionice -c 2 -n 7 "$@"' \
            prebuild scripts/llama-server.sh >"$log" 2>&1 &
    fi
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
