#!/usr/bin/env bash
# GRPO on GSM8K with a policy named by its Hugging Face hub id. Each step
# samples 5 answers to each of 512 prompts and updates on them in mini-batches
# of 128 prompts: 4 optimizer steps a step. Extra Hydra settings may follow
# on the command line.
set -x

gsm8k_dir=$HOME/data/gsm8k

data_args=(
    data.train_files=${gsm8k_dir}/train.parquet
    data.val_files=${gsm8k_dir}/test.parquet
    data.train_batch_size=512
    data.max_prompt_length=512
    data.max_response_length=1024
    data.filter_overlong_prompts=True
    data.truncation=error
)

policy_args=(
    actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct
    actor_rollout_ref.model.use_remove_padding=True
    actor_rollout_ref.model.enable_gradient_checkpointing=True
    actor_rollout_ref.actor.optim.lr=1e-6
    actor_rollout_ref.actor.ppo_mini_batch_size=128
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
    actor_rollout_ref.actor.use_kl_loss=True
    actor_rollout_ref.actor.kl_loss_coef=0.001
    actor_rollout_ref.actor.kl_loss_type=low_var_kl
    actor_rollout_ref.actor.entropy_coeff=0
)

sampling_args=(
    actor_rollout_ref.rollout.name=vllm
    actor_rollout_ref.rollout.n=5
    actor_rollout_ref.rollout.tensor_model_parallel_size=2
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
)

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.use_kl_in_reward=False \
    "${data_args[@]}" \
    "${policy_args[@]}" \
    "${sampling_args[@]}" \
    trainer.logger='["console"]' \
    trainer.project_name=gsm8k_grpo \
    trainer.experiment_name=qwen2.5_7b_instruct_n5 \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.test_freq=10 \
    trainer.save_freq=50 \
    trainer.total_epochs=10 "$@"
