#!/usr/bin/env bash
# Builds what the default run trains from, into RUN_DIR (default runs/default): a tiny model, the
# arithmetic data, and the SFT warm-up (RUN_DIR/sft/hf). Each part is skipped when already there and
# built with the same seed (RUN_DIR/seed records it).
# Used by scripts/run.sh and by docker-compose.yml's `prepare` service.
#   MESHRL      the meshrl command (default .venv/bin/meshrl; `meshrl` inside the image)
#   SEED        the model's initialization, which problems are held out, the SFT data order (default 0)
#   SFT_STEPS   SFT steps (default: configs/arithmetic_sft.yaml's)
set -euo pipefail
cd "$(dirname "$0")/.."
run="${1:-runs/default}"
meshrl="${MESHRL:-.venv/bin/meshrl}"
seed="${SEED:-0}"
mkdir -p "$run"
if [ "$(cat "$run/seed" 2>/dev/null)" != "$seed" ]; then
    rm -rf "$run/model" "$run/data" "$run/sft"
    echo "$seed" > "$run/seed"
fi
[ -f "$run/model/config.json" ] || $meshrl make-model "$run/model" --seed "$seed"
# the default task (make-data's defaults): sums of 0..49, 2,000 to train on, 500 held out
[ -f "$run/data/train.parquet" ] || $meshrl make-data "$run/data" --seed "$seed"
if [ ! -f "$run/sft/hf/config.json" ]; then
    rm -rf "$run/sft"
    $meshrl sft --config configs/arithmetic_sft.yaml actor.model="$run/model" \
        data.train_files="$run/data/train.parquet" trainer.run_dir="$run/sft" trainer.seed="$seed" \
        ${SFT_STEPS:+trainer.total_steps=$SFT_STEPS}
fi
