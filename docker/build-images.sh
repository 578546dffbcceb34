#!/usr/bin/env bash
# Build every image docker-compose.yml uses, without Docker Hub (CI, air-gapped machines):
#   flowerbed/debian-base:bookworm   minimal Debian from debootstrap, imported (needs root)
#   flwr/superlink|supernode|superexec:1.42.0
#                                    stand-ins for Flower's official images (standins.Dockerfile)
#   flowerbed-superexec:latest       ./Dockerfile: the project on the SuperExec image
# Images that exist are kept (a real flwr/* image pulled from Docker Hub wins); FORCE=1 rebuilds
# the stand-ins. The stand-ins install flwr from the index (host network; the host's CA bundle is
# copied to docker/build-ca/ for pip). The flowerbed image installs from wheels prepared here into
# docker/wheels/ (the CPU torch build, as `pip install torch==2.13.0` resolves on this machine,
# and every dependency), so it needs no network and never gets the multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
FLWR_VERSION=1.42.0
BASE=flowerbed/debian-base:bookworm
PY=${PYTHON:-.venv/bin/python}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${DEBOOTSTRAP_CACHE:-/var/cache/flowerbed-debootstrap}
have() { docker image inspect "$1" >/dev/null 2>&1; }
step() { printf '[build-images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

step "wheels into docker/wheels"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    cp /etc/ssl/certs/ca-certificates.crt docker/build-ca/ca-certificates.crt
fi
# one resolve with torch pinned: alone, the project's torch>=2.6 picks the newest (CUDA) build;
# redone only when pyproject.toml changed
stamp=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat docker/wheels/.stamp 2>/dev/null)" != "$stamp" ]; then
    "$PY" -m pip wheel -q --wheel-dir docker/wheels "torch==2.13.0" . 2>&1 | grep -v "is ignored" || true
    rm -f docker/wheels/flowerbed-*.whl
    echo "$stamp" > docker/wheels/.stamp
fi
if ls docker/wheels | grep -q -E '^(nvidia_|triton-)'; then
    echo "docker/wheels holds CUDA wheels (torch resolved from the index, not the CPU build)" >&2
    exit 2
fi

if [ "${FORCE:-0}" = 1 ] || ! have "$BASE"; then
    step "Debian bookworm base with debootstrap"
    root=$(mktemp -d /tmp/fb-rootfs-XXXX)
    mkdir -p "$CACHE"
    debootstrap --variant=minbase --cache-dir="$CACHE" \
        --include=python3,python3-venv,ca-certificates,libsqlite3-0 \
        bookworm "$root" "$MIRROR" >/dev/null
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -c . | docker import - "$BASE" >/dev/null
    rm -rf "$root"
fi

for target in superlink superexec; do  # the SuperNodes run the flowerbed image
    if [ "${FORCE:-0}" = 1 ] || ! have "flwr/$target:$FLWR_VERSION"; then
        step "stand-in flwr/$target:$FLWR_VERSION"
        docker build -q --network host --target "$target" --build-arg "BASE_IMAGE=$BASE" \
            --build-arg "FLWR_VERSION=$FLWR_VERSION" -t "flwr/$target:$FLWR_VERSION" \
            -f docker/standins.Dockerfile . >/dev/null
    fi
done

step "flowerbed-superexec:latest (./Dockerfile)"
docker build -q --network host -t flowerbed-superexec:latest . >/dev/null
step "done: $(docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'flwr/|flowerbed' | tr '\n' ' ')"
