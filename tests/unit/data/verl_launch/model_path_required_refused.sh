#!/usr/bin/env bash
# GRPO on a large mixture-of-experts checkpoint with Megatron. There is no
# default checkpoint: give MODEL_PATH, or the variant's own variable.
set -euo pipefail

VARIANT=${VARIANT:-moe_a}
case "${VARIANT}" in
    moe_a) MODEL_PATH=${MODEL_PATH:-${MOE_A_PATH:-}} ;;
    moe_b) MODEL_PATH=${MODEL_PATH:-${MOE_B_PATH:-}} ;;
    *)
        echo "VARIANT is moe_a or moe_b, not ${VARIANT}" >&2
        exit 1
        ;;
esac
: "${MODEL_PATH:?give MODEL_PATH (or MOE_A_PATH / MOE_B_PATH for VARIANT=${VARIANT})}"

NNODES=${NNODES:-4}
PP=${PP:-4}
EP=${EP:-8}
NGPUS=$((NNODES * 8))
if ((NGPUS % (PP * EP) != 0)); then
    echo "PP*EP=$((PP * EP)) does not divide ${NGPUS} GPUs" >&2
    exit 1
fi

python3 -m verl.trainer.main_ppo \
    model_engine=megatron \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=$PP \
    actor_rollout_ref.actor.megatron.expert_model_parallel_size=$EP \
    data.train_batch_size=128 \
    actor_rollout_ref.rollout.n=8 \
    trainer.nnodes=$NNODES "$@"
