"""verl's config keys and the meshrl keys that do the same, for the hint a verl user gets when a verl key
meets our config (`actor_rollout_ref.actor.optim.lr=...` -> `actor.lr`).

Only keys with the same meaning are listed; a verl key missing here has no single equivalent. A whole
verl file (a YAML or a launch script) is told apart here too, and pointed to `meshrl config from-verl`.
"""

import re

VERL_KEYS = {
    "actor_rollout_ref.model.path": "actor.model",
    "algorithm.filter_groups.enable": "algorithm.dynamic_sampling",
    "algorithm.filter_groups.metric": "algorithm.dynamic_sampling_metric (acc or score: verl's seq_reward)",
    "algorithm.filter_groups.max_num_gen_batches": "algorithm.max_sample_rounds",
    "reward_model.overlong_buffer.penalty_factor": "algorithm.overlong_penalty",
    "actor_rollout_ref.model.use_remove_padding": "actor.padding_free",
    "actor_rollout_ref.actor.optim.lr": "actor.lr",
    "actor_rollout_ref.actor.optim.weight_decay": "actor.weight_decay",
    "actor_rollout_ref.actor.optim.lr_warmup_steps": "actor.warmup_steps",
    "actor_rollout_ref.actor.optim.warmup_style": "actor.lr_schedule",
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "actor.lr_schedule",
    "actor_rollout_ref.actor.optim.min_lr_ratio": "actor.min_lr_ratio",
    "actor_rollout_ref.actor.grad_clip": "actor.grad_clip",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "actor.mini_batch_size (in rows: verl's x rollout.n)",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "actor.micro_batch_size",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "actor.micro_batch_tokens",
    "actor_rollout_ref.actor.ppo_epochs": "actor.ppo_epochs",
    "actor_rollout_ref.actor.clip_ratio": "actor.clip_ratio_low (and clip_ratio_high)",
    "actor_rollout_ref.actor.clip_ratio_low": "actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high": "actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c": "actor.clip_ratio_c",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "actor.policy_loss (ppo or gspo)",
    "actor_rollout_ref.actor.entropy_coeff": "actor.entropy_coeff",
    "actor_rollout_ref.actor.use_kl_loss": "actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef": "actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type": "actor.kl_loss_type",
    "actor_rollout_ref.actor.loss_agg_mode": "actor.loss_agg_mode",
    "actor_rollout_ref.model.enable_gradient_checkpointing": "actor.gradient_checkpointing",
    "actor_rollout_ref.actor.strategy": "actor.engine",
    "actor_rollout_ref.rollout.name": "rollout.backend",
    "actor_rollout_ref.rollout.n": "rollout.n",
    "actor_rollout_ref.rollout.temperature": "rollout.temperature",
    "actor_rollout_ref.rollout.top_p": "rollout.top_p",
    "actor_rollout_ref.rollout.top_k": "rollout.top_k",
    "actor_rollout_ref.rollout.response_length": "rollout.max_new_tokens",
    "actor_rollout_ref.rollout.max_model_len": "rollout.max_model_len",
    "actor_rollout_ref.rollout.dtype": "rollout.dtype",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": "rollout.tensor_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.enforce_eager": "rollout.enforce_eager",
    "actor_rollout_ref.rollout.multi_turn.enable": "rollout.multi_turn",
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": "rollout.max_turns",
    "data.max_response_length": "rollout.max_new_tokens",
    "data.train_batch_size": "data.train_batch_size",
    "data.val_batch_size": "data.val_batch_size",
    "data.prompt_key": "data.prompt_key",
    "critic.model.path": "critic.model",
    "critic.optim.lr": "critic.lr",
    "critic.cliprange_value": "critic.clip_range_value",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std",
    "algorithm.kl_ctrl.type": "algorithm.kl_ctrl",
    "algorithm.kl_ctrl.kl_coef": "algorithm.kl_coef",
    "algorithm.kl_ctrl.target_kl": "algorithm.kl_target",
    "algorithm.kl_ctrl.horizon": "algorithm.kl_horizon",
    "custom_reward_function.path": "reward.function (path/to/file.py:name)",
    "custom_reward_function.name": "reward.function (path/to/file.py:name)",
    "reward_model.reward_manager": "reward.batched (verl's batch manager: true)",
    "trainer.total_training_steps": "trainer.total_steps",
    "trainer.save_freq": "trainer.save_every",
    "trainer.test_freq": "trainer.val_every",
    "trainer.default_local_dir": "trainer.run_dir",
    "trainer.resume_mode": "trainer.resume",
}
VERL_SECTIONS = ("actor_rollout_ref", "custom_reward_function", "reward_model")
ENTRY_POINTS = ("verl.trainer.main_ppo", "recipe.dapo.main_dapo")  # main_dapo: main_ppo's config + DAPO's
VERL_FILE = re.compile(  # a verl YAML's own sections, or a launch script's command (outside a comment)
    rf"^(?:({'|'.join(VERL_SECTIONS)})\s*:|[^#\n]*\b({'|'.join(map(re.escape, ENTRY_POINTS))})\b)", re.M
)


def convert_first(path: str, text: str) -> str:
    """The line for a verl config or launch script given where ours is expected; '' for anything else."""
    m = VERL_FILE.search(text)
    if not m:
        return ""
    what = "a verl launch script" if m.group(2) else "a verl config"
    return f"{path} is {what}, not ours: convert it with `meshrl config from-verl {path} --out meshrl.yaml`"


def hint(key: str) -> str:
    """' (verl's KEY is ours OURS)' for a verl key with an equivalent; '' otherwise."""
    ours = VERL_KEYS.get(key)
    if ours is None and key.split(".")[0] in VERL_SECTIONS:
        return " (a verl key: `meshrl grpo --help` lists ours)"
    return f" (verl's {key} is {ours} here)" if ours else ""


def hints(raw: dict, prefix: str = "") -> str:
    """The hints for every verl key in a nested mapping (a verl YAML read as it is)."""
    out = []
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.append(hints(v, key + "."))
        elif key in VERL_KEYS:
            out.append(hint(key))
    return "".join(out)
