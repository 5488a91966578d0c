#!/usr/bin/env bash
# GRPO, Qwen3-1.7B, FSDP2, on one or more 8-GPU nodes.
# Each knob takes its value from the environment where one is given:
#   MODEL_PATH=/ckpt/qwen ROLLOUT_N=8 bash grpo_array_knobs.sh
set -xeuo pipefail

MODEL_PATH=${MODEL_PATH:-Qwen/Qwen3-1.7B}
INFER_BACKEND=${INFER_BACKEND:-vllm}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}

train_batch_size=${TRAIN_BATCH_SIZE:-512}
mini_batch_size=${MINI_BATCH_SIZE:-64}
max_prompt_length=${MAX_PROMPT_LENGTH:-1024}
max_response_length=${MAX_RESPONSE_LENGTH:-$((1024 * 3))}
rollout_n=${ROLLOUT_N:-5}
lr=${LR:-1e-6}
world_size=$((NNODES * GPUS_PER_NODE))

export VLLM_USE_V1=1

DATA=(
    algorithm.adv_estimator=grpo
    data.train_files="$HOME/data/gsm8k/train.parquet"
    data.val_files="$HOME/data/gsm8k/test.parquet"
    data.train_batch_size=${train_batch_size}
    data.max_prompt_length=${max_prompt_length}
    data.max_response_length=${max_response_length}
    data.truncation='error'
)
ACTOR=(
    actor_rollout_ref.model.path="${MODEL_PATH}"
    actor_rollout_ref.actor.strategy=fsdp2
    actor_rollout_ref.actor.optim.lr=${lr}
    actor_rollout_ref.actor.ppo_mini_batch_size=${mini_batch_size}
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
)
ROLLOUT=(
    actor_rollout_ref.rollout.name=${INFER_BACKEND}
    actor_rollout_ref.rollout.n=${rollout_n}
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6
)
TRAINER=(
    trainer.logger='["console","wandb"]'
    trainer.nnodes=${NNODES}
    trainer.n_gpus_per_node=${GPUS_PER_NODE}
    trainer.total_epochs=${TOTAL_EPOCHS:-10}
)

EXTRA=()
case "${INFER_BACKEND}" in
    vllm) EXTRA+=(actor_rollout_ref.rollout.tensor_model_parallel_size=2) ;;
    sglang) EXTRA+=(+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3) ;;
    *)
        echo "INFER_BACKEND is vllm or sglang, not ${INFER_BACKEND}" >&2
        exit 1
        ;;
esac
if ((world_size > 8)); then
    EXTRA+=(actor_rollout_ref.actor.fsdp_config.fsdp_size=8)
fi
TRAINER+=(trainer.val_before_train=False)

LAUNCH=(python3)
if [ "${USE_UV:-1}" != 0 ]; then
    LAUNCH=(uv run --frozen --extra "${INFER_BACKEND}" python3)
fi
echo "${#EXTRA[@]} extra setting(s) on ${world_size} GPUs"
"${LAUNCH[@]}" -m verl.trainer.main_ppo \
    "${DATA[@]}" "${ACTOR[@]}" "${ROLLOUT[@]}" "${TRAINER[@]}" "${EXTRA[@]}" "$@"
