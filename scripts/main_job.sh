#!/usr/bin/env bash
# The main job, from a fresh machine: install agentrl, then train a multi-turn agent end to end.
#
#   bash scripts/main_job.sh [CONFIG]      (default: examples/number_line.yaml)
#
# `agentrl train` builds a tiny model and tokenizer from scratch, warm-starts it on format-correct
# random play (the format, no strategy), serves it, and trains it with RL; `agentrl eval` then
# measures the warm-started and the trained model on the same held-out seeds, beside the env's
# reference policies (a player that ignores every reply, one that follows the replies at random,
# the expert), so the figures the README quotes and their floor and ceiling come from one command.
# Each invocation writes a new run directory (runs/<config name>-<time>), with the plot of
# held-out success over training against the references in plots/eval_success.png.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-examples/number_line.yaml}
job_started=$(date +%s)

bash scripts/install.sh

RUN="runs/$(basename "$CONFIG" .yaml)-$(date +%Y%m%d-%H%M%S)"
started=$(date +%s)
agentrl train "$CONFIG" --out "$RUN"
trained=$(date +%s)

# Evaluate with the config's env and sampling settings (the same ones `agentrl train` used).
read -r ENV_ID EPISODES TEMPERATURE MAX_TOKENS MAX_TURNS < <(python - "$RUN/config.yaml" <<'PY'
import sys, yaml
c = yaml.safe_load(open(sys.argv[1]))
print(c["env"]["id"], c["schedule"]["eval_episodes"] or 200, c["sampling"]["eval_temperature"],
      c["sampling"]["max_tokens"], c["env"]["max_turns"])
PY
)
WARM_START="$RUN/sft"
[ -d "$WARM_START" ] || WARM_START="$RUN/model_init"
EVAL=(-n "$EPISODES" --temperature "$TEMPERATURE" --max-tokens "$MAX_TOKENS" --max-turns "$MAX_TURNS")
echo "== agentrl eval: warm start ($WARM_START)"
agentrl eval "$WARM_START" "$ENV_ID" "${EVAL[@]}" | tee "$RUN/eval_warm_start.txt"
echo "== agentrl eval: after RL ($RUN, newest checkpoint)"
agentrl eval "$RUN" "$ENV_ID" "${EVAL[@]}" | tee "$RUN/eval_final.txt"
finished=$(date +%s)
echo "train wall-clock (incl. model build, warm start, server start, in-run evals): $((trained - started)) s"
echo "main job: $((finished - job_started)) s in all, $((finished - started)) s after the install"
echo "plots: $RUN/plots/ (held-out success vs the reference policies: $RUN/plots/eval_success.png)"
