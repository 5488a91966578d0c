#!/usr/bin/env bash
# RLOO with rollout correction: sequence-level importance weights between the
# rollout engine's and the trainer's log-probs, capped, no rejection sampling.
# One response per prompt: verl's default rollout.n is left as it is.
set -xeuo pipefail

rollout_is="sequence"   # weight whole sequences
rollout_is_threshold=2.0 # cap on a weight
rollout_rs="null"        # no rejection sampling
bypass_mode="true"       # the rollout's log-probs stand in for the old policy's

MODEL_PATH=${MODEL_PATH:-"Qwen/Qwen2.5-7B"}
TRAIN_FILE=${TRAIN_FILE:-"data/train.parquet"}

DATA=(
    algorithm.adv_estimator=rloo
    algorithm.rollout_correction.rollout_is=${rollout_is}
    algorithm.rollout_correction.rollout_is_threshold=${rollout_is_threshold}
    algorithm.rollout_correction.rollout_rs=${rollout_rs}
    algorithm.rollout_correction.bypass_mode=${bypass_mode}
    data.train_files="${TRAIN_FILE}"
    data.train_batch_size=64
    data.max_prompt_length=1024
    data.max_response_length=3072
)
ACTOR=(
    actor_rollout_ref.model.path="${MODEL_PATH}"
    actor_rollout_ref.actor.optim.lr=5e-7
    actor_rollout_ref.actor.ppo_mini_batch_size=16
    actor_rollout_ref.rollout.calculate_log_probs=True
)
EXTRA=()

python3 -m verl.trainer.main_ppo "${DATA[@]}" "${ACTOR[@]}" "${EXTRA[@]}" "$@"

echo "done: RLOO with ${rollout_is}-level weights capped at ${rollout_is_threshold}"
