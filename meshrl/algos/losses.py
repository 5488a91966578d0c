"""Losses the actor and critic apply: each returns a scalar loss and a dict of metrics (floats).

Inputs are per-token (B, T) tensors over the response with response_mask (B, T),
except DPO, which takes per-sequence log-probs (B,).
"""

import torch
import torch.nn.functional as F

from meshrl.algos.kl import kl_penalty
from meshrl.algos.masked import agg_loss, masked_mean
from meshrl.config.losses import DPO_LOSSES


def kl_loss(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    estimator: str = "k3",
    loss_agg_mode: str = "token-mean",
):
    """KL to the reference as a loss term (GRPO's way, instead of a penalty in the reward)."""
    loss = agg_loss(kl_penalty(logprobs, ref_logprobs, estimator), response_mask, loss_agg_mode)
    return loss, {"actor/kl_loss": loss.item()}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range_value: float = 0.5,
    loss_agg_mode: str = "token-mean",
):
    """Clipped value loss: 0.5 * max((V - R)^2, (clip(V, V_old +- eps) - R)^2)."""
    clipped_values = old_values + (values - old_values).clamp(-clip_range_value, clip_range_value)
    loss1, loss2 = (values - returns).square(), (clipped_values - returns).square()
    loss = 0.5 * agg_loss(torch.maximum(loss1, loss2), response_mask, loss_agg_mode)
    return loss, {
        "critic/vf_loss": loss.item(),
        "critic/vf_clipfrac": masked_mean((loss2 > loss1).float(), response_mask).item(),
    }


def dpo_loss(
    chosen_logprobs: torch.Tensor,
    rejected_logprobs: torch.Tensor,
    ref_chosen_logprobs: torch.Tensor,
    ref_rejected_logprobs: torch.Tensor,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
):
    """DPO (Rafailov et al. 2023, arXiv:2305.18290) and IPO (Azar et al. 2023, arXiv:2310.12036).

    Inputs are sequence log-probs (B,). h = (pi_c - ref_c) - (pi_r - ref_r);
    sigmoid: -log sigmoid(beta h) (with conservative label smoothing); ipo: (h - 1 / (2 beta))^2.
    """
    h = (chosen_logprobs - ref_chosen_logprobs) - (rejected_logprobs - ref_rejected_logprobs)
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * h) * (1 - label_smoothing) - F.logsigmoid(-beta * h) * label_smoothing
    elif loss_type == "ipo":
        losses = (h - 1 / (2 * beta)).square()
    else:
        raise ValueError(f"dpo loss_type must be one of {DPO_LOSSES}, got {loss_type!r}")
    loss = losses.mean()
    chosen_reward = beta * (chosen_logprobs - ref_chosen_logprobs).detach()
    rejected_reward = beta * (rejected_logprobs - ref_rejected_logprobs).detach()
    return loss, {
        "actor/dpo_loss": loss.item(),
        "actor/rewards_chosen": chosen_reward.mean().item(),
        "actor/rewards_rejected": rejected_reward.mean().item(),
        "actor/reward_accuracy": (chosen_reward > rejected_reward).float().mean().item(),
        "actor/reward_margin": (chosen_reward - rejected_reward).mean().item(),
    }


def sft_loss(logprobs: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str = "token-mean"):
    """Masked cross-entropy: the negative log-prob of the target tokens where loss_mask is 1."""
    loss = agg_loss(-logprobs, loss_mask, loss_agg_mode)
    return loss, {"actor/sft_loss": loss.item()}
