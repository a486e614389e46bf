#!/usr/bin/env bash
# The env side installs and runs without the training stack: a fresh venv with only
# `pip install . ./envs/games` (no extras) lists envs and plays 64 Sokoban episodes, and none of
# torch, transformers, docker, tensorboard or matplotlib got installed. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=$(mktemp -d)/light
trap 'rm -rf "$(dirname "$VENV")"' EXIT
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check . ./envs/games
"$VENV/bin/agentrl" envs list >/dev/null
"$VENV/bin/agentrl" rollout games/Sokoban-v0 --policy expert -n 64 | grep -q "terminated=64"
heavy=$("$VENV/bin/pip" list --format=freeze | grep -i -E '^(torch|transformers|docker|tensorboard|matplotlib)==' || true)
if [ -n "$heavy" ]; then echo "the light install pulled: $heavy" >&2; exit 1; fi
echo "light install: agentrl + agentrl-games without extras lists envs and plays Sokoban (64/64); no torch"
