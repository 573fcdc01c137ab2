#!/usr/bin/env bash
# Make this (fresh Debian/Ubuntu, root) machine able to run the lab and the
# tests: Python venv support and a running Docker engine. Idempotent.
set -euo pipefail

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then apt-get update -qq; apt_updated=1; fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    echo "bootstrap: installing python3-venv" >&2
    apt_install python3-venv
fi

# OpenCL on the CPU for the GEMM probe's tests, and a C compiler with OpenMP for its CPU SGEMM.
if ! dpkg -s pocl-opencl-icd >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    echo "bootstrap: installing pocl-opencl-icd and gcc" >&2
    apt_install pocl-opencl-icd ocl-icd-libopencl1 gcc libgomp1
fi

# Headless Chromium: vcamon's page test takes a screenshot of the real charts.
if ! command -v chromium >/dev/null 2>&1; then
    echo "bootstrap: installing chromium" >&2
    apt_install chromium
fi

# The node image builder and its QEMU boot test (image_builder/).
if ! command -v mmdebstrap >/dev/null 2>&1 || ! command -v sfdisk >/dev/null 2>&1 \
    || ! command -v debugfs >/dev/null 2>&1 || ! command -v qemu-system-x86_64 >/dev/null 2>&1; then
    echo "bootstrap: installing mmdebstrap, fdisk, e2fsprogs and qemu-system-x86" >&2
    apt_install mmdebstrap fdisk e2fsprogs qemu-system-x86
fi

if ! command -v dockerd >/dev/null 2>&1; then
    echo "bootstrap: installing docker.io" >&2
    apt_install docker.io
fi

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
