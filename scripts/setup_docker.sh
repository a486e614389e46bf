#!/usr/bin/env bash
# Make a Docker engine and the sandbox image available; safe to run any number of times.
# Installs Debian's docker.io and debootstrap if missing, starts dockerd in the background if no
# engine answers (log: $DOCKERD_LOG), waits for it, and builds the image offline if it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${AGENTRL_SANDBOX_IMAGE:-agentrl-sandbox:latest}
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/agentrl-dockerd.log}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

if ! docker info >/dev/null 2>&1; then
    echo "starting dockerd (log: $DOCKERD_LOG)"
    $SUDO mkdir -p "$(dirname "$DOCKERD_LOG")"
    # setsid: dockerd outlives this script and is not killed with its process group.
    $SUDO setsid nohup dockerd >>"$DOCKERD_LOG" 2>&1 </dev/null &
    for _ in $(seq 1 60); do
        docker info >/dev/null 2>&1 && break
        sleep 1
    done
    docker info >/dev/null 2>&1 || { echo "dockerd did not come up; last log lines:" >&2; tail -n 30 "$DOCKERD_LOG" >&2; exit 1; }
fi
echo "docker engine: $(docker version --format '{{.Server.Version}}')"

if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
    IMAGE="$IMAGE" bash sandboxes/build_offline.sh
fi
echo "sandbox image: $IMAGE ($(docker image inspect --format '{{.Size}}' "$IMAGE") bytes)"
