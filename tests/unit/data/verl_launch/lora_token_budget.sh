#!/bin/bash
# GRPO with a LoRA adapter and micro-batches sized by a token budget. A site
# file may set extra environment; this script's own settings do not read it.
set -x

unset ROCR_VISIBLE_DEVICES
[ -f ./site.env ] && source ./site.env

lora_rank=32
lora_alpha=$((lora_rank * 2))
max_prompt_length=512
max_response_length=1024
budget=$(((max_prompt_length + max_response_length) * 6))

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=64 \
    data.max_prompt_length=$max_prompt_length \
    data.max_response_length=$max_response_length \
    actor_rollout_ref.model.path=Qwen/Qwen3-4B \
    actor_rollout_ref.model.lora_rank=$lora_rank \
    actor_rollout_ref.model.lora_alpha=$lora_alpha \
    actor_rollout_ref.model.target_modules=all-linear \
    actor_rollout_ref.actor.optim.lr=3e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$budget \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.load_format=safetensors \
    trainer.total_epochs=2 "$@"
