#!/bin/bash
# RLOO (leave-one-out baseline) on GSM8K; small helper functions work out the
# batch shape and collect settings into an array.
set -e

n_gpus=8
samples=4
total_prompts=256

# per_update PROMPTS UPDATES: the prompts in one mini-batch, into mini_batch
per_update() {
    local prompts=$1 updates=$2
    local size=$((prompts / updates))
    mini_batch=$size
}

# fits_on GPUS: whether a mini-batch's rows split evenly over the GPUs
function fits_on {
    local gpus=$1
    ((mini_batch * samples % gpus == 0))
}

add() { # add KEY VALUE: one more setting for the verl command
    SETTINGS+=("$1=$2")
}

SETTINGS=()
per_update "$total_prompts" 8
if fits_on "$n_gpus"; then
    add actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu $((mini_batch * samples / n_gpus))
else
    add actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu 1
fi
add actor_rollout_ref.rollout.n "$samples"
add algorithm.adv_estimator rloo

python3 -m verl.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.train_batch_size=$total_prompts \
    data.max_prompt_length=512 \
    data.max_response_length=$((512 * 3)) \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=$mini_batch \
    "${SETTINGS[@]}" \
    trainer.experiment_name=rloo_${size:-no_size} \
    trainer.total_epochs=5 "$@"
