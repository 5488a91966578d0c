"""Rollout correction: the policy being trained (its old log-probs) is not the one that sampled (the
rollout's log-probs: another engine's numerics, older weights), and the loss corrects for it by weights
(importance sampling) and by leaving tokens out (rejection). The names and thresholds are verl's (its
rollout_corr_helper, after "When Speed Kills Stability", Liu, Li et al. 2025, and arXiv:2512.23075).

Weights, w from log r = old - rollout per token (no gradient):
  token: w_t = r_t; sequence: prod_t r_t for each token of a response; geometric: exp(mean_t log r_t)
  truncate (TIS, Yao et al. 2025): min(w, cap); mask (IcePop / MIS): w where floor <= w <= cap, else 0.
Rejection (rollout_rs, comma-separated options, each with its threshold): per token, k1 = -log r,
k2 = 0.5 (log r)^2, k3 = r - 1 - log r. token_k1 keeps a token whose k1 is in [log lower, log upper],
token_k2 / token_k3 one whose kN <= upper; seq_sum_kN / seq_mean_kN / seq_max_kN keep a whole response
whose sum / mean / max of kN is so bounded, else none of it. A k1 threshold is "lower_upper" or one
upper u (lower 1/u). As in verl's code, k1's bounds apply to -log r, i.e. to the ratio rollout / old:
symmetric bounds (u and 1/u, as verl's presets) read the same either way.
"""

import math

import torch

from meshrl.algos.masked import masked_mean, rows_mean
from meshrl.config.losses import ROLLOUT_IS, ROLLOUT_IS_MODES, rs_thresholds

MAX_LOG = 20.0  # exp() must not overflow; every bound is far inside e^20


def kl_to_actor(rollout_logprobs: torch.Tensor, actor_logprobs: torch.Tensor, response_mask: torch.Tensor) -> float:
    """rollout/kl_to_actor: the mean |rollout - actor| log-prob over response tokens, how far the sampling
    engine is from the policy (~1e-7 in fp32 when the weight push worked)."""
    return masked_mean((rollout_logprobs - actor_logprobs).abs(), response_mask).item()


def rollout_is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str,
    cap: float,
    *,
    mode: str = "truncate",
    floor: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, T) weights for each token's loss and metrics: their mean, and the share of tokens (or responses)
    that the cap cut (truncate) or that fell outside [floor, cap] (mask)."""
    if level not in ROLLOUT_IS or level == "none":
        raise ValueError(f"rollout_is must be one of {ROLLOUT_IS[1:]} here, got {level!r}")
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"rollout_is_mode must be one of {ROLLOUT_IS_MODES}, got {mode!r}")
    log_w = (old_logprobs - rollout_logprobs).detach() * response_mask
    if level == "sequence":
        log_w = log_w.sum(-1, keepdim=True).expand_as(log_w)
    elif level == "geometric":
        log_w = (log_w.sum(-1, keepdim=True) / response_mask.sum(-1, keepdim=True).clamp(min=1)).expand_as(log_w)
    raw = log_w.clamp(-MAX_LOG, MAX_LOG).exp()
    if mode == "truncate":
        weights, out = raw.clamp(max=cap), raw > cap
    else:
        out = (raw > cap) | (raw < floor)
        weights = torch.where(out, torch.zeros_like(raw), raw)
    out = out.float()
    # token: the share of tokens; sequence, geometric: of responses (one weight each)
    share = (masked_mean(out, response_mask) if level == "token" else rows_mean(out[:, 0], response_mask)).item()
    return weights, {
        "actor/rollout_is_mean": masked_mean(weights, response_mask).item(),
        f"actor/rollout_is_{'capped' if mode == 'truncate' else 'masked'}_frac": share,
    }


def rollout_rejection_mask(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    options: str,
    thresholds: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, T) 1 where a token stays in the loss, 0 where rejection took it out (and on padding), and metrics:
    the share of valid tokens and of responses rejected."""
    valid = response_mask > 0
    log_r = (old_logprobs - rollout_logprobs).detach().clamp(-MAX_LOG, MAX_LOG)
    k = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": log_r.exp() - 1 - log_r}
    keep = valid.clone()
    for option, (lower, upper) in rs_thresholds(options, thresholds).items():
        scope, kind = option.rsplit("_", 1)
        stat = k[kind]
        if scope == "token":
            ok = (stat >= math.log(lower)) & (stat <= math.log(upper)) if kind == "k1" else stat <= upper
            keep &= ok | ~valid
            continue
        if scope == "seq_max":
            seq = stat.masked_fill(~valid, float("-inf")).amax(-1).clamp(min=0)
        else:
            seq = (stat * response_mask).sum(-1)
            if scope == "seq_mean":
                seq = seq / response_mask.sum(-1).clamp(min=1)
        ok = (seq >= math.log(lower)) & (seq <= math.log(upper)) if kind == "k1" else seq <= upper
        keep &= ok.unsqueeze(-1)
    rejected = (valid & ~keep).float()
    return keep.float(), {
        "actor/rollout_rs_masked_frac": masked_mean(rejected, response_mask).item(),
        "actor/rollout_rs_seq_masked_frac": rows_mean(rejected.amax(-1), response_mask).item(),
    }
