#!/usr/bin/env bash
# The main job: an RL run on the bundled arithmetic task, from nothing to a model that got better.
# Sets up .venv (pinned), builds a tiny model, the data and an SFT warm-up locally (scripts/prepare.sh),
# then runs GRPO through the mesh and prints held-out greedy accuracy before and after.
# Results in runs/default/grpo: metrics.jsonl, samples.jsonl, tensorboard/, curves.png, summary.md, traces/, hf/.
# Extra arguments are GRPO overrides, e.g. `bash scripts/run.sh trainer.total_steps=200`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
run=runs/default
rm -rf "$run/sft" "$run/grpo"
bash scripts/prepare.sh "$run"
.venv/bin/meshrl grpo --config configs/arithmetic_grpo.yaml actor.model="$run/sft/hf" \
    data.train_files="$run/data/train.parquet" data.val_files="$run/data/test.parquet" \
    trainer.run_dir="$run/grpo" "$@"
.venv/bin/python - "$run/grpo/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
val = [(r["step"], r["val/acc/mean"]) for r in rows if "val/acc/mean" in r]
print("held-out greedy accuracy by step: " + ", ".join(f"{s}: {a:.2f}" for s, a in val))
print(f"SFT checkpoint {val[0][1]:.2f} -> after GRPO {val[-1][1]:.2f} ({100 * (val[-1][1] - val[0][1]):+.0f} points)")
PY
