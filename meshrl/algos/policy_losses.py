"""The policy-gradient losses, one function each, and POLICY_LOSS_FNS: the name a run gives
(meshrl/config/losses.py POLICY_LOSSES: its paper, defaults and aggregation) -> its function. Adding a loss
is one function, one entry here and one there.

Inputs are per-token (B, T) tensors over the response: the log-probs being trained, the old (sampling)
ones, the advantages and response_mask. `weights` (rollout_is_weights) scale each token's loss. Each returns
a scalar loss and a dict of metrics (floats). Each function takes its paper's settings as keyword-only
arguments named as the run's settings (PolicyLossSettings), with the paper's values as defaults, rather
than one settings object: so each can be called and unit-tested alone, and read beside verl's
(verl/trainer/ppo/core_algos.py). policy_loss passes each the settings its signature names; a name that is
no setting fails at import."""

import dataclasses
import inspect
from collections.abc import Callable

import torch

from meshrl.algos.masked import agg_loss, masked_mean, rows_mean
from meshrl.config.losses import POLICY_LOSSES, SEQ_MEAN, PolicyLossSettings

MAX_LOG_RATIO = 20.0  # exp() must not overflow; every clip or gate is far inside e^20


def log_ratios(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def aggregate(losses, response_mask, mode: str, weights, metrics: dict) -> tuple[torch.Tensor, dict[str, float]]:
    """Each token's loss times its rollout-correction weight (if any), reduced by `mode`; with pg_loss."""
    loss = agg_loss(losses if weights is None else losses * weights, response_mask, mode)
    return loss, {"actor/pg_loss": loss.item(), **metrics}


def ppo_policy_loss(  # noqa: PLR0913 - the loss's tensors and its paper's coefficients, each named as verl names them
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = 3.0,
    loss_agg_mode: str = "token-mean",
    weights: torch.Tensor | None = None,
):
    """Clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with separate low/high clip (DAPO,
    arXiv:2503.14476) and dual clip for negative advantages (Ye et al. 2020, arXiv:1912.09729).

    ratio = exp(logprobs - old_logprobs); loss_t = max(-A r, -A clip(r, 1-low, 1+high)), and for
    A < 0 at most -A * clip_ratio_c (None turns dual clip off). `weights` (rollout_is_weights) scale
    each token's loss.
    """
    log_ratio = (logprobs - old_logprobs).clamp(-20.0, 20.0)  # exp() must not overflow
    ratio = log_ratio.exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    metrics = {
        "actor/pg_clipfrac": masked_mean((loss2 > loss1).float(), response_mask).item(),
        "actor/ppo_kl": masked_mean(-log_ratio, response_mask).item(),
    }
    if clip_ratio_c is not None:
        if clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 for dual clip, got {clip_ratio_c}")
        loss3 = -advantages * clip_ratio_c
        dual = torch.minimum(clipped, loss3)
        metrics["actor/pg_clipfrac_lower"] = masked_mean(
            ((clipped > loss3) & (advantages < 0)).float(), response_mask
        ).item()
        clipped = torch.where(advantages < 0, dual, clipped)
    return aggregate(clipped, response_mask, loss_agg_mode, weights, metrics)


def gspo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 3e-4,
    clip_ratio_high: float = 4e-4,
    weights: torch.Tensor | None = None,
):
    """GSPO (Zheng et al. 2025, arXiv:2507.18071): PPO's clipped surrogate on one ratio per sequence, the
    geometric mean of its tokens' ratios, s_i = exp(mean_t (logprobs - old_logprobs)), so a sequence is
    clipped (and stops teaching) as a whole; the loss is the mean over sequences of each one's token mean
    (seq-mean-token-mean, the paper's objective).

    In the token form (the paper's GSPO-token, with every token's advantage its sequence's) each token
    carries s_i,t = sg(s_i) * exp(logprobs_t - sg(logprobs_t)): the value is s_i, and the gradient of the
    token mean is s_i times the mean of the tokens' log-prob gradients, which is the sequence objective's.
    No dual clip: a ratio per sequence is already the paper's variance control. `weights`
    (rollout_is_weights) scale each token's loss.
    """
    lengths = response_mask.sum(-1).clamp(min=1)
    seq_log_ratio = ((logprobs - old_logprobs) * response_mask).sum(-1) / lengths
    seq_log_ratio = seq_log_ratio.detach().clamp(-20.0, 20.0)  # exp() must not overflow
    ratio = (logprobs - logprobs.detach() + seq_log_ratio.unsqueeze(-1)).exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    seq_clipped = ((loss2 > loss1).float() * response_mask).amax(-1)  # the whole sequence or none of it
    metrics = {  # a sequence with no response token is not counted
        "actor/pg_clipfrac": rows_mean(seq_clipped, response_mask).item(),
        "actor/ppo_kl": masked_mean(-(logprobs - old_logprobs), response_mask).item(),
        "actor/seq_ratio_mean": rows_mean(seq_log_ratio.exp(), response_mask).item(),
    }
    return aggregate(clipped, response_mask, SEQ_MEAN, weights, metrics)


def cispo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 1.0,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: str = "token-mean",
    weights: torch.Tensor | None = None,
):
    """CISPO (MiniMax-M1, arXiv:2506.13585): loss_t = -sg(clip(r_t, 1 - low, 1 + high)) * A_t * logprobs_t.

    The clipped ratio is a weight without gradient, so every token keeps its log-prob gradient (PPO's clip
    drops a token's gradient once its ratio leaves the range: the rare tokens that open a reasoning step
    were the ones lost). At r = 1 the gradient is the policy gradient, as PPO's."""
    ratio = log_ratios(logprobs, old_logprobs).exp()
    weight = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    losses = -weight * advantages * logprobs
    return aggregate(
        losses,
        response_mask,
        loss_agg_mode,
        weights,
        {
            "actor/pg_clipfrac": masked_mean((weight != ratio.detach()).float(), response_mask).item(),
            "actor/ppo_kl": masked_mean(-(logprobs - old_logprobs), response_mask).item(),
        },
    )


def gmpo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.4,
    clip_ratio_high: float = 0.4,
    weights: torch.Tensor | None = None,
):
    """GMPO (arXiv:2507.20673): per sequence, the geometric mean of its tokens' ratios times its advantage
    (the token mean of the advantages), each token's log-ratio clipped to [-low, high] on the side its
    advantage's sign makes pessimistic (PPO's min, in log space); the loss is the mean over sequences.
    The geometric mean is what makes it robust: one outlier token moves a sequence's ratio by its share.
    `weights` count per sequence by their geometric mean, as the ratios do."""
    log_ratio = logprobs - old_logprobs
    sign = torch.sign(advantages)
    clamped = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = response_mask.sum(-1).clamp(min=1)
    seq_log_ratio = ((pessimistic * response_mask).sum(-1) / lengths).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    seq_advantage = (advantages * response_mask).sum(-1) / lengths
    per_seq = -seq_advantage * seq_log_ratio.exp()
    if weights is not None:
        per_seq = per_seq * ((weights.clamp(min=1e-10).log() * response_mask).sum(-1) / lengths).exp()
    loss = rows_mean(per_seq, response_mask)
    took = (sign * clamped < sign * log_ratio).float()  # the clip changed this token's term
    return loss, {
        "actor/pg_loss": loss.item(),
        "actor/pg_clipfrac": masked_mean(took * (advantages > 0), response_mask).item(),
        "actor/pg_clipfrac_lower": masked_mean(took * (advantages < 0), response_mask).item(),
        "actor/ppo_kl": masked_mean(-log_ratio, response_mask).item(),
    }


def sapo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    weights: torch.Tensor | None = None,
):
    """SAPO (arXiv:2511.20347): loss_t = -f(r_t) * A_t with the soft gate f(r) = 4 / tau * sigmoid(tau (r - 1))
    (tau_pos where A_t > 0, tau_neg otherwise), aggregated seq-mean-token-mean as the paper's objective.
    f'(r) = 4 s (1 - s) with s = sigmoid(tau (r - 1)): 1 at r = 1 (the policy gradient), falling smoothly as
    the ratio leaves 1 where PPO's clip would cut to 0 at once. Metric pg_gate_mean: that gradient factor's
    token mean (1: on-policy; smaller: damped)."""
    ratio = log_ratios(logprobs, old_logprobs).exp()
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    s = torch.sigmoid(tau * (ratio - 1))
    losses = -(4 / tau) * s * advantages
    return aggregate(
        losses,
        response_mask,
        SEQ_MEAN,
        weights,
        {
            "actor/pg_gate_mean": masked_mean((4 * s * (1 - s)).detach(), response_mask).item(),
            "actor/ppo_kl": masked_mean(-(logprobs - old_logprobs), response_mask).item(),
        },
    )


def covariances(logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each token's term of Cov(log pi, A) over the valid tokens: (A - mean A) (log pi - mean log pi), no
    gradient (arXiv:2505.22617: the few tokens where it is large drive the entropy's collapse)."""
    lp = logprobs.detach()
    return (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))


def clip_cov_policy_loss(  # noqa: PLR0913 - the loss's tensors and its paper's coefficients, each named as verl names them
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    loss_agg_mode: str = "token-mean",
    weights: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
):
    """Clip-Cov (arXiv:2505.22617): PPO's clipped surrogate (no dual clip), and of the tokens PPO did not clip
    whose covariance term is in (clip_cov_lb, clip_cov_ub), max(1, clip_cov_ratio x tokens) chosen at random
    (by `generator`, so a resumed run picks the same) lose their gradient. Metric clip_cov_frac: their share."""
    ratio = log_ratios(logprobs, old_logprobs).exp()
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    valid = response_mask > 0
    clipped = (loss2 > loss1) & valid
    cov = covariances(logprobs, advantages, response_mask)
    candidates = torch.nonzero((cov > clip_cov_lb) & (cov < clip_cov_ub) & valid & ~clipped)
    count = max(int(clip_cov_ratio * int(valid.sum())), 1)
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:count]]
    keep = torch.ones_like(loss1)
    keep[chosen[:, 0], chosen[:, 1]] = 0
    losses = torch.maximum(loss1, loss2) * keep
    return aggregate(
        losses,
        response_mask,
        loss_agg_mode,
        weights,
        {
            "actor/pg_clipfrac": masked_mean(clipped.float(), response_mask).item(),
            "actor/clip_cov_frac": masked_mean(1 - keep, response_mask).item(),
            "actor/ppo_kl": masked_mean(-(logprobs - old_logprobs), response_mask).item(),
        },
    )


def kl_cov_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 0.1,
    loss_agg_mode: str = "token-mean",
    weights: torch.Tensor | None = None,
):
    """KL-Cov (arXiv:2505.22617): the unclipped surrogate -A_t r_t, plus ppo_kl_coef * |log r_t| on the
    max(1, kl_cov_ratio x tokens) tokens with the largest covariance terms. Metric kl_cov_frac: their share."""
    log_ratio = log_ratios(logprobs, old_logprobs)
    losses = -advantages * log_ratio.exp()
    valid = response_mask > 0
    penalised = torch.zeros_like(losses)
    if valid.any():
        cov = covariances(logprobs, advantages, response_mask)[valid]
        count = max(int(kl_cov_ratio * len(cov)), 1)
        where = torch.nonzero(valid)[torch.topk(cov, count).indices]
        penalised[where[:, 0], where[:, 1]] = 1
    losses = losses + ppo_kl_coef * log_ratio.abs() * penalised
    return aggregate(
        losses,
        response_mask,
        loss_agg_mode,
        weights,
        {
            "actor/kl_cov_frac": masked_mean(penalised, response_mask).item(),
            "actor/ppo_kl": masked_mean(-(logprobs - old_logprobs), response_mask).item(),
        },
    )


PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
POLICY_LOSS_FNS: dict[str, PolicyLossFn] = {
    "ppo": ppo_policy_loss,
    "gspo": gspo_policy_loss,
    "cispo": cispo_policy_loss,
    "gmpo": gmpo_policy_loss,
    "sapo": sapo_policy_loss,
    "clip_cov": clip_cov_policy_loss,
    "kl_cov": kl_cov_policy_loss,
}
assert POLICY_LOSS_FNS.keys() == POLICY_LOSSES.keys(), "a policy loss without its math or its settings"
PER_CALL = ("weights", "generator")  # what each call brings; every other keyword is a run setting


def reads(fn: PolicyLossFn) -> tuple[str, ...]:
    """The settings a loss takes by keyword: each must be a PolicyLossSettings field of the same name, so a
    renamed parameter fails here at import, never silently at its default."""
    params = list(inspect.signature(fn).parameters.values())
    assert all(p.kind is p.KEYWORD_ONLY for p in params[4:]), f"{fn.__name__}: settings after the tensors go by keyword"
    return tuple(p.name for p in params[4:] if p.name not in PER_CALL)


SETTINGS = {f.name for f in dataclasses.fields(PolicyLossSettings)}
READS = {name: reads(fn) for name, fn in POLICY_LOSS_FNS.items()}
SEEDED = {name for name, fn in POLICY_LOSS_FNS.items() if "generator" in inspect.signature(fn).parameters}
for _name, _keys in READS.items():
    assert set(_keys) <= SETTINGS, f"{_name} takes {set(_keys) - SETTINGS}, which no run can set"


def policy_loss(p, logprobs, old_logprobs, advantages, response_mask, *, weights=None, generator=None):
    """The loss p.policy_loss names, with p's (resolved) settings."""
    fn, settings = POLICY_LOSS_FNS[p.policy_loss], {k: getattr(p, k) for k in READS[p.policy_loss]}
    if p.policy_loss in SEEDED:  # clip_cov's random picks
        settings["generator"] = generator
    return fn(logprobs, old_logprobs, advantages, response_mask, weights=weights, **settings)
