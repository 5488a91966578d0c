#!/usr/bin/env bash
# DAPO-style GRPO: groups whose rewards all agree are dropped and sampled again
# (dynamic sampling), a soft penalty starts before the length limit (overlong
# buffer), and the ratio's upper clip is raised.
set -euxo pipefail

: "${TRAIN_PROMPTS:=256}" # `:=` sets it where the environment does not
GEN_PROMPTS=$((TRAIN_PROMPTS * 3 / 2))
max_prompt=$((1024 * 2))
max_response=$((1024 * 4))
overlong=$((max_response / 4))

enable_filter_groups=True
filter_metric=acc
max_gen_batches=10

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    algorithm.filter_groups.enable=${enable_filter_groups} \
    algorithm.filter_groups.metric=${filter_metric} \
    algorithm.filter_groups.max_num_gen_batches=${max_gen_batches} \
    data.train_batch_size=${TRAIN_PROMPTS} \
    data.gen_batch_size=${GEN_PROMPTS} \
    data.max_prompt_length=${max_prompt} \
    data.max_response_length=${max_response} \
    reward_model.reward_manager=dapo \
    reward_model.overlong_buffer.enable=True \
    reward_model.overlong_buffer.len=${overlong} \
    reward_model.overlong_buffer.penalty_factor=1.0 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.rollout.n=16 \
    trainer.total_epochs=1 "$@"
