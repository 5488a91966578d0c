"""verl's defaults for the keys `meshrl config from-verl` maps, so that a verl config converts to the run verl
would make of it: a key the file does not set takes verl's default, not ours (verl samples
actor_rollout_ref.rollout.n=1 response per prompt where nothing says otherwise; ours would sample 4).

Values read from verl's verl/trainer/config/_generated_ppo_trainer.yaml (verl-project/verl 1dda039), the
same as in its config of September 2025 (91ee0a2); verl before about April 2025 had entropy_coeff 0.001 and
no clip_ratio_low/high (clip_ratio alone), so a config written for it may mean those. Only keys that decide
what is trained are carried; where a run is placed, its paths and names, the engines' memory and speed
settings (strategy, tensor_model_parallel_size, gpu_memory_utilization, dtype) and where metrics go
(trainer.logger) stay ours, as they describe a machine rather than the algorithm.
"""

VERL_DEFAULTS: dict[str, object] = {
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.shuffle": True,
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,  # prompts; x rollout.n samples (from_verl)
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,  # with use_dynamic_bsz only
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": -1,  # <= 0: lr_warmup_steps_ratio x total steps
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
    "actor_rollout_ref.actor.optim.min_lr_ratio": 0.0,
    "actor_rollout_ref.actor.grad_clip": 1.0,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,  # what verl's losses use, not clip_ratio (from_verl)
    "actor_rollout_ref.actor.clip_ratio_high": 0.2,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.entropy_coeff": 0,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.kl_ctrl.horizon": 10000,
    "trainer.save_freq": -1,  # never: ours saves no periodic checkpoint (save_every=0)
    "trainer.test_freq": -1,  # never periodically: ours validates before the first step and after the last
    "trainer.resume_mode": "auto",  # from the latest checkpoint if there is one
}
CRITIC_DEFAULTS: dict[str, object] = {  # carried for ppo only: the other commands start no critic
    "critic.optim.lr": 1e-5,
    "critic.cliprange_value": 0.5,
}
