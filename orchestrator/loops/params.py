"""The loss parameters an update sends the actor or critic (meshrl/config/losses.py defines each set), taken
from the run config: the policy loss's and rollout correction's keys are the same classes in the config,
so only the keys named differently in a run (the DPO knobs under algorithm.*) and the values the run
decides are written here."""

from meshrl.config.checked import values_of
from meshrl.config.losses import EpochSettings, PolicyLossSettings, RolloutISSettings, ValueLossSettings
from orchestrator.config import Config


def schedule(cfg: Config) -> dict:
    """How every update walks over its batch: actor.ppo_epochs passes of actor.mini_batch_size rows, in
    the order actor.shuffle says (seeded by the run's seed)."""
    return {**values_of(EpochSettings, cfg.actor), "seed": cfg.trainer.seed}


def ppo_params(cfg: Config, reuse: bool = False) -> dict:
    """reuse: the update finds its own old log-probs (policy_gradient.own_old_logprobs)."""
    return {
        **schedule(cfg),
        **values_of(PolicyLossSettings, cfg.actor),
        **values_of(RolloutISSettings, cfg.algorithm),
        "temperature": cfg.rollout.temperature,
        "old_logprobs_key": "" if reuse else "actor_logprobs",
    }


def value_params(cfg: Config) -> dict:
    return {**schedule(cfg), **values_of(ValueLossSettings, cfg.critic), "loss_agg_mode": cfg.actor.loss_agg_mode}


def dpo_params(cfg: Config) -> dict:
    return {**schedule(cfg), **cfg.algorithm.dpo_params(), "temperature": cfg.rollout.temperature}


def sft_params(cfg: Config) -> dict:
    return {"loss_agg_mode": cfg.actor.loss_agg_mode}
