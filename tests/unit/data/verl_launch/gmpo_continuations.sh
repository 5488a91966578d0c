#!/bin/bash
# GMPO (geometric-mean policy optimization), its settings spread over
# continued lines: outside quotes, inside double quotes, inside an array and
# inside arithmetic.
set -x

run_name="gmpo_\
qwen3_1.7b"
prompt_length=$((256 \
    * 3))

CLIP=(
    actor_rollout_ref.actor.clip_ratio_low=0.4 \
    actor_rollout_ref.actor.clip_ratio_high=0.4
)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.policy_loss.loss_mode=geo_mean \
    actor_rollout_ref.actor.loss_agg_mode="seq-mean-\
token-mean" \
    "${CLIP[@]}" \
    data.train_batch_size=192 \
    data.max_prompt_length=$prompt_length \
    data.max_response_length=$((prompt_length * 3)) \
    actor_rollout_ref.model.path=Qwen/Qwen3-1.7B \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=48 \
    actor_rollout_ref.rollout.n=6 \
    trainer.balance_batch=no \
    trainer.experiment_name="$run_name" \
    trainer.total_epochs=2 $@
