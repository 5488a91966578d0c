#!/usr/bin/env bash
# DAPO on a 7B math model through the plain PPO trainer: no dynamic sampling
# here, and the overlong buffer goes to the DAPO reward manager as its keyword
# arguments (reward_kwargs) rather than as reward_model.overlong_buffer.
# 512 prompts x 16 answers a step, in mini-batches of 32 prompts.
set -eu

RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-Math-7B"}
CKPTS_DIR=${CKPTS_DIR:-"${RAY_DATA_HOME}/checkpoints/dapo_7b_main_ppo"}

prompt_tokens=$((2 * 1024))
response_tokens=$((8 * 1024))
# the actor packs two full-length sequences into each micro-batch
actor_tokens=$(((prompt_tokens + response_tokens) * 2))

# DAPO's reward manager takes the buffer as keyword arguments: new Hydra keys
overlong=+reward_model.reward_kwargs.overlong_buffer_cfg
reward_args=(
    reward_model.reward_manager=dapo
    "${overlong}.enable=True"
    "${overlong}.len=4096"
    "${overlong}.penalty_factor=1.0"
    "${overlong}.log=False"
    "+reward_model.reward_kwargs.max_resp_len=${response_tokens}"
)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    data.train_files="${RAY_DATA_HOME}/data/dapo-math-17k.parquet" \
    data.val_files="${RAY_DATA_HOME}/data/aime-2024.parquet" \
    data.prompt_key=prompt \
    data.max_prompt_length=${prompt_tokens} \
    data.max_response_length=${response_tokens} \
    data.train_batch_size=512 \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    +actor_rollout_ref.model.override_config.max_position_embeddings=32768 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${actor_tokens} \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=16 \
    "${reward_args[@]}" \
    trainer.logger='["console"]' \
    trainer.nnodes=2 \
    trainer.default_local_dir="${CKPTS_DIR}" \
    trainer.total_training_steps=200
