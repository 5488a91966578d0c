"""verl's rollout tensors from token lists: what the rollout service, chunked sampling and multi-turn
episodes all hand the trainer."""

import torch

VERSIONS = "rollout_versions"  # (rows, T): the weight version that produced each response token


def prompt_tensors(prompts: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    """input_ids (left padded), attention_mask and position_ids of token-id prompts: what Generate reads."""
    width = max(map(len, prompts))
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.int64)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], dtype=torch.int64)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)}


def rollout_tensors(
    prompts: list[list[int]],
    responses: list[list[int]],
    pad: int,
    response_masks: list[list[int]] | None = None,
    logprobs: list[list[float]] | None = None,
    versions: list[list[int]] | None = None,
) -> dict[str, torch.Tensor]:
    """prompts (left padded), responses (right padded, at least one column), input_ids, attention_mask
    (1 on every real token), position_ids, response_mask (1 on each response token unless given per
    token, e.g. 0 on a multi-turn observation) and, when given, rollout_logprobs and rollout_versions (0 past
    each response)."""
    T = max(1, max(map(len, responses)))
    left = prompt_tensors(prompts, pad)
    prompt_ids, prompt_mask = left["input_ids"], left["attention_mask"]
    response_ids = torch.tensor([r + [pad] * (T - len(r)) for r in responses], dtype=torch.int64)
    present = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in responses], dtype=torch.int64)
    attention_mask = torch.cat([prompt_mask, present], 1)
    masks = response_masks if response_masks is not None else [[1] * len(r) for r in responses]
    out = {
        "prompts": prompt_ids,
        "responses": response_ids,
        "input_ids": torch.cat([prompt_ids, response_ids], 1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0),
        "response_mask": torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float32),
    }
    if logprobs is not None:
        out["rollout_logprobs"] = torch.tensor([lp + [0.0] * (T - len(lp)) for lp in logprobs], dtype=torch.float32)
    if versions is not None:
        out[VERSIONS] = torch.tensor([v + [0] * (T - len(v)) for v in versions], dtype=torch.int64)
    return out
