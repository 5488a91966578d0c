#!/usr/bin/env bash
# Builds what the default run trains from, into RUN_DIR (default runs/default): a tiny model, the
# arithmetic data, and the SFT warm-up (RUN_DIR/sft/hf). Each part is skipped when already there.
# Used by scripts/run.sh and by docker-compose.yml's `prepare` service.
#   MESHRL      the meshrl command (default .venv/bin/meshrl; `meshrl` inside the image)
#   SFT_STEPS   SFT steps (default: configs/arithmetic_sft.yaml's)
set -euo pipefail
cd "$(dirname "$0")/.."
run="${1:-runs/default}"
meshrl="${MESHRL:-.venv/bin/meshrl}"
[ -f "$run/model/config.json" ] || $meshrl make-model "$run/model"
[ -f "$run/data/train.parquet" ] || $meshrl make-data "$run/data" --ops + --max-operand 20 --num-train 2000 --num-test 100
if [ ! -f "$run/sft/hf/config.json" ]; then
    rm -rf "$run/sft"
    $meshrl sft --config configs/arithmetic_sft.yaml actor.model="$run/model" \
        data.train_files="$run/data/train.parquet" trainer.run_dir="$run/sft" \
        ${SFT_STEPS:+trainer.total_steps=$SFT_STEPS}
fi
