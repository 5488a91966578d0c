#!/usr/bin/env bash
# GRPO on NVIDIA GPUs or Ascend NPUs: the device is found by trying to import
# torch_npu, and the batch and the rollout's parallelism follow from it.
set -euo pipefail

DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' >/dev/null 2>&1 && echo npu || echo gpu)}
MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-0.6B}

case "$DEVICE" in
    npu)
        export HCCL_CONNECT_TIMEOUT=1200
        train_batch_size=32
        rollout_tp=4
        ;;
    gpu)
        train_batch_size=256
        rollout_tp=2
        ;;
    *)
        echo "DEVICE is gpu or npu, not $DEVICE" >&2
        exit 1
        ;;
esac

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_batch_size=$train_batch_size \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path="$MODEL_PATH" \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=$rollout_tp \
    trainer.device=$DEVICE "$@"
