"""What each update loss takes: a small typed parameter set per loss name ("ppo", "dpo", "sft", "value").

An UpdateRequest names the loss and carries these parameters; the actor service builds them back
(services/actor/losses.py) and meshrl.algos holds the math. PolicyLossSettings and RolloutISSettings are
also parts of the run config (`actor.*` and `algorithm.*`), so the run sends exactly what it was told.
"""

import dataclasses

from meshrl.config.checked import Checked, one_of, require

KL_ESTIMATORS = ("k1", "k2", "k3", "abs")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
ROLLOUT_IS = ("none", "token", "sequence")
DPO_LOSSES = ("sigmoid", "ipo")
OLD_LOGPROBS = ("actor_logprobs", "rollout_logprobs", "")
POLICY_LOSSES = ("ppo", "gspo")
MAX_EPOCHS = 100  # passes over one batch; verl's ppo_epochs is 1-4 in practice, a caller's 2**31 is not work


@dataclasses.dataclass
class Schedule(Checked):
    """How an update walks over the batch: epochs of mini-batches, one optimizer step each."""

    epochs: int = 1
    mini_batch_size: int = 0  # rows per optimizer step over all ranks; 0: the whole batch
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        require(1 <= self.epochs <= MAX_EPOCHS, self, "epochs", f"must be in 1..{MAX_EPOCHS}")
        require(self.mini_batch_size >= 0, self, "mini_batch_size", "must be >= 0")


@dataclasses.dataclass
class PolicyLossSettings(Checked):
    policy_loss: str = "ppo"
    """The policy-gradient loss: "ppo" (a clipped ratio per token) or "gspo" (GSPO, arXiv:2507.18071: one
    ratio per sequence, the geometric mean of its tokens', clipped as a whole; wants tiny clip ranges,
    the paper's 3e-4 / 4e-4, loss_agg_mode=seq-mean-token-mean, and no dual clip)."""
    clip_ratio_low: float = 0.2
    """PPO clip: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """PPO clip: ratio <= 1 + clip_ratio_high (DAPO's clip-higher when larger)."""
    clip_ratio_c: float | None = 3.0
    """Dual-clip bound for negative advantages; null turns it off."""
    entropy_coeff: float = 0.0
    """Entropy bonus in the policy loss."""
    use_kl_loss: bool = False
    """KL(actor || ref) as a loss term (GRPO's); needs the ref's log-probs."""
    kl_loss_coef: float = 0.001
    """Its weight."""
    kl_loss_type: str = "k3"
    """Its estimator: k1, k2, k3 (low-variance) or abs."""
    loss_agg_mode: str = "token-mean"
    """token-mean, seq-mean-token-sum, seq-mean-token-mean or seq-mean-token-sum-norm."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "loss_agg_mode", LOSS_AGG_MODES)
        one_of(self, "kl_loss_type", KL_ESTIMATORS)
        one_of(self, "policy_loss", POLICY_LOSSES)
        if self.policy_loss == "gspo":  # the paper's objective, said rather than silently changed
            require(
                self.loss_agg_mode == "seq-mean-token-mean",
                self,
                "loss_agg_mode",
                "must be seq-mean-token-mean with policy_loss=gspo (each sequence's token mean, then their mean)",
            )


@dataclasses.dataclass
class RolloutISSettings(Checked):
    rollout_is: str = "none"
    """Correct the loss for the rollout sampling from another policy than the one trained (another
    engine's numerics, older weights): "token" or "sequence" truncated importance weights of the old
    log-probs against the batch's rollout_logprobs scale each token's loss; "none": off."""
    rollout_is_cap: float = 2.0
    """The weights' upper bound (verl's default threshold); below 1 it would shrink every update."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "rollout_is", ROLLOUT_IS)
        require(self.rollout_is_cap >= 1, self, "rollout_is_cap", "must be >= 1")


@dataclasses.dataclass
class PPOParams(Schedule, PolicyLossSettings, RolloutISSettings):
    temperature: float = 1.0
    """The rollout's sampling temperature, which the log-probs use too."""
    old_logprobs_key: str = "actor_logprobs"
    """The batch's old log-probs: "actor_logprobs", "rollout_logprobs", or "" when the update finds them
    itself: the first mini-batch of the first epoch takes the detached log-probs of its own pass (the
    weights are still the old ones then, as TRL and verl do with one mini-batch), and the other rows get
    theirs from a pass without gradients before the first optimizer step (every row with epochs > 1).
    The caller then needs no log-prob pass of its own."""

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "old_logprobs_key", OLD_LOGPROBS)
        require(
            self.rollout_is == "none" or self.old_logprobs_key != "rollout_logprobs",
            self,
            "old_logprobs_key",
            "cannot be the log-probs rollout_is weighs the old ones against (the weights would all be 1)",
        )
        require(self.temperature > 0, self, "temperature", "must be > 0")


@dataclasses.dataclass
class DPOParams(Schedule):
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    temperature: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "loss_type", DPO_LOSSES)


@dataclasses.dataclass
class SFTParams(Schedule):
    loss_agg_mode: str = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "loss_agg_mode", LOSS_AGG_MODES)


@dataclasses.dataclass
class ValueParams(Schedule):
    clip_range_value: float = 0.5
    loss_agg_mode: str = "token-mean"

    def __post_init__(self) -> None:
        super().__post_init__()
        one_of(self, "loss_agg_mode", LOSS_AGG_MODES)


PARAMS = {"ppo": PPOParams, "dpo": DPOParams, "sft": SFTParams, "value": ValueParams}
