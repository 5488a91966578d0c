#!/usr/bin/env bash
# DAPO through its recipe entry point. Groups whose answers all score the same
# are thrown away and more prompts are drawn (up to 10 generation batches of
# 1536 prompts) until 384 usable ones are in hand; responses run to 20k tokens,
# and the last 4k before that limit cost a growing penalty. Paths default under
# $HOME and can be moved through the environment.
set -euo pipefail

# -- where things live --------------------------------------------------------
RAY_DATA_HOME=${RAY_DATA_HOME:-"${HOME}/verl"}
MODEL_PATH=${MODEL_PATH:-"${RAY_DATA_HOME}/models/Qwen2.5-14B"}
CKPTS_DIR=${CKPTS_DIR:-"${RAY_DATA_HOME}/checkpoints/dapo_recipe_14b"}
train_parquet="${RAY_DATA_HOME}/data/dapo-math-17k.parquet"
eval_parquet="${RAY_DATA_HOME}/data/aime-2024.parquet"

# -- lengths (tokens) ----------------------------------------------------------
prompt_len=2048
response_len=$((20 * 1024))
soft_penalty_len=$((response_len / 5))
token_budget=$((prompt_len + response_len))

# -- batch: 384 prompts x 16 answers, mini-batches of 24 prompts ---------------
prompts=384
answers=16
mini=$((prompts / 16))
gen_prompts=$((prompts * 4))

python3 -m recipe.dapo.main_dapo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.filter_groups.enable=True \
    algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=10 \
    data.train_files="${train_parquet}" \
    data.val_files="${eval_parquet}" \
    data.prompt_key=prompt \
    data.truncation=left \
    data.max_prompt_length=${prompt_len} \
    data.max_response_length=${response_len} \
    data.train_batch_size=${prompts} \
    data.gen_batch_size=${gen_prompts} \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=${mini} \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=${token_budget} \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=${answers} \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \
    reward_model.reward_manager=dapo \
    reward_model.overlong_buffer.enable=True \
    reward_model.overlong_buffer.len=${soft_penalty_len} \
    reward_model.overlong_buffer.penalty_factor=1.0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name=dapo_recipe \
    trainer.nnodes=4 \
    trainer.n_gpus_per_node=8 \
    trainer.default_local_dir="${CKPTS_DIR}" \
    trainer.total_epochs=1
