"""What each update loss takes: a small typed parameter set per loss name, and which role may use it.

An UpdateRequest names the loss ("ppo", "dpo", "sft", "value") and its
parameters; meshrl.algos holds the math. The service checks names and types
before any rank starts.
"""

import dataclasses
import math

from meshrl.algos.kl import KL_ESTIMATORS
from meshrl.algos.losses import DPO_LOSSES, ROLLOUT_IS
from meshrl.algos.masked import LOSS_AGG_MODES
from meshrl.typed import build

MAX_EPOCHS = 100  # passes over one batch; verl's ppo_epochs is 1-4 in practice, a caller's 2**31 is not work


@dataclasses.dataclass
class Schedule:
    """How an update walks over the batch: epochs of mini-batches, one optimizer step each."""

    epochs: int = 1
    mini_batch_size: int = 0  # rows per optimizer step over all ranks; 0: the whole batch
    shuffle: bool = False
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.epochs <= MAX_EPOCHS or self.mini_batch_size < 0:
            raise ValueError(
                f"epochs must be in 1..{MAX_EPOCHS} and mini_batch_size >= 0, "
                f"got {self.epochs} and {self.mini_batch_size}"
            )
        for f in dataclasses.fields(self):  # a NaN clip ratio or coefficient would train on NaN silently
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{f.name} must be a finite number, got {v}")


OLD_LOGPROBS = ("actor_logprobs", "rollout_logprobs", "")


@dataclasses.dataclass
class PPOParams(Schedule):
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float | None = 3.0  # dual clip; None turns it off
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "k3"
    loss_agg_mode: str = "token-mean"
    temperature: float = 1.0
    rollout_is: str = "none"
    """Correct for the rollout sampling from another policy than the one trained (another engine's
    numerics, older weights): "token" or "sequence" truncated importance weights of the old log-probs
    against the batch's rollout_logprobs scale each token's loss (meshrl.algos.losses.rollout_is_weights)."""
    rollout_is_cap: float = 2.0
    """The weights' upper bound (verl's default threshold)."""
    old_logprobs_key: str = "actor_logprobs"
    """The batch's old log-probs: "actor_logprobs", "rollout_logprobs", or "" for an on-policy update
    (one epoch, one mini-batch): the ratio is taken against the detached log-probs of this very pass,
    which equal the old ones, so no separate log-prob pass is needed (as TRL and verl do then)."""

    def __post_init__(self):
        super().__post_init__()
        _one_of("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _one_of("kl_loss_type", self.kl_loss_type, KL_ESTIMATORS)
        _one_of("old_logprobs_key", self.old_logprobs_key, OLD_LOGPROBS)
        _one_of("rollout_is", self.rollout_is, ROLLOUT_IS)
        if self.rollout_is_cap < 1:  # below 1 it would shrink every update, agreeing tokens' too
            raise ValueError(f"rollout_is_cap must be >= 1, got {self.rollout_is_cap}")
        if self.rollout_is != "none" and self.old_logprobs_key == "rollout_logprobs":
            raise ValueError(
                "rollout_is weighs the old log-probs against rollout_logprobs: they cannot be the "
                "old log-probs themselves (the weights would all be 1)"
            )
        if not self.old_logprobs_key and self.epochs != 1:
            raise ValueError(f"an on-policy update (old_logprobs_key empty) runs one epoch, not {self.epochs}")
        if self.temperature <= 0:
            raise ValueError("temperature must be > 0")


@dataclasses.dataclass
class DPOParams(Schedule):
    beta: float = 0.1
    loss_type: str = "sigmoid"
    label_smoothing: float = 0.0
    temperature: float = 1.0

    def __post_init__(self):
        super().__post_init__()
        _one_of("loss_type", self.loss_type, DPO_LOSSES)


@dataclasses.dataclass
class SFTParams(Schedule):
    loss_agg_mode: str = "token-mean"

    def __post_init__(self):
        super().__post_init__()
        _one_of("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)


@dataclasses.dataclass
class ValueParams(Schedule):
    clip_range_value: float = 0.5
    loss_agg_mode: str = "token-mean"

    def __post_init__(self):
        super().__post_init__()
        _one_of("loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)


PARAMS = {"ppo": PPOParams, "dpo": DPOParams, "sft": SFTParams, "value": ValueParams}
LOSSES_BY_ROLE = {"actor": ("ppo", "dpo", "sft"), "critic": ("value",), "ref": ()}


def parse_loss(role: str, name: str, params: dict):
    allowed = LOSSES_BY_ROLE[role]
    if name not in PARAMS:
        raise ValueError(f"unknown loss {name!r}; known: {sorted(PARAMS)}")
    if name not in allowed:
        raise ValueError(
            f"the {role} role does not train with loss {name!r}"
            + (f"; it takes {list(allowed)}" if allowed else "; it is frozen")
        )
    return build(PARAMS[name], params, f"loss {name}")


def _one_of(key: str, value: str, options) -> None:
    if value not in options:
        raise ValueError(f"{key} must be one of {list(options)}, got {value!r}")
