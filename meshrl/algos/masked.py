"""Reductions over the valid tokens of padded (B, T) tensors, and loss aggregation."""

import torch

from meshrl.config.losses import LOSS_AGG_MODES


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    return (x * mask).sum() if dim is None else (x * mask).sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean of x where mask is 1; 0 where there is nothing to average."""
    total = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / total.clamp(min=1)


def rows_mean(per_row: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """The mean of one value per sequence over the sequences with a response token; 0 where none has."""
    rows = (response_mask.sum(-1) > 0).float()
    return (per_row * rows).sum() / rows.sum().clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    n = mask.sum()
    if unbiased and n > 1:
        var = var * n / (n - 1)  # Bessel's correction
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the valid tokens of the whole batch."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + eps)
    return out if shift_mean else out + mean


PER_SEQUENCE = {  # the loss of each sequence, (B,), for the seq-mean modes; the names are LOSS_AGG_MODES
    "seq-mean-token-sum": lambda loss, mask, horizon: masked_sum(loss, mask, -1),
    "seq-mean-token-mean": lambda loss, mask, horizon: masked_mean(loss, mask, -1),
    "seq-mean-token-sum-norm": lambda loss, mask, horizon: masked_sum(loss, mask, -1) / horizon,
}
assert {"token-mean", *PER_SEQUENCE} == set(LOSS_AGG_MODES)


def agg_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str, horizon: int | None = None) -> torch.Tensor:
    """Reduce a (B, T) per-token loss to a scalar.

    token-mean: every valid token weighs the same (DAPO).
    seq-mean-token-sum: sum per sequence, mean over sequences.
    seq-mean-token-mean: mean per sequence, mean over sequences (original GRPO).
    seq-mean-token-sum-norm: sum per sequence / horizon (default T), mean over sequences (Dr.GRPO).
    """
    if mode == "token-mean":
        return masked_mean(loss, mask)
    if mode not in PER_SEQUENCE:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {mode!r}")
    has_tokens = (mask.sum(-1) > 0).float()
    per_seq = PER_SEQUENCE[mode](loss, mask, horizon or loss.shape[-1])
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1)


def token_level(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(N, T) zeros with each score on its row's last response token; rows with no tokens stay zero."""
    mask = response_mask.bool()
    lengths = mask.sum(1)
    out = torch.zeros(mask.shape, dtype=torch.float32)
    if mask.shape[1] == 0:  # no response tokens anywhere: nothing to place
        return out
    rows = torch.nonzero(lengths > 0).flatten()
    last = mask.shape[1] - 1 - mask.flip(1).int().argmax(1)  # index of the last 1 in each row
    out[rows, last[rows]] = scores[rows]
    return out
