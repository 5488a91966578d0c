"""Reward shaping on the scores before advantages: DAPO's soft overlong penalty (Yu et al. 2025,
arXiv:2503.14476, "overlong reward shaping").

A response that runs into the length limit is usually cut off, not finished; scoring it as any other
teaches the policy from noise. DAPO lets the last `buffer` tokens before the limit cost a growing
penalty instead: nothing up to max_len - buffer tokens, then linearly down to -factor at max_len.
"""

import torch


def overlong_penalty(response_mask: torch.Tensor, max_len: int, buffer: int, factor: float = 1.0) -> torch.Tensor:
    """(B,) penalties, each <= 0, of responses of response_mask.sum(-1) tokens against a limit of max_len:
    min(0, (max_len - buffer - length) / buffer) * factor."""
    if not 0 < buffer <= max_len:
        raise ValueError(f"the overlong buffer must be in 1..{max_len} (the response limit), got {buffer}")
    lengths = response_mask.sum(-1).float()
    return ((max_len - buffer - lengths) / buffer).clamp(max=0.0) * factor
