#!/usr/bin/env bash
# PPO with a critic (GAE) on Megatron-LM, from verl's Megatron config; the
# tensor and pipeline sizes follow from the GPU count.
set -xeo pipefail

GPUS=${GPUS:-16}
TP=${TP:-4}
PP=$((GPUS / TP / 2))
ENGINE=megatron
MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}

if [[ $ENGINE == megatron && $PP -gt 1 ]]; then
    VPP=2
else
    VPP=null
fi

MEGATRON=(
    actor_rollout_ref.actor.strategy=$ENGINE
    critic.strategy=$ENGINE
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=$TP
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$PP
    actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=$VPP
    +actor_rollout_ref.actor.megatron.override_transformer_config.recompute_granularity=full
    critic.megatron.tensor_model_parallel_size=$TP
)

python3 -m verl.trainer.main_ppo --config-path=config \
    --config-name='ppo_megatron_trainer.yaml' \
    algorithm.adv_estimator=gae \
    algorithm.gamma=1.0 \
    algorithm.lam=0.95 \
    data.train_batch_size=256 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    critic.model.path="$MODEL" \
    critic.optim.lr=1e-5 \
    "${MEGATRON[@]}" \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=$((GPUS / 8)) "$@"
