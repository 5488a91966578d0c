#!/bin/bash
# CISPO (clipped importance-sampling weights, no clipped tokens) on FSDP, one
# node. Offloading depends on the strategy and the GPU, both with defaults.
set -euo pipefail

STRATEGY=${STRATEGY:-fsdp}
GPU_MODEL=${GPU_MODEL:-h100}
if [[ $STRATEGY =~ ^fsdp2?$ && $GPU_MODEL != "a100" ]]; then
    offload=False
    micro=8
else
    offload=True
    micro=2
fi

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.strategy=$STRATEGY \
    actor_rollout_ref.actor.policy_loss.loss_mode=cispo \
    actor_rollout_ref.actor.clip_ratio_low=10 \
    actor_rollout_ref.actor.clip_ratio_high=0.2 \
    actor_rollout_ref.actor.fsdp_config.param_offload=$offload \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=$micro \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.path=Qwen/Qwen3-8B \
    actor_rollout_ref.rollout.n=5 \
    data.train_batch_size=512 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    trainer.n_gpus_per_node=8 "$@"
