"""Advantage estimators: token_level_rewards (B, T) and response_mask (B, T) in,
(advantages, returns) out, both (B, T) and zero on padding.

Outcome estimators (GRPO, RLOO, REINFORCE++-baseline) group responses by `index`,
one id per prompt (B,), e.g. the uid column the orchestrator assigns before
sampling n responses per prompt.
"""

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from meshrl.algos.masked import masked_whiten


def _groups(index: Sequence) -> list[list[int]]:
    rows: dict = defaultdict(list)
    for i, key in enumerate(index):
        rows[key].append(i)
    return list(rows.values())


def compute_gae(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
):
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438).

    delta_t = r_t + gamma * V_{t+1} - V_t;  A_t = delta_t + gamma * lam * A_{t+1};  returns = A + V.
    Padding positions are skipped: they neither take nor pass on value.
    """
    B, T = token_level_rewards.shape
    mask = response_mask.to(values.dtype)
    next_value = torch.zeros(B, dtype=values.dtype)
    next_adv = torch.zeros(B, dtype=values.dtype)
    advantages = torch.zeros_like(values)
    for t in reversed(range(T)):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        m = mask[:, t]
        advantages[:, t] = adv * m
        next_adv = adv * m + next_adv * (1 - m)
        next_value = values[:, t] * m + next_value * (1 - m)
    returns = (advantages + values) * mask
    if whiten:
        advantages = masked_whiten(advantages, mask) * mask
    return advantages, returns


def compute_grpo(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence,
    norm_by_std: bool = True,
    eps: float = 1e-6,
):
    """GRPO (Shao et al. 2024, arXiv:2402.03300): (score - group mean) / group std, on every token.

    norm_by_std=False is Dr.GRPO (Liu et al. 2025, arXiv:2503.20783): no division by the std.
    A group of one has mean 0 and std 1 (its score passes through).
    """
    scores = token_level_rewards.sum(-1)
    out = torch.zeros_like(scores)
    for rows in _groups(index):
        s = scores[rows]
        if len(rows) == 1:
            mean, std = torch.zeros(()), torch.ones(())
        else:
            mean, std = s.mean(), s.std()  # unbiased, as torch and verl do
        out[rows] = (s - mean) / (std + eps) if norm_by_std else s - mean
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_rloo(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Sequence):
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): score minus the mean of the other responses to its prompt."""
    scores = token_level_rewards.sum(-1)
    out = torch.zeros_like(scores)
    for rows in _groups(index):
        s = scores[rows]
        n = len(rows)
        out[rows] = s - (s.sum() - s) / (n - 1) if n > 1 else s
    advantages = out.unsqueeze(-1) * response_mask
    return advantages, advantages


def compute_reinforce_plus_plus(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float = 1.0):
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return-to-go per token, whitened over the batch."""
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros(token_level_rewards.shape[0], dtype=token_level_rewards.dtype)
    for t in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, t] + gamma * running
        returns[:, t] = running
        running = running * mask[:, t]  # a padded tail passes nothing back
    returns = returns * mask
    return masked_whiten(returns, mask) * mask, returns


def compute_reinforce_plus_plus_baseline(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Sequence
):
    """REINFORCE++-baseline: score minus its group's mean, on every token, whitened over the batch."""
    scores = token_level_rewards.sum(-1)
    out = scores.clone()
    for rows in _groups(index):
        if len(rows) > 1:
            out[rows] = scores[rows] - scores[rows].mean()
    mask = response_mask.to(scores.dtype)
    tokens = out.unsqueeze(-1) * mask
    return masked_whiten(tokens, mask) * mask, tokens


@dataclasses.dataclass
class AdvantageInputs:
    """What a step hands the estimators; each reads the fields it needs (ADVANTAGE_ESTIMATORS)."""

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    index: Sequence  # one id per row: the rows of a prompt share it
    values: torch.Tensor | None = None  # the critic's (gae)
    gamma: float = 1.0
    lam: float = 1.0
    norm_by_std: bool = True


def _gae(x: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    if x.values is None:
        raise ValueError("gae needs the critic's values")
    return compute_gae(x.token_level_rewards, x.values, x.response_mask, x.gamma, x.lam)


# Which estimator an algorithm uses (algorithm.adv_estimator), each with what it reads from the inputs.
# Each returns (advantages, returns), both (bs, response_length).
ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageInputs], tuple[torch.Tensor, torch.Tensor]]] = {
    "gae": _gae,
    "grpo": lambda x: compute_grpo(x.token_level_rewards, x.response_mask, x.index, x.norm_by_std),
    "rloo": lambda x: compute_rloo(x.token_level_rewards, x.response_mask, x.index),
    "reinforce_plus_plus": lambda x: compute_reinforce_plus_plus(x.token_level_rewards, x.response_mask, x.gamma),
    "reinforce_plus_plus_baseline": lambda x: compute_reinforce_plus_plus_baseline(
        x.token_level_rewards, x.response_mask, x.index
    ),
}
