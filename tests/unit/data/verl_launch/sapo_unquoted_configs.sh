#!/bin/bash
# SAPO (soft-gated policy optimization) on a math set, one node of 8 GPUs.
# Each group of settings is one string, expanded unquoted on the verl command
# line so that the shell splits it into words; the strings are put together by
# an if on the backend this script picks.
set -x

export TOKENIZERS_PARALLELISM=false
DATA_ROOT=${DATA_ROOT:-$PWD}

prepend_pythonpath() {
    case ":${PYTHONPATH}:" in
        *":$1:"*) ;;
        *) export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" ;;
    esac
}
prepend_pythonpath "$DATA_ROOT/src"

backend=fsdp # fsdp | megatron
adv_estimator=grpo
loss_mode=sapo
tau_pos=1.0  # the soft gate's temperature for positive advantages
tau_neg=1.05 # and for negative ones

train_batch_size=128
updates_per_batch=4
ppo_mini_batch_size=$((train_batch_size / updates_per_batch))
n_resp_per_prompt=8
max_prompt_length=$((1024 * 2))
max_response_length=$((1024 * 6))
overlong_len=$((max_response_length / 3))
token_budget=$(((max_prompt_length + max_response_length) * 2))
actor_lr=2e-6

ACTOR_CONFIG="
    actor_rollout_ref.model.path=Qwen/Qwen3-4B-Base \
    actor_rollout_ref.actor.optim.lr=$actor_lr \
    actor_rollout_ref.actor.policy_loss.loss_mode=${loss_mode}
    actor_rollout_ref.actor.tau_pos=$tau_pos actor_rollout_ref.actor.tau_neg=$tau_neg \
    actor_rollout_ref.actor.ppo_mini_batch_size=$ppo_mini_batch_size \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$token_budget"

FSDP_CONFIG="
    actor_rollout_ref.actor.fsdp_config.strategy=$backend \
    actor_rollout_ref.actor.fsdp_config.param_offload=False"
MEGATRON_CONFIG="
    actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1"
REF_FSDP_CONFIG="${FSDP_CONFIG//actor_rollout_ref.actor/actor_rollout_ref.ref}"

if [[ $backend == "megatron" ]]; then
    ACTOR_CONFIG="$ACTOR_CONFIG $MEGATRON_CONFIG"
else
    ACTOR_CONFIG="$ACTOR_CONFIG $FSDP_CONFIG $REF_FSDP_CONFIG"
fi

ROLLOUT_CONFIG="
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=$n_resp_per_prompt \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2"

REWARD_CONFIG="
    reward.reward_manager.name=dapo \
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward.reward_kwargs.overlong_buffer_cfg.len=$overlong_len \
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0"

eval "$(conda shell.bash hook)"
conda activate verl

srun --nodes=1 --ntasks=1 \
    python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=$adv_estimator \
    data.train_files=$DATA_ROOT/math/train.parquet \
    data.train_batch_size=$train_batch_size \
    data.max_prompt_length=$max_prompt_length \
    data.max_response_length=$max_response_length \
    trainer.logger=['console','wandb'] \
    trainer.nnodes=${SLURM_JOB_NUM_NODES} \
    trainer.n_gpus_per_node=8 \
    $ACTOR_CONFIG \
    $ROLLOUT_CONFIG \
    $REWARD_CONFIG
