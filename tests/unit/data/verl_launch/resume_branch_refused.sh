#!/usr/bin/env bash
# GRPO that resumes from a Megatron checkpoint when RESUME_FROM is given: the
# settings that say so are added to an array under that test, so which
# settings the verl command gets is known only when the script runs.
set -xeo pipefail

EXTRA=(trainer.resume_mode=auto)
if [ -n "$RESUME_FROM" ]; then
    EXTRA+=(
        actor_rollout_ref.actor.megatron.dist_checkpointing_path=${RESUME_FROM}
        actor_rollout_ref.actor.megatron.use_dist_checkpointing=True
    )
fi

python3 -m verl.trainer.main_ppo \
    model_engine=megatron \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=128 \
    actor_rollout_ref.rollout.n=8 \
    "${EXTRA[@]}" "$@"
