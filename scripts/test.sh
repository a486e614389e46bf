#!/usr/bin/env bash
# The test command: installs everything the tests need (Python packages, the Docker engine and
# the offline-built sandbox image, a vLLM-for-CPU venv), checks style, then runs the suite.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VLLM_VENV=${AGENTRL_VLLM_VENV:-/opt/agentrl-vllm}

bash scripts/install.sh
bash scripts/setup_docker.sh
export AGENTRL_REQUIRE_DOCKER=1   # a Docker test that cannot reach the engine fails instead of skipping
bash scripts/setup_browser.sh    # Chromium + chromedriver for the viewer's browser test
export AGENTRL_REQUIRE_BROWSER=1

"$PYTHON" -m ruff check .
"$PYTHON" -m ruff format --check .
"$PYTHON" -m mypy   # strict on the contracts and the rollout side (files in pyproject.toml)
bash scripts/check_light_install.sh

# The vLLM backend's tests run in their own venv (see scripts/setup_vllm.sh).
bash scripts/setup_vllm.sh
"$VLLM_VENV/bin/python" -m pytest -q -p no:cacheprovider -m vllm tests/test_vllm_engine.py

"$PYTHON" -m pytest -q "$@"
