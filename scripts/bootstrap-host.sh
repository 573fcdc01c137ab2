#!/usr/bin/env bash
# Make this (fresh Debian/Ubuntu, root) machine able to run `make lab` and
# `make test`: every package of scripts/host-packages.txt that is missing, then
# a running Docker engine. Idempotent: a machine that has it all is not touched.
# Usage: bootstrap-host.sh [GROUP...]   (default: every group; see host-packages.txt)
# VCA_BOOTSTRAP_DOCKER=0 skips starting dockerd (a throwaway container cannot run one).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
groups=${*:-lint unit molecule image lab}

missing=()
# A package counts as there when dpkg has it, or when every program it is listed for is on PATH
# (nodesource's nodejs brings npm: Debian's npm package must not be forced in beside it).
has_programs() {
    local check
    [[ $1 == - || $1 == *py:* ]] && return 1
    IFS=, read -ra checks <<<"$1"
    for check in "${checks[@]}"; do command -v "$check" >/dev/null 2>&1 || return 1; done
}
while read -r package programs needed_by; do
    for g in $groups; do
        if [[ ",$needed_by," == *",$g,"* ]]; then
            dpkg-query -W -f '${db:Status-Abbrev}' "$package" 2>/dev/null | grep -q '^ii' \
                || has_programs "$programs" || missing+=("$package")
            break
        fi
    done
done < <(grep -Ev '^\s*(#|$)' "$here/host-packages.txt")

if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    # Debian starts its broker (and epmd) on every address when it installs it. The farm's tests
    # run their own on loopback; the farm role configures the host's. Nothing listens by default.
    if [[ " ${missing[*]} " == *" rabbitmq-server "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable --now rabbitmq-server.service epmd.socket epmd.service >/dev/null 2>&1 || true
    fi
    # Prometheus too (on :9090 of every address): the tests need only promtool.
    if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
        systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
fi

[[ " $groups " == *" molecule "* || " $groups " == *" lab "* ]] || exit 0
[ "${VCA_BOOTSTRAP_DOCKER:-1}" = 1 ] || exit 0
if ! docker info >/dev/null 2>&1; then
    if [ -d /run/systemd/system ]; then
        systemctl start docker
    else
        echo "bootstrap: starting dockerd (log: /var/log/dockerd.log)" >&2
        nohup dockerd >/var/log/dockerd.log 2>&1 &
    fi
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "bootstrap: dockerd did not come up; see /var/log/dockerd.log" >&2; exit 1; }
fi
