#!/usr/bin/env bash
# The main job: an RL run on the bundled arithmetic task, from nothing to a model that got better.
# Sets up .venv (pinned), builds a tiny model, the data and an SFT warm-up locally (scripts/prepare.sh),
# then runs GRPO through the mesh and prints held-out greedy accuracy before and after, with its
# standard error. Results in runs/default/grpo: metrics.jsonl, val.jsonl, samples.jsonl, tensorboard/,
# curves.png, summary.md, traces/, hf/.
#   --seed N   every seed of the run: the model's initialization, the held-out split, SFT and GRPO data
#              order, sampling (default 0; trainer.seed=N among the overrides does the same)
# Other arguments are GRPO overrides, e.g. `bash scripts/run.sh trainer.total_steps=200`.
set -euo pipefail
cd "$(dirname "$0")/.."
seed=0
overrides=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seed) [ $# -ge 2 ] || { echo "--seed needs a number" >&2; exit 2; }; seed="$2"; shift 2 ;;
        --seed=*) seed="${1#--seed=}"; shift ;;
        trainer.seed=*) seed="${1#trainer.seed=}"; shift ;;
        *) overrides+=("$1"); shift ;;
    esac
done
[[ "$seed" =~ ^[0-9]+$ ]] || { echo "--seed must be a whole number >= 0, got '$seed'" >&2; exit 2; }
bash scripts/setup.sh
run=runs/default
rm -rf "$run/sft" "$run/grpo"  # a fresh run each time: meshrl refuses a folder a run trained in (unless it resumes)
SEED="$seed" bash scripts/prepare.sh "$run"
.venv/bin/meshrl grpo --config configs/arithmetic_grpo.yaml actor.model="$run/sft/hf" \
    data.train_files="$run/data/train.parquet" data.val_files="$run/data/test.parquet" \
    trainer.run_dir="$run/grpo" trainer.seed="$seed" ${overrides[@]+"${overrides[@]}"}
.venv/bin/meshrl report "$run/grpo" --held-out
