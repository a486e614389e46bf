#!/usr/bin/env bash
# Build the sandbox image with no registry: a Debian bookworm minbase rootfs from debootstrap
# (python3 included), plus the same non-root user the Dockerfile creates, imported with
# `docker import`. The rootfs tarball is cached so a rerun (CI) skips debootstrap entirely.
#
#   IMAGE=agentrl-sandbox:latest CACHE_DIR=/var/cache/agentrl bash sandboxes/build_offline.sh
set -euo pipefail

IMAGE=${IMAGE:-agentrl-sandbox:latest}
CACHE_DIR=${CACHE_DIR:-/var/cache/agentrl}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
# Bump when the rootfs recipe below changes, so a stale cached tarball is not reused.
RECIPE_VERSION=2
TARBALL="$CACHE_DIR/sandbox-rootfs-$SUITE-v$RECIPE_VERSION.tar"

if [ ! -s "$TARBALL" ]; then
    command -v debootstrap >/dev/null || { echo "debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
    mkdir -p "$CACHE_DIR"
    ROOTFS=$(mktemp -d "$CACHE_DIR/rootfs.XXXXXX")
    trap 'rm -rf "$ROOTFS"' EXIT
    echo "debootstrap $SUITE into $ROOTFS (a few minutes, once)..."
    debootstrap --variant=minbase --include=python3 "$SUITE" "$ROOTFS" "$MIRROR" >"$CACHE_DIR/debootstrap.log" 2>&1 \
        || { tail -n 30 "$CACHE_DIR/debootstrap.log" >&2; exit 1; }
    # The image interface shared with sandboxes/Dockerfile: user `sandbox` (uid/gid 1000),
    # work dir /work owned by it, python3 on PATH.
    chroot "$ROOTFS" groupadd --gid 1000 sandbox
    chroot "$ROOTFS" useradd --uid 1000 --gid 1000 --no-create-home --home-dir /work --shell /bin/sh sandbox
    mkdir -p "$ROOTFS/work"
    chown 1000:1000 "$ROOTFS/work"
    # Trim what a sandbox never needs: package caches, docs, apt lists.
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
        "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
    tar -C "$ROOTFS" --numeric-owner -cf "$TARBALL.tmp" .
    mv "$TARBALL.tmp" "$TARBALL"
fi

echo "importing $TARBALL as $IMAGE"
docker import \
    --change 'USER 1000:1000' \
    --change 'WORKDIR /work' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1' \
    --change 'CMD ["sleep", "infinity"]' \
    --message "agentrl sandbox (debootstrap $SUITE minbase + python3)" \
    "$TARBALL" "$IMAGE"
