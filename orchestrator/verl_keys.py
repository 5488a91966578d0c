"""verl's and OpenRLHF's config keys and the meshrl keys that do the same, for the hint their users get
when one of theirs meets our config (`actor_rollout_ref.actor.optim.lr=...` -> `actor.lr`,
`remote_rm_url=...` -> `reward.url`).

Only keys with the same meaning are listed; a key missing here has no single equivalent. OpenRLHF's are
listed by both its names: the flat flags of its releases before 2026 (`--input_key`) and the dotted ones
after (`--data.input_key`, openrlhf/cli/train_ppo_ray.py); a flat one put under a section, as a dotted
override (`reward.remote_rm_url`), is read as that flag. A whole verl file (a YAML or a launch script) is
told apart here too, and pointed to `meshrl config from-verl`.
"""

import re

VERL_KEYS = {
    "actor_rollout_ref.model.path": "actor.model",
    "algorithm.rollout_correction.rollout_is": "algorithm.rollout_is (token, sequence; null: none)",
    "algorithm.rollout_correction.rollout_is_threshold": "algorithm.rollout_is_cap (lower_upper: rollout_is_mode=mask)",
    "algorithm.rollout_correction.rollout_rs": "algorithm.rollout_rs",
    "algorithm.rollout_correction.rollout_rs_threshold": "algorithm.rollout_rs_threshold",
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
    "actor_rollout_ref.actor.shuffle": "actor.shuffle",
    "actor_rollout_ref.actor.clip_ratio": "actor.clip_ratio_low (and clip_ratio_high)",
    "actor_rollout_ref.actor.clip_ratio_low": "actor.clip_ratio_low",
    "actor_rollout_ref.actor.clip_ratio_high": "actor.clip_ratio_high",
    "actor_rollout_ref.actor.clip_ratio_c": "actor.clip_ratio_c",
    "actor_rollout_ref.actor.policy_loss.loss_mode": "actor.policy_loss (geo_mean is gmpo; vanilla is ppo)",
    "actor_rollout_ref.actor.tau_pos": "actor.tau_pos",
    "actor_rollout_ref.actor.tau_neg": "actor.tau_neg",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": "actor.clip_cov_ratio",
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": "actor.clip_cov_lb",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": "actor.clip_cov_ub",
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": "actor.kl_cov_ratio",
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": "actor.ppo_kl_coef",
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
    "data.image_key": "data.image_key",
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
OPENRLHF_KEYS = {
    "remote_rm_url": "reward.url",
    "reward.remote_url": "reward.url",
    "reward_pretrain": "reward.model",
    "reward.model_name_or_path": "reward.model",
    "pretrain": "actor.model",
    "actor.model_name_or_path": "actor.model",
    "critic_pretrain": "critic.model",
    "critic.model_name_or_path": "critic.model",
    "prompt_data": "data.train_files",
    "data.prompt_dataset": "data.train_files",
    "eval_dataset": "data.val_files",
    "eval.dataset": "data.val_files",
    "input_key": "data.prompt_key",
    "data.input_key": "data.prompt_key",
    "label_key": "data.answer_key",
    "data.label_key": "data.answer_key",
    "apply_chat_template": "always on",
    "data.apply_chat_template": "always on",
    "prompt_max_len": "data.max_prompt_length",
    "generate_max_len": "rollout.max_new_tokens",
    "max_len": "rollout.max_model_len",
    "data.max_len": "rollout.max_model_len",
    "n_samples_per_prompt": "rollout.n",
    "rollout.n_samples_per_prompt": "rollout.n",
    "rollout_batch_size": "data.train_batch_size",
    "rollout.batch_size": "data.train_batch_size",
    "train_batch_size": "actor.mini_batch_size",
    "train.batch_size": "actor.mini_batch_size",
    "micro_train_batch_size": "actor.micro_batch_size",
    "train.micro_batch_size": "actor.micro_batch_size",
    "max_epochs": "actor.ppo_epochs",
    "train.max_epochs": "actor.ppo_epochs",
    "actor_learning_rate": "actor.lr",
    "actor.adam.lr": "actor.lr",
    "critic_learning_rate": "critic.lr",
    "critic.adam.lr": "critic.lr",
    "max_norm": "actor.grad_clip",
    "actor.max_norm": "actor.grad_clip",
    "eps_clip": "actor.clip_ratio_low (and clip_ratio_high)",
    "actor.eps_clip": "actor.clip_ratio_low (and clip_ratio_high)",
    "value_clip": "critic.clip_range_value",
    "critic.value_clip": "critic.clip_range_value",
    "entropy_loss_coef": "actor.entropy_coeff",
    "actor.entropy_coef": "actor.entropy_coeff",
    "policy_loss_type": "actor.policy_loss",
    "actor.policy_loss_type": "actor.policy_loss",
    "init_kl_coef": "algorithm.kl_coef (with use_kl_loss: actor.kl_loss_coef)",
    "algo.kl.init_coef": "algorithm.kl_coef (with algo.kl.use_loss: actor.kl_loss_coef)",
    "use_kl_loss": "actor.use_kl_loss",
    "algo.kl.use_loss": "actor.use_kl_loss",
    "kl_target": "algorithm.kl_target",
    "algo.kl.target": "algorithm.kl_target",
    "kl_horizon": "algorithm.kl_horizon",
    "algo.kl.horizon": "algorithm.kl_horizon",
    "gamma": "algorithm.gamma",
    "algo.advantage.gamma": "algorithm.gamma",
    "lambd": "algorithm.lam",
    "algo.advantage.lambd": "algorithm.lam",
    "dynamic_filtering": "algorithm.dynamic_sampling",
    "algo.dynamic_filtering_enable": "algorithm.dynamic_sampling",
    "overlong_buffer_len": "algorithm.overlong_buffer",
    "reward.overlong_buffer_len": "algorithm.overlong_buffer",
    "overlong_penalty_factor": "algorithm.overlong_penalty",
    "reward.overlong_penalty_factor": "algorithm.overlong_penalty",
    "temperature": "rollout.temperature",
    "top_p": "rollout.top_p",
    "seed": "trainer.seed",
    "train.seed": "trainer.seed",
    "save_steps": "trainer.save_every",
    "ckpt.save_steps": "trainer.save_every",
    "eval_steps": "trainer.val_every",
    "eval.steps": "trainer.val_every",
    "ckpt_path": "trainer.run_dir",
    "ckpt.path": "trainer.run_dir",
    "vllm_num_engines": "rollout.replicas",
    "vllm.num_engines": "rollout.replicas",
    "vllm_tensor_parallel_size": "rollout.tensor_parallel_size",
    "vllm.tensor_parallel_size": "rollout.tensor_parallel_size",
    "vllm_gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "vllm.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    "enforce_eager": "rollout.enforce_eager",
    "vllm.enforce_eager": "rollout.enforce_eager",
    "gradient_checkpointing": "actor.gradient_checkpointing",
    "actor.gradient_checkpointing_enable": "actor.gradient_checkpointing",
    "packing_samples": "actor.padding_free",
    "ds.packing_samples": "actor.padding_free",
    "lora_rank": "actor.lora_rank",
    "ds.lora.rank": "actor.lora_rank",
    "lora_alpha": "actor.lora_alpha",
    "ds.lora.alpha": "actor.lora_alpha",
    "lora_dropout": "actor.lora_dropout",
    "ds.lora.dropout": "actor.lora_dropout",
    "target_modules": "actor.lora_target_modules",
    "ds.lora.target_modules": "actor.lora_target_modules",
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
    """' (verl's KEY is OURS here)' for a verl key with an equivalent, likewise for OpenRLHF's (its flags'
    names, with or without their dashes, or put under a section: openrlhf_flag); '' otherwise."""
    ours = VERL_KEYS.get(key)
    if ours is None and key.split(".")[0] in VERL_SECTIONS:
        return " (a verl key: `meshrl grpo --help` lists ours)"
    if ours:
        return f" (verl's {key} is {ours} here)"
    flag = openrlhf_flag(key)
    return f" (OpenRLHF's {flag} is {OPENRLHF_KEYS[flag]} here)" if flag else ""


def openrlhf_flag(key: str) -> str:
    """The OpenRLHF flag a key names ('' for none): as typed (`--remote_rm_url`, `reward.remote_url`), or a
    flat flag put under a section, as its users type a dotted override: `reward.remote_rm_url` is
    remote_rm_url, `critic.pretrain` is critic_pretrain. A flag whose equivalent has its name (OpenRLHF's
    temperature is rollout.temperature) is one of our keys in a section, the right one or not, which the
    closest-key hint names (`actor.temperature`: did you mean rollout.temperature?)."""
    flag = key.lstrip("-")
    if flag in OPENRLHF_KEYS:
        return flag
    section, _, name = flag.partition(".")
    if not name or "." in name:
        return ""
    for candidate in (f"{section}_{name}", name):
        ours = OPENRLHF_KEYS.get(candidate)
        if ours is not None and ours.split()[0].rpartition(".")[2] != candidate:
            return candidate
    return ""


def hints(raw: dict, prefix: str = "") -> str:
    """The hints for every verl or OpenRLHF key in a nested mapping (a verl YAML read as it is)."""
    out = []
    for k, v in raw.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.append(hints(v, key + "."))
        elif key in VERL_KEYS or openrlhf_flag(key):
            out.append(hint(key))
    return "".join(out)
