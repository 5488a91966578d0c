#!/usr/bin/env bash
# Builds what the default run trains from, into RUN_DIR (default runs/default): a tiny model, the
# arithmetic data, and the SFT warm-up (RUN_DIR/sft/hf). What is there is kept if it was built with the
# same seed and recipe (RUN_DIR/recipe: the seed and a hash of this script, the SFT config and the code
# that makes the model and data); otherwise all of it is built again.
# Used by scripts/run.sh and by docker-compose.yml's `prepare` service.
#   MESHRL      the meshrl command (default .venv/bin/meshrl; `meshrl` inside the image)
#   SEED        the model's initialization, which problems are held out, the SFT data order (default 0)
#   SFT_STEPS   SFT steps (default: configs/arithmetic_sft.yaml's)
#   CERTS       if set, a folder for the mesh's TLS certificates, one subfolder per role (`meshrl certs --per-role`), made once
set -euo pipefail
cd "$(dirname "$0")/.."
run="${1:-runs/default}"
meshrl="${MESHRL:-.venv/bin/meshrl}"
seed="${SEED:-0}"
mkdir -p "$run"
recipe="seed $seed sft_steps ${SFT_STEPS:-config} $(cat scripts/prepare.sh configs/arithmetic_sft.yaml meshrl/tiny/*.py | md5sum | cut -c1-12)"
if [ "$(cat "$run/recipe" 2>/dev/null)" != "$recipe" ]; then
    rm -rf "$run/model" "$run/data" "$run/sft"
    echo "$recipe" > "$run/recipe"
fi
if [ -n "${CERTS:-}" ] && [ ! -f "$CERTS/orchestrator/ca.pem" ]; then
    $meshrl certs "$CERTS" --per-role > /dev/null  # a folder per role: each container mounts its own
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
