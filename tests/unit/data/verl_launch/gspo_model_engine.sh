#!/usr/bin/env bash
# GSPO (sequence-level importance ratios) on a mixture-of-experts model with
# verl's model engine on Megatron, over NODES nodes.
set -xeuo pipefail

adv_estimator=grpo
loss_mode=gspo
clip_low=3e-4 # GSPO clips the sequence ratio in a much narrower band
clip_high=4e-4

prompts=96
samples=12
updates=4
mini=$((prompts / updates))
NODES=${NODES:-2}

# wait for every node (a loop: what it does is not read)
for node in $(seq 1 "$NODES"); do
    echo "node $node of $NODES"
done
tries=0
while ((tries < 3)); do
    tries=$((tries + 1))
done

python3 -m verl.trainer.main_ppo \
    model_engine=megatron \
    algorithm.adv_estimator=${adv_estimator} \
    actor_rollout_ref.actor.policy_loss.loss_mode=${loss_mode} \
    actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean \
    actor_rollout_ref.actor.clip_ratio_low=${clip_low} \
    actor_rollout_ref.actor.clip_ratio_high=${clip_high} \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=8 \
    actor_rollout_ref.model.path=Qwen/Qwen3-30B-A3B \
    actor_rollout_ref.actor.optim.lr=5e-7 \
    actor_rollout_ref.actor.ppo_mini_batch_size=${mini} \
    actor_rollout_ref.rollout.n=${samples} \
    data.train_batch_size=${prompts} \
    data.max_prompt_length=$((512 * 3)) \
    data.max_response_length=$((1024 * 6)) \
    trainer.nnodes=${NODES} "$@"
