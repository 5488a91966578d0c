"""KL between the policy and the reference: per-token estimators, the penalty in the reward,
and the controllers that set its coefficient.

Estimators (J. Schulman, "Approximating KL divergence", 2020), with
log r = ref_logprobs - logprobs for tokens sampled from the policy:
  k1 = -log r                 unbiased, high variance, can be negative
  k2 = (log r)^2 / 2          biased, low variance ("mse" in verl)
  k3 = (r - 1) - log r        unbiased, low variance, >= 0 ("low_var_kl"; clamped to [-10, 10] as verl does)
"""

import dataclasses
from collections.abc import Callable

import torch

from meshrl.config.losses import KL_CONTROLLERS, KL_ESTIMATORS


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    neg = -log_ratio  # log r
    return (neg.exp() - neg - 1).clamp(-10.0, 10.0)


KL_ESTIMATOR_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {  # of log(pi / ref) per token; the
    # names are meshrl/config/losses.py KL_ESTIMATORS
    "k1": lambda log_ratio: log_ratio,
    "abs": lambda log_ratio: log_ratio.abs(),
    "k2": lambda log_ratio: 0.5 * log_ratio.square(),
    "k3": _k3,
}
assert set(KL_ESTIMATOR_FNS) == set(KL_ESTIMATORS)


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL estimate, (B, T) from two (B, T) log-prob tensors."""
    if estimator not in KL_ESTIMATOR_FNS:
        raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    return KL_ESTIMATOR_FNS[estimator](logprobs - ref_logprobs)


def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    beta: float,
    estimator: str = "k1",
):
    """token_level_rewards = scores - beta * KL per token (InstructGPT); returns (rewards, mean KL per sequence).

    The mean KL (over sequences of the per-sequence token mean) is what the adaptive controller tracks.
    """
    kld = kl_penalty(logprobs, ref_logprobs, estimator) * response_mask
    rewards = token_level_scores - beta * kld
    seq_kl = kld.sum(-1) / response_mask.sum(-1).clamp(min=1)
    return rewards, seq_kl.mean()


@dataclasses.dataclass
class FixedKLController:
    value: float

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


@dataclasses.dataclass
class AdaptiveKLController:
    """Ziegler et al. 2019 (arXiv:1909.08593), section 2.2: move beta towards a target KL.

    error = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + error * n_steps / horizon.
    """

    value: float
    target: float
    horizon: float

    def update(self, current_kl: float, n_steps: int) -> None:
        error = max(-0.2, min(0.2, current_kl / self.target - 1))
        self.value *= 1 + error * n_steps / self.horizon


KLController = FixedKLController | AdaptiveKLController


def kl_controller(name: str, coef: float, target: float, horizon: float) -> KLController:
    """algorithm.kl_ctrl's controller, one of KL_CONTROLLERS, starting at coef."""
    made: dict[str, Callable[[], KLController]] = {
        "fixed": lambda: FixedKLController(coef),
        "adaptive": lambda: AdaptiveKLController(coef, target, horizon),
    }
    assert made.keys() == set(KL_CONTROLLERS)
    if name not in made:
        raise ValueError(f"algorithm.kl_ctrl must be one of {KL_CONTROLLERS}, got {name!r}")
    return made[name]()
