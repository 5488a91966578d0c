#!/usr/bin/env bash
# The main job: an RL run on the bundled arithmetic task, from nothing to a model that got better.
# Sets up .venv (pinned), builds a tiny model and the data locally, warms up with SFT, then runs GRPO
# with greedy accuracy on held-out problems logged to runs/default/grpo/metrics.jsonl.
# Extra arguments are GRPO overrides, e.g. `bash scripts/run.sh trainer.total_steps=100`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
run=runs/default
meshrl=.venv/bin/meshrl
[ -f "$run/model/config.json" ] || $meshrl make-model "$run/model"
[ -f "$run/data/train.parquet" ] || $meshrl make-data "$run/data" --ops + --max-operand 20 --num-train 2000 --num-test 100
rm -rf "$run/sft" "$run/grpo"
$meshrl sft --config configs/arithmetic_sft.yaml actor.model="$run/model" \
    data.train_files="$run/data/train.parquet" trainer.run_dir="$run/sft"
$meshrl grpo --config configs/arithmetic_grpo.yaml actor.model="$run/sft/hf" \
    data.train_files="$run/data/train.parquet" data.val_files="$run/data/test.parquet" \
    trainer.run_dir="$run/grpo" "$@"
.venv/bin/python - "$run/grpo/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
val = [(r["step"], r["val/acc/mean"]) for r in rows if "val/acc/mean" in r]
print("held-out greedy accuracy by step: " + ", ".join(f"{s}: {a:.2f}" for s, a in val))
PY
