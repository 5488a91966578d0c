#!/usr/bin/env bash
# REINFORCE++ on a math set. It first writes its reward function and a note
# beside the run with here-documents, then launches verl.
set -eu

WORK=${WORK:-./reinforce_pp}
mkdir -p "$WORK"

cat > "$WORK/reward.py" << EOF
# written by $(basename "$0") for ${WORK}
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip().endswith(str(ground_truth)))
EOF

cat > "$WORK/README.txt" <<-'NOTE'
	Not a command of this script: python3 -m verl.trainer.main_ppo data.train_batch_size=1
	$NOT_EXPANDED stays as written, the delimiter being quoted.
	NOTE

IFS=, read -r -a GPU_IDS <<< "0,1,2,3"
export CUDA_VISIBLE_DEVICES=0,1,2,3

n=8
python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=reinforce_plus_plus \
    custom_reward_function.path="$WORK/reward.py" \
    custom_reward_function.name=compute_score \
    data.train_batch_size=512 \
    data.max_prompt_length=1024 \
    data.max_response_length=2048 \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-Math-1.5B \
    actor_rollout_ref.actor.optim.lr=3e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.rollout.n=$n \
    trainer.n_gpus_per_node=4 \
    trainer.total_epochs=3 "$@"
