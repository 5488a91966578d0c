#!/usr/bin/env bash
# ReMax (a greedy rollout as the baseline) with names made by parameter
# expansions: a path's last part, lower case, a suffix cut, an array's length.
set -euo pipefail

readonly MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-4B}
MODEL_NAME=${MODEL_PATH##*/}
declare -a LOGGERS=(console)
LOGGERS+=(wandb)
declare RUN_TAG="remax-${MODEL_NAME,,}"
DATA_FILE=gsm8k/train.parquet
DATA_NAME=${DATA_FILE%%/*}
export RUN_TAG

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=remax \
    data.train_files="$DATA_FILE" \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.rollout.n=4 \
    trainer.logger=[${LOGGERS[0]},${LOGGERS[1]}] \
    trainer.project_name=${DATA_NAME} \
    trainer.experiment_name="${RUN_TAG}-${#LOGGERS[@]}loggers" \
    trainer.total_epochs=5 "$@"
